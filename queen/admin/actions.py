"""What an operator does to messages and dead letters: retry dead letters (one message's, or a
queue's filter), move a message to a group's DLQ by hand, clear a queue or a partition.

Every call is one SQL function in one transaction (``admin.sql``). A retry appends copies to
partitions, so it is a write to those partitions: it holds their actors for the statement
(:meth:`queen.push.PushService.write_held`), as a transaction with pushes does, and raises
:class:`queen.push.PartitionsBusy` (nothing applied) while one of them cannot be written (the
database away, maintenance, a spooled backlog waiting). A bulk retry works through the dead
letters that existed when it started, ``RETRY_CHUNK`` at a time (each chunk holding only its
own partitions), so dead letters that arrive meanwhile (a retried message failing again) are
left for the next call.

Each action is logged (``queen.admin.actions``, INFO) with who asked (the token's ``sub``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from queen.admin import params
from queen.admin.figures import need_store
from queen.consume import requests
from queen.consume.errors import InvalidRequest, NotFound
from queen.model import PartitionKey
from queen.push import PushService
from queen.records import QUEUE_MODE
from queen.storage.admin import DeadLetterTarget, PgAdminStore, RetriedCopy

log = logging.getLogger("queen.admin.actions")

RETRY_CHUNK = 500
MAX_ERROR_MESSAGE = 10_000

# --- requests ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryFilter:
    """Which dead letters a bulk retry takes: a queue's, narrowed by group, partition and
    failure time (inclusive)."""

    queue: str
    consumer_group: str | None = None
    partition: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class DeadLetterRequest:
    """Moving a message to a group's DLQ by hand (queue mode when no group is named)."""

    consumer_group: str
    error_message: str | None


def _object(body: Any, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if body is None:
        return {}
    if type(body) is not dict:
        raise InvalidRequest("the body must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return body


def _body_name(body: Mapping[str, Any], key: str) -> str | None:
    """An optional name in a body: absent or null is none; an empty string is refused (it
    would widen the action to everything)."""
    if body.get(key) == "":
        raise InvalidRequest(f"{key} must not be empty (leave it out for all)")
    return requests.name(body.get(key), key, required=False)


def _body_moment(body: Mapping[str, Any], key: str) -> datetime | None:
    value = body.get(key)
    if value is not None and type(value) is not str:
        raise InvalidRequest(f"{key} must be an ISO-8601 string")
    return params.moment(body, key)


def retry_filter(body: Any) -> RetryFilter:
    """The body of ``POST /api/v1/dlq/retry``: ``queue`` (required), ``consumerGroup``,
    ``partition``, ``from`` and ``to`` (failure times, inclusive)."""
    fields = _object(body, ("queue", "consumerGroup", "partition", "from", "to"))
    queue = requests.name(fields.get("queue"), "queue")
    assert queue is not None
    since, until = _body_moment(fields, "from"), _body_moment(fields, "to")
    if since is not None and until is not None and since > until:
        raise InvalidRequest("from must not be after to")
    return RetryFilter(
        queue=queue,
        consumer_group=_body_name(fields, "consumerGroup"),
        partition=_body_name(fields, "partition"),
        since=since,
        until=until,
    )


def dead_letter_request(body: Any) -> DeadLetterRequest:
    """The optional body of ``POST /api/v1/messages/{p}/{tx}/dlq``: ``consumerGroup`` (queue
    mode when absent) and ``errorMessage``."""
    fields = _object(body, ("consumerGroup", "errorMessage"))
    error = fields.get("errorMessage")
    if error is not None and type(error) is not str:
        raise InvalidRequest("errorMessage must be a string")
    if error is not None and len(error) > MAX_ERROR_MESSAGE:
        raise InvalidRequest(f"errorMessage must be at most {MAX_ERROR_MESSAGE} characters")
    if error is not None:
        requests.text(error, "errorMessage")
    return DeadLetterRequest(_body_name(fields, "consumerGroup") or QUEUE_MODE, error or None)


# --- outcomes ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageRetry:
    """Retrying one message's dead letters: ``copies`` (where each was delivered again) is
    empty when none was left (retried already, or never dead-lettered)."""

    partition_id: int
    transaction_id: str
    copies: list[RetriedCopy]

    @property
    def retried(self) -> bool:
        return bool(self.copies)


@dataclass(frozen=True, slots=True)
class BulkRetry:
    scope: RetryFilter
    retried: int


DeadLetterOutcome = Literal["moved", "already", "consumed", "leased", "no_group", "missing"]
OUTCOMES: tuple[DeadLetterOutcome, ...] = get_args(DeadLetterOutcome)


@dataclass(frozen=True, slots=True)
class MessageDeadLettered:
    partition_id: int
    transaction_id: str
    request: DeadLetterRequest
    outcome: DeadLetterOutcome


@dataclass(frozen=True, slots=True)
class QueueCleared:
    """Clearing a queue (or a partition): ``cleared`` messages removed, ``kept`` left because
    they share a write with a message inside a live lease."""

    queue: str
    partition: str | None
    cleared: int
    kept: int


def _who(by: str | None) -> str:
    return by if by else "anonymous"


class AdminActions:
    def __init__(self, store: PgAdminStore | None, push: PushService) -> None:
        """``store`` is None without PostgreSQL (the actions then raise
        :class:`ConsumeUnavailable`); ``push`` holds the partitions a retry writes."""
        self._store = store
        self._push = push

    @property
    def store(self) -> PgAdminStore:
        return need_store(self._store, "the admin actions need")

    async def _retry(self, targets: list[DeadLetterTarget]) -> list[RetriedCopy]:
        if not targets:
            return []
        keys = {PartitionKey(t.queue_name, t.partition_name) for t in targets}
        store = self.store
        return await self._push.write_held(
            keys, lambda turn: store.retry_dead_letters(targets, turn)
        )

    async def retry_message(
        self, partition_id: int, transaction_id: str, *, by: str | None
    ) -> MessageRetry:
        """Deliver the message's dead letters again (each to its group). Raises
        :class:`NotFound` when the partition holds neither the message nor a dead letter of
        it; a message with no dead letter left answers ``retried`` false."""
        targets = await self.store.dead_letter_targets(
            partition_id=partition_id, transaction_id=transaction_id, limit=RETRY_CHUNK
        )
        copies = await self._retry(targets)
        if not copies and await self.store.message(partition_id, transaction_id) is None:
            raise NotFound("Message not found")
        log.info(
            "%s retried message %s/%s: %s",
            _who(by),
            partition_id,
            transaction_id,
            ", ".join(f"{c.consumer_group} at offset {c.offset}" for c in copies)
            or "no dead letter left",
        )
        return MessageRetry(partition_id, transaction_id, copies)

    async def retry_many(self, scope: RetryFilter, *, by: str | None) -> BulkRetry:
        """Deliver every dead letter of ``scope`` again. Raises :class:`NotFound` for an
        unknown queue."""
        if await self.store.queue(scope.queue) is None:
            raise NotFound(f"queue {scope.queue} not found")
        upto = await self.store.last_dead_letter_id()
        after, retried = 0, 0
        while True:
            targets = await self.store.dead_letter_targets(
                queue=scope.queue,
                group=scope.consumer_group,
                partition=scope.partition,
                since=scope.since,
                until=scope.until,
                after=after,
                upto=upto,
                limit=RETRY_CHUNK,
            )
            if not targets:
                break
            retried += len(await self._retry(targets))
            after = targets[-1].id
        log.info(
            "%s retried %d dead letters of queue %s (group %s, partition %s, failed %s to %s)",
            _who(by),
            retried,
            scope.queue,
            scope.consumer_group or "any",
            scope.partition or "any",
            scope.since.isoformat() if scope.since else "any time",
            scope.until.isoformat() if scope.until else "now",
        )
        return BulkRetry(scope, retried)

    async def dead_letter(
        self,
        partition_id: int,
        transaction_id: str,
        request: DeadLetterRequest,
        *,
        by: str | None,
    ) -> MessageDeadLettered:
        """Move a stored message to ``request``'s group's DLQ (see
        ``queen.admin_dead_letter_message`` for the outcomes)."""
        found = await self.store.dead_letter_message(
            partition_id, transaction_id, request.consumer_group, request.error_message
        )
        outcome: DeadLetterOutcome = next((o for o in OUTCOMES if o == found), "missing")
        log.info(
            "%s moved message %s/%s to the DLQ of %s: %s",
            _who(by),
            partition_id,
            transaction_id,
            request.consumer_group,
            outcome,
        )
        return MessageDeadLettered(partition_id, transaction_id, request, outcome)

    async def clear(self, queue: str, partition: str | None, *, by: str | None) -> QueueCleared:
        """Remove the stored messages of ``queue`` (or of one ``partition``) that no live lease
        holds. Raises :class:`NotFound` for an unknown queue or partition."""
        row = await self.store.clear(queue, partition)
        if not row.known:
            where = f"partition {partition} of queue {queue}" if partition else f"queue {queue}"
            raise NotFound(f"{where} not found")
        cleared = QueueCleared(queue, partition, row.cleared, row.kept)
        log.info(
            "%s cleared %s%s: %d messages removed, %d kept inside live leases",
            _who(by),
            queue,
            f"/{partition}" if partition else "",
            cleared.cleared,
            cleared.kept,
        )
        return cleared

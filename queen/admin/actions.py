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

from queen.admin.params import DeadLetterRequest, RetryFilter
from queen.admin.results import (
    BulkRetry,
    DeadLetterOutcome,
    MessageDeadLettered,
    MessageRetry,
    QueueCleared,
    RetriedCopy,
)
from queen.consume.errors import ConsumeUnavailable, NotFound
from queen.model import PartitionKey
from queen.push import PushService
from queen.storage.admin import PgAdminStore, Row

log = logging.getLogger("queen.admin.actions")

RETRY_CHUNK = 500
OUTCOMES: tuple[DeadLetterOutcome, ...] = (
    "moved",
    "already",
    "consumed",
    "leased",
    "no_group",
    "missing",
)


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
        if self._store is None:
            raise ConsumeUnavailable("the admin actions need the PostgreSQL store")
        return self._store

    async def _retry(self, targets: list[Row]) -> list[RetriedCopy]:
        if not targets:
            return []
        keys = {PartitionKey(t["queue_name"], t["partition_name"]) for t in targets}
        store = self.store
        rows = await self._push.write_held(
            keys, lambda turn: store.retry_dead_letters(targets, turn)
        )
        return [
            RetriedCopy(
                int(r["partition_id"]),
                r["transaction_id"],
                r["consumer_group"],
                int(r["msg_offset"]),
            )
            for r in rows
        ]

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
            after = int(targets[-1]["id"])
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
        if not row["known"]:
            where = f"partition {partition} of queue {queue}" if partition else f"queue {queue}"
            raise NotFound(f"{where} not found")
        cleared = QueueCleared(queue, partition, int(row["cleared"]), int(row["kept"]))
        log.info(
            "%s cleared %s%s: %d messages removed, %d kept inside live leases",
            _who(by),
            queue,
            f"/{partition}" if partition else "",
            cleared.cleared,
            cleared.kept,
        )
        return cleared

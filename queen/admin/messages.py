"""Stored messages: one page of them (newest first, no payloads), one message with its payload
and every group's standing on it, and the deletion of one message."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, get_args

from queen.admin import params
from queen.admin.figures import need_store
from queen.admin.params import Args, Page, TimeRange
from queen.admin.payloads import Shown, decode_payload
from queen.consume import requests
from queen.consume.errors import InvalidRequest
from queen.encryption import QueueEncryption
from queen.records import QUEUE_MODE
from queen.storage.admin import (
    DeadLetterRecord,
    GroupView,
    MessageDetailRow,
    PgAdminStore,
    StoredMessageRow,
)

MessageStatus = Literal["pending", "processing", "completed", "dead_letter"]
DeletionOutcome = Literal["deleted", "leased", "missing"]
MESSAGE_STATUSES: tuple[MessageStatus, ...] = get_args(MessageStatus)
MESSAGES_WINDOW = timedelta(days=7)  # the messages listed when no window is asked

# --- queries -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageQuery:
    """Which stored messages to list: one page of those stored inside ``window``, filtered.
    With ``transaction_id`` (which needs ``queue``), the messages of ``queue`` holding it,
    whenever stored; the other filters do not apply (they are not read)."""

    page: Page
    window: TimeRange
    queue: str | None = None
    transaction_id: str | None = None
    partition: str | None = None
    namespace: str | None = None
    task: str | None = None
    status: MessageStatus | None = None


def message_query(args: Args, *, queue: str | None = None) -> MessageQuery:
    """``limit`` (50 by default), ``offset``, ``from``, ``to`` (by default the last seven
    days), ``queue`` (``queue`` instead, when given), ``transactionId``, ``partition``,
    ``namespace``, ``task`` and ``status``."""
    page = params.page(args, default_limit=50)
    window = params.window(args, default=MESSAGES_WINDOW)
    queue = queue or params.optional_name(args, "queue")
    found = transaction_id(args)
    if found is not None:
        if queue is None:
            raise InvalidRequest("transactionId needs queue: the queue to look in")
        return MessageQuery(page, window, queue, found)
    return MessageQuery(
        page,
        window,
        queue,
        None,
        params.optional_name(args, "partition"),
        params.optional_name(args, "namespace"),
        params.optional_name(args, "task"),
        status(args),
    )


def status(args: Args) -> MessageStatus | None:
    """``status``: one of :data:`MESSAGE_STATUSES` (``dlq`` stands for ``dead_letter``)."""
    value = args.get("status")
    if not value:
        return None
    found = known_status("dead_letter" if value == "dlq" else value)
    if found is None:
        raise InvalidRequest(f"status must be one of {', '.join(MESSAGE_STATUSES)}")
    return found


def known_status(text: object) -> MessageStatus | None:
    """``text`` as a message status, or None if it names none."""
    return next((s for s in MESSAGE_STATUSES if s == text), None)


def transaction_id(args: Args) -> str | None:
    """``transactionId``: a message's transaction id to look for (at most 256 characters)."""
    value = args.get("transactionId")
    if not value:
        return None
    if len(value) > 256:
        raise InvalidRequest("transactionId must be at most 256 characters")
    return requests.text(str(value), "transactionId")


# --- answers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A stored message without its payload, with queue mode's status of it; in a list, of
    the named groups with a cursor on its partition (``total_groups``), how many have it
    behind their cursor (``consumed_by``)."""

    partition_id: int
    queue: str
    partition: str
    namespace: str
    task: str
    offset: int
    message_id: str
    transaction_id: str
    status: MessageStatus
    trace_id: str | None
    producer_sub: str | None
    created_at: datetime
    lease_expires_at: datetime | None
    consumed_by: int | None = None
    total_groups: int | None = None


@dataclass(frozen=True, slots=True)
class MessagePage:
    """Stored messages, newest first: one page of those stored inside the window."""

    messages: list[StoredMessage]
    page: Page
    window: TimeRange


@dataclass(frozen=True, slots=True)
class MessageDetail:
    """One stored message with its payload, every group's view of it and its DLQ copies
    (newest first). ``message.lease_expires_at`` is queue mode's live lease on the partition;
    the queue's delivery options follow."""

    message: StoredMessage
    payload: Shown
    consumer_groups: list[GroupView]
    dead_letters: list[DeadLetterRecord]
    lease_time_s: int
    retry_limit: int
    retry_delay_ms: int
    ttl_s: int
    priority: int


@dataclass(frozen=True, slots=True)
class MessageDeletion:
    """The outcome of deleting one message: ``leased`` ones are left alone."""

    partition_id: int
    transaction_id: str
    outcome: DeletionOutcome


def _stored(
    r: StoredMessageRow,
    status: MessageStatus,
    lease_expires_at: datetime | None,
    *,
    consumed_by: int | None = None,
    total_groups: int | None = None,
) -> StoredMessage:
    return StoredMessage(
        partition_id=r.partition_id,
        queue=r.queue_name,
        partition=r.partition_name,
        namespace=r.namespace,
        task=r.task,
        offset=r.msg_offset,
        message_id=str(r.message_id),
        transaction_id=r.transaction_id,
        status=status,
        trace_id=None if r.trace_id is None else str(r.trace_id),
        producer_sub=r.producer_sub,
        created_at=r.created_at,
        lease_expires_at=lease_expires_at,
        consumed_by=consumed_by,
        total_groups=total_groups,
    )


def _status(row: MessageDetailRow) -> tuple[MessageStatus, GroupView | None]:
    """Queue mode's status of a message, and queue mode's standing on it."""
    queue_mode = next((g for g in row.groups if g.name == QUEUE_MODE), None)
    if row.dlq:
        return "dead_letter", queue_mode
    if queue_mode and queue_mode.consumed:
        return "completed", queue_mode
    if queue_mode and queue_mode.leased:
        return "processing", queue_mode
    return "pending", queue_mode


def _listed_status(text: str) -> MessageStatus:
    found = known_status(text)
    if found is None:  # pragma: no cover - queen.admin_messages names one of the four
        raise ValueError(f"unknown message status {text!r}")
    return found


class MessageReads:
    def __init__(self, store: PgAdminStore | None, encryption: QueueEncryption) -> None:
        """``store`` is None without PostgreSQL (the reads then raise
        :class:`queen.consume.errors.ConsumeUnavailable`); ``encryption`` opens payloads."""
        self._store = store
        self.encryption = encryption

    @property
    def store(self) -> PgAdminStore:
        return need_store(self._store)

    async def page(self, query: MessageQuery) -> MessagePage:
        """``GET /api/v1/messages``: stored messages, newest first, one page (no payloads)."""
        if query.transaction_id is not None and query.queue is not None:
            return await self._find(query.queue, query.transaction_id, query)
        rows = await self.store.messages(
            queue=query.queue,
            partition=query.partition,
            namespace=query.namespace,
            task=query.task,
            status=query.status,
            since=query.window.since,
            until=query.window.until,
            limit=query.page.limit,
            offset=query.page.offset,
        )
        return MessagePage(
            [
                _stored(
                    r,
                    _listed_status(r.status),
                    r.lease_expires_at,
                    consumed_by=r.consumed_by,
                    total_groups=r.total_groups,
                )
                for r in rows
            ],
            query.page,
            query.window,
        )

    async def _find(self, queue: str, transaction_id: str, query: MessageQuery) -> MessagePage:
        """The messages of ``queue`` with ``transaction_id`` (one per partition holding one),
        whenever they were stored."""
        page = query.page
        ids = await self.store.find_partitions(queue, transaction_id, page.offset + page.limit)
        found = []
        for partition_id in ids[page.offset :]:
            detail = await self.detail(partition_id, transaction_id)
            if detail is not None:
                found.append(detail.message)
        return MessagePage(found, page, query.window)

    async def detail(self, partition_id: int, transaction_id: str) -> MessageDetail | None:
        """``GET /api/v1/messages/{partitionId}/{transactionId}``, with the payload."""
        row = await self.store.message(partition_id, transaction_id)
        if row is None:
            return None
        status, queue_mode = _status(row)
        return MessageDetail(
            message=_stored(row, status, queue_mode.lease_expires_at if queue_mode else None),
            payload=decode_payload(row.payload, str(row.message_id), self.encryption),
            consumer_groups=row.groups,
            dead_letters=row.dlq,
            lease_time_s=row.lease_time_s,
            retry_limit=row.retry_limit,
            retry_delay_ms=row.retry_delay_ms,
            ttl_s=row.ttl_s,
            priority=row.priority,
        )

    async def delete(self, partition_id: int, transaction_id: str) -> MessageDeletion:
        """``DELETE /api/v1/messages/{partitionId}/{transactionId}``."""
        outcome = await self.store.delete_message(partition_id, transaction_id)
        found: DeletionOutcome = next(
            (o for o in get_args(DeletionOutcome) if o == outcome), "missing"
        )
        return MessageDeletion(partition_id, transaction_id, found)

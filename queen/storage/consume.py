"""The PostgreSQL side of consuming: one SQL function call per operation (``consume.sql``).

Every method is one round trip in autocommit mode: configure, pop, ack, lease extension, the
ack-and-push transaction, DLQ pages, consumer-group changes and system switches. The SQL
functions hold the rules (leases, fencing, retries, the cursor); this module only moves
values in and out. Deadlocks cannot arise from the broker's own lock order (see
``consume.sql``), but an operator's ad-hoc SQL could cause one: the atomic calls are retried
on a detected deadlock, which is safe because each call is one transaction.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import trio

from queen.errors import StoreDeadlock
from queen.model import PartitionKey, first_wins
from queen.primitives import Turn, require_turn
from queen.records import (
    AckItem,
    AckResult,
    Delivered,
    DlqEntry,
    DlqQuery,
    PopRequest,
    QueueOptions,
    Sizing,
    TransactionRequest,
)
from queen.storage import system
from queen.storage.listener import PushListener
from queen.storage.pool import DEADLOCK_ATTEMPTS, ConnectionPool
from queen.storage.traces import PgTraceStore, TraceStore

log = logging.getLogger("queen.storage")


# queen.pop over the connection's own libpq handle: text in, text out, no worker thread (see
# ConnectionPool.query). The lease's end comes as exact UTC text.
_POP_TEXT_SQL = (
    b"SELECT partition_id, queue_name, partition_name, msg_offset, message_id::text,"
    b" transaction_id, payload, producer_sub, trace_id::text, retry_count,"
    b" to_char(lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'),"
    b" ripe_in_s"
    b" FROM queen.pop($1::text, $2::text, $3::text, $4::text, $5::text, $6::integer,"
    b" $7::integer, $8::boolean, $9::text, $10::timestamptz, $11::uuid, $12::boolean,"
    b" $13::bigint, $14::text[], $15::integer)"
)
_ACK_TEXT_SQL = (
    b"SELECT idx, success, error, queue_name, partition_name, lease_released, dlq"
    b" FROM queen.ack($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::uuid[])"
)
_TRANSACT_SQL = (
    "SELECT ok, reason, acks, pids, statuses, originals FROM queen.transact("
    "%s::uuid[], %s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::uuid[],"
    " %s::text[], %s::text[], %s::uuid[], %s::text[], %s::text[], %s::text[], %s::uuid[],"
    " %s::integer[])"
)
_DLQ_SQL = (
    "SELECT total, message_id::text, transaction_id, partition_id, queue_name, partition_name,"
    " consumer_group, error_message, retry_count, payload, producer_sub, trace_id::text,"
    " failed_at, msg_offset"
    " FROM queen.dlq_page(%s::text, %s::text, %s::text, %s::timestamptz, %s::timestamptz,"
    " %s::integer, %s::integer)"
)

_KEEP_IN_DLQ_SQL = (
    "INSERT INTO queen.dlq (queue_id, partition_id, consumer_group, msg_offset, message_id,"
    " transaction_id, payload, producer_sub, trace_id, error_message, retry_count)"
    " SELECT p.queue_id, u.pid, %s::text, u.off, u.mid, u.tx, u.pl, u.sub, u.tr, %s::text, u.rc"
    " FROM unnest(%s::bigint[], %s::bigint[], %s::uuid[], %s::text[], %s::text[], %s::text[],"
    " %s::uuid[], %s::integer[]) AS u (pid, off, mid, tx, pl, sub, tr, rc)"
    " JOIN queen.partitions p ON p.id = u.pid"
)


@dataclass(frozen=True, slots=True)
class PushedFrame:
    """One item pushed by a transaction: where its result goes and what became of it."""

    index: int
    key: PartitionKey
    message_id: str
    transaction_id: str
    partition_id: int | None = None
    duplicate_of: str | None = None


@dataclass(frozen=True, slots=True)
class TransactOutcome:
    ok: bool
    reason: str | None
    acks: list[AckResult]
    pushed: list[PushedFrame]


PENDING_NONE = float("inf")
"""``PopOutcome.ripe_in_s`` when nothing is pending: only a wake-up can change that."""


@dataclass(frozen=True, slots=True)
class PopOutcome:
    """What a pop delivered, the lease's expiry, and (a waiting pop that found nothing) in how
    many seconds the earliest pending partition may become claimable: 0 when it may be now
    (another pop holds it), :data:`PENDING_NONE` when the scope has nothing pending, None when
    not known (the pop did not wait, or delivered). ``payload_bytes``: the delivered payloads'
    octets, as stored."""

    delivered: list[Delivered]
    lease_expires_at: datetime | None = None
    ripe_in_s: float | None = None
    payload_bytes: int = 0


@dataclass(frozen=True, slots=True)
class SeekOutcome:
    queue_found: bool
    partition_found: bool
    updated: int  # cursors moved
    moved_to: datetime | None  # to the end: the newest stored segment's time; else the target


class ConsumeStore(Protocol):
    """What the consume service needs from storage. :class:`PgConsumeStore` is the real one;
    the tests' in-memory store keeps the same contract, so the waiting logic of
    :class:`queen.consume.service.ConsumeService` runs on virtual time."""

    async def configure(
        self, queue: str, namespace: str, task: str, options: QueueOptions
    ) -> tuple[int, int]: ...

    async def delete_queue(self, queue: str) -> bool: ...

    async def pop(
        self,
        request: PopRequest,
        sizing: Sizing,
        lease_id: str | None,
        max_bytes: int,
        hint: Collection[str] | None = None,
    ) -> PopOutcome:
        """Claim and lease (or, with autoAck, commit) messages, their payloads adding up to
        at most ``max_bytes`` octets, though always at least one message (nothing beyond is
        leased). For a waiting pop (``request.wait``) that found nothing, also when to look
        again (:class:`PopOutcome`). ``hint`` (a queue pop's partition names): look at those
        partitions only, and say when to look again about them only."""
        ...

    async def ack(self, items: Sequence[AckItem]) -> list[AckResult]: ...

    async def extend_lease(
        self, lease_id: str, seconds: int | None
    ) -> tuple[int, datetime | None, str]: ...

    async def transact(
        self, request: TransactionRequest, producer_sub: str | None, turn: Turn
    ) -> TransactOutcome: ...

    async def dlq_page(self, query: DlqQuery) -> tuple[int, list[DlqEntry]]: ...

    async def keep_in_dlq(self, group: str, messages: Sequence[Delivered], error: str) -> int: ...

    async def delete_consumer_group(self, group: str, metadata: bool) -> int: ...

    async def delete_consumer_group_on_queue(
        self, group: str, queue: str, metadata: bool
    ) -> tuple[bool, int, bool]: ...

    async def seek(
        self, group: str, queue: str, partition: str | None, to_end: bool, at: datetime | None
    ) -> SeekOutcome: ...

    async def set_subscription(self, group: str, at: datetime) -> int: ...

    async def get_state(self, key: str) -> Any: ...

    async def set_state(self, key: str, value: Any) -> None: ...

    def trace_store(self) -> TraceStore: ...

    def push_listener(
        self,
        on_queues: Callable[[set[str]], None],
        on_reconnect: Callable[[], None],
        on_partitions: Callable[[set[tuple[str, str]]], None] | None = None,
    ) -> PushListener | None:
        """What tells this process about pushes made by other processes (None: nothing):
        ``on_partitions`` with the (queue, partition) written, ``on_queues`` with queues
        named as a whole."""
        ...


def _configure_argument(o: QueueOptions) -> dict[str, Any]:
    """``p_options`` of ``queen.configure_queue``: every option, under the keys consume.sql
    reads."""
    return {
        "leaseTime": o.lease_time_s,
        "retryLimit": o.retry_limit,
        "retryDelay": o.retry_delay_ms,
        "maxSize": o.max_size,
        "ttl": o.ttl_s,
        "deadLetterQueue": o.dead_letter_queue,
        "dlqAfterMaxRetries": o.dlq_after_max_retries,
        "priority": o.priority,
        "delayedProcessing": o.delayed_processing_s,
        "windowBuffer": o.window_buffer_s,
        "retentionSeconds": o.retention_s,
        "completedRetentionSeconds": o.completed_retention_s,
        "retentionEnabled": o.retention_enabled,
        "maxWaitTimeSeconds": o.max_wait_time_s,
        "encryptionEnabled": o.encryption_enabled,
        "dedupWindowSeconds": o.dedup_window_s,
    }


class PgConsumeStore:
    """The consume operations on PostgreSQL, over the broker's connection pool."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    async def configure(
        self, queue: str, namespace: str, task: str, options: QueueOptions
    ) -> tuple[int, int]:
        row = await self.pool.fetch_one(
            "SELECT queue_id, partition_id FROM queen.configure_queue(%s, %s, %s, %s::jsonb)",
            (queue, namespace, task, json.dumps(_configure_argument(options))),
            retry_deadlock=True,
        )
        assert row is not None
        return int(row[0]), int(row[1])

    async def delete_queue(self, queue: str) -> bool:
        row = await self.pool.fetch_one(
            "SELECT queen.delete_queue(%s)", (queue,), retry_deadlock=True
        )
        return bool(row and row[0])

    async def pop(
        self,
        request: PopRequest,
        sizing: Sizing,
        lease_id: str | None,
        max_bytes: int,
        hint: Collection[str] | None = None,
    ) -> PopOutcome:
        """Claim and lease (or, with autoAck, commit) messages; see ``queen.pop``."""
        sub = request.subscription
        params = (
            request.queue,
            request.partition,
            request.namespace,
            request.task,
            request.consumer_group,
            sizing.batch,
            sizing.partitions,
            request.auto_ack,
            sub.start.value,
            sub.at,
            lease_id,
            request.wait,
            max_bytes,
            None if hint is None else _pg_array(sorted(hint)).decode(),
            sizing.spread,
        )

        # Shielded: a pop that reached the database finishes there (its lease is taken, or
        # with autoAck its cursor moved) whatever happens to its caller meanwhile.
        with trio.CancelScope(shield=True):
            rows = await self.pool.query("queen_pop", _POP_TEXT_SQL, _text_params(params))
        if rows and rows[-1][0] is None:  # nothing delivered: when to look again
            ripe = rows[-1][11]
            return PopOutcome([], None, PENDING_NONE if ripe is None else float(ripe))
        delivered = [_delivered(row) for row in rows]
        expires = rows[0][10] if rows else None
        size = sum(len(row[6] or b"") for row in rows)
        return PopOutcome(delivered, _utc(expires) if expires is not None else None, None, size)

    async def ack(self, items: Sequence[AckItem]) -> list[AckResult]:
        """Apply acknowledgments; one outcome per item, in item order.

        Over the connection's own libpq handle (no worker thread), the columns as array
        literals; shielded like a pop, and run again if chosen as a deadlock victim."""
        params = [_pg_array(column) for column in _ack_arrays(items)]
        for attempt in range(DEADLOCK_ATTEMPTS):
            try:
                with trio.CancelScope(shield=True):
                    rows = await self.pool.query("queen_ack", _ACK_TEXT_SQL, params)
                break
            except StoreDeadlock:
                if attempt == DEADLOCK_ATTEMPTS - 1:
                    raise
                log.warning("deadlock detected; retrying the call")
        results = []
        for idx, success, error, queue, partition, released, dlq in rows:
            assert idx is not None
            index = int(idx) - 1
            results.append(
                AckResult(
                    index,
                    items[index].transaction_id,
                    success == b"t",
                    _text(error),
                    _text(queue),
                    _text(partition),
                    released == b"t",
                    dlq == b"t",
                )
            )
        return sorted(results, key=_by_index)

    async def extend_lease(
        self, lease_id: str, seconds: int | None
    ) -> tuple[int, datetime | None, str]:
        row = await self.pool.fetch_one(
            "SELECT renewed, expires_at, state FROM queen.extend_lease(%s::uuid, %s::integer)",
            (lease_id, seconds),
            retry_deadlock=True,
        )
        assert row is not None
        return int(row[0]), row[1], str(row[2])

    async def transact(
        self, request: TransactionRequest, producer_sub: str | None, turn: Turn
    ) -> TransactOutcome:
        """Apply the acks and pushes of one transaction atomically (``queen.transact``).
        ``turn``: the push service's hold of the pushed partitions (raises
        :class:`queen.primitives.NoTurn`, nothing sent, without it)."""
        require_turn(turn, request.push_keys(), "a transaction")
        frames, push_params = _push_arrays(request, producer_sub)
        items = [a.item for a in request.acks]
        params = (request.required_leases, *_ack_arrays(items), *push_params)
        row = await self.pool.fetch_one(_TRANSACT_SQL, params, retry_deadlock=True)
        assert row is not None
        ok, reason, acks_json, pids, statuses, originals = row
        acks = [
            AckResult(
                index=request.acks[int(a["idx"]) - 1].index,
                transaction_id=request.acks[int(a["idx"]) - 1].item.transaction_id,
                success=bool(a["success"]),
                error=a["error"],
                queue=a["queue_name"],
                partition=a["partition_name"],
                lease_released=bool(a["lease_released"]),
                dlq=bool(a["dlq"]),
            )
            for a in acks_json or []
        ]
        pushed = frames
        if ok and frames:
            pushed = _pushed(frames, pids, statuses, originals)
        return TransactOutcome(bool(ok), reason, acks, pushed)

    async def dlq_page(self, query: DlqQuery) -> tuple[int, list[DlqEntry]]:
        params = (
            query.queue,
            query.consumer_group,
            query.partition,
            query.since,
            query.until,
            query.limit,
            query.offset,
        )
        rows = await self.pool.fetch_all(_DLQ_SQL, params)
        total = int(rows[0][0]) if rows else 0
        return total, [DlqEntry(*row[1:]) for row in rows if row[1] is not None]

    async def keep_in_dlq(self, group: str, messages: Sequence[Delivered], error: str) -> int:
        """Copy delivered messages, as stored, to ``group``'s dead letter queue with ``error``
        (messages an autoAck pop moved past but could not hand over); how many were copied."""
        params = (
            group,
            error,
            [m.partition_id for m in messages],
            [m.offset for m in messages],
            [m.message_id for m in messages],
            [m.transaction_id for m in messages],
            [m.payload for m in messages],
            [m.producer_sub for m in messages],
            [m.trace_id for m in messages],
            [m.retry_count for m in messages],
        )
        return await self.pool.execute(_KEEP_IN_DLQ_SQL, params)

    async def delete_consumer_group(self, group: str, metadata: bool) -> int:
        row = await self.pool.fetch_one(
            "SELECT queen.delete_consumer_group(%s, %s)", (group, metadata), retry_deadlock=True
        )
        return int(row[0]) if row else 0

    async def delete_consumer_group_on_queue(
        self, group: str, queue: str, metadata: bool
    ) -> tuple[bool, int, bool]:
        """(queue found, cursors deleted, subscription deleted)."""
        row = await self.pool.fetch_one(
            "SELECT queue_found, cursors_deleted, metadata_deleted"
            " FROM queen.delete_consumer_group_on_queue(%s, %s, %s)",
            (group, queue, metadata),
            retry_deadlock=True,
        )
        assert row is not None
        return bool(row[0]), int(row[1]), bool(row[2])

    async def seek(
        self, group: str, queue: str, partition: str | None, to_end: bool, at: datetime | None
    ) -> SeekOutcome:
        """Move the group's cursors on the queue (or one partition); see ``queen.seek``."""
        row = await self.pool.fetch_one(
            "SELECT queue_found, partition_found, updated, moved_to FROM queen.seek("
            "%s::text, %s::text, %s::text, %s::boolean, %s::timestamptz)",
            (group, queue, partition, to_end, at),
            retry_deadlock=True,
        )
        assert row is not None
        return SeekOutcome(bool(row[0]), bool(row[1]), int(row[2] or 0), row[3])

    async def set_subscription(self, group: str, at: datetime) -> int:
        row = await self.pool.fetch_one(
            "SELECT queen.set_subscription(%s, %s::timestamptz)", (group, at), retry_deadlock=True
        )
        return int(row[0]) if row else 0

    async def get_state(self, key: str) -> Any:
        return await system.get_state(self.pool, key)

    async def set_state(self, key: str, value: Any) -> None:
        await system.set_state(self.pool, key, value)

    def trace_store(self) -> PgTraceStore:
        return PgTraceStore(self.pool)

    def push_listener(
        self,
        on_queues: Callable[[set[str]], None],
        on_reconnect: Callable[[], None],
        on_partitions: Callable[[set[tuple[str, str]]], None] | None = None,
    ) -> PushListener:
        """A LISTEN connection of its own, opened from the pool's settings."""
        return PushListener(
            self.pool.connect_sync,
            on_queues,
            on_partitions=on_partitions,
            on_reconnect=on_reconnect,
            open_timeout_s=self.pool.call_timeout_s,
        )


def _by_index(outcome: AckResult) -> int:
    return outcome.index


def _text_params(values: Sequence[Any]) -> list[bytes | None]:
    """Parameters in PostgreSQL's text format (the statement casts each to its type)."""
    out: list[bytes | None] = []
    for value in values:
        if value is None:
            out.append(None)
        elif isinstance(value, bool):
            out.append(b"true" if value else b"false")
        elif isinstance(value, datetime):
            out.append(value.isoformat().encode())
        else:
            out.append(str(value).encode())
    return out


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _delivered(row: Sequence[bytes | None]) -> Delivered:
    """One message of a pop's text row (the columns of ``_POP_TEXT_SQL``)."""
    (pid, queue, partition, offset, message_id, txid, payload, sub, trace, retries) = row[:10]
    assert pid is not None and queue is not None and partition is not None
    assert offset is not None and message_id is not None and txid is not None
    assert payload is not None and retries is not None
    return Delivered(
        int(pid),
        queue.decode(),
        partition.decode(),
        int(offset),
        message_id.decode(),
        txid.decode(),
        payload.decode(),
        _text(sub),
        _text(trace),
        int(retries),
    )


def _utc(text: bytes) -> datetime:
    return datetime.fromisoformat(text.decode()).replace(tzinfo=UTC)


def _ack_arrays(items: Sequence[AckItem]) -> tuple[list[Any], ...]:
    return (
        [i.consumer_group for i in items],
        [i.partition_id for i in items],
        [i.transaction_id for i in items],
        [i.status for i in items],
        [i.error for i in items],
        [i.lease_id for i in items],
    )


def _pg_array(values: Sequence[Any]) -> bytes:
    """A one-dimensional array literal in PostgreSQL's text format: every element quoted
    (backslash and double quote escaped), None as NULL."""
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
            continue
        text = value if type(value) is str else str(value)
        if "\\" in text or '"' in text:
            text = text.replace("\\", "\\\\").replace('"', '\\"')
        parts.append(f'"{text}"')
    return ("{" + ",".join(parts) + "}").encode()


def _push_arrays(
    request: TransactionRequest, producer_sub: str | None
) -> tuple[list[PushedFrame], tuple[list[Any], ...]]:
    """The pushed items as frames grouped by partition (first-wins leaders per partition)."""
    grouped: dict[PartitionKey, list[tuple[PushedFrame, bytes, str | None]]] = {}
    for push in request.pushes:
        for batch in push.prepared.batches:
            traces = batch.trace_ids or [None] * len(batch.indexes)
            rows = grouped.setdefault(batch.key, [])
            for pos, index in enumerate(batch.indexes):
                frame = PushedFrame(
                    push.index + index,
                    batch.key,
                    batch.message_ids[pos],
                    batch.transaction_ids[pos],
                )
                rows.append((frame, batch.payloads[pos], traces[pos]))
    frames: list[PushedFrame] = []
    cols: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [])
    for key, rows in grouped.items():
        base = len(frames) + 1
        leaders = first_wins([f.transaction_id for f, _, _ in rows])
        for (frame, payload, trace), lead in zip(rows, leaders, strict=True):
            frames.append(frame)
            cols[0].append(key.queue)
            cols[1].append(key.partition)
            cols[2].append(frame.message_id)
            cols[3].append(frame.transaction_id)
            cols[4].append(payload.decode("utf-8"))
            cols[5].append(producer_sub)
            cols[6].append(trace)
            cols[7].append(base + lead)
    return frames, cols


def _pushed(
    frames: list[PushedFrame], pids: list[int], statuses: str, originals: str | None
) -> list[PushedFrame]:
    named = iter(originals.split(",") if originals else ())
    out: list[PushedFrame] = []
    for frame, pid, status in zip(frames, pids, statuses, strict=True):
        out.append(
            PushedFrame(
                frame.index,
                frame.key,
                frame.message_id,
                frame.transaction_id,
                int(pid),
                next(named) if status == "1" else None,
            )
        )
    return out

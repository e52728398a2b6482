"""Processing traces on PostgreSQL: one SQL function call per operation (``consume.sql``)."""

from __future__ import annotations

from typing import Protocol

from queen.records import StoredTrace, TraceName, TraceRecord
from queen.storage.pool import ConnectionPool

_MAX_BIGINT = (1 << 63) - 1


class TraceStore(Protocol):
    """Where processing traces are kept (:class:`PgTraceStore`)."""

    async def queue_of(self, partition_id: int) -> str | None: ...

    async def record(self, trace: TraceRecord, worker_id: str) -> int | None: ...

    async def for_message(self, partition_id: int, transaction_id: str) -> list[StoredTrace]: ...

    async def by_name(
        self, name: str, limit: int, offset: int
    ) -> tuple[int, list[StoredTrace]]: ...

    async def names(self, limit: int, offset: int) -> tuple[int, list[TraceName]]: ...


class PgTraceStore:
    """Record and read traces, over the broker's connection pool."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    async def queue_of(self, partition_id: int) -> str | None:
        """The name of the queue holding ``partition_id``; None when there is no such
        partition."""
        if not 0 < partition_id <= _MAX_BIGINT:
            return None
        row = await self.pool.fetch_one(
            "SELECT q.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id"
            " WHERE p.id = %s::bigint",
            (partition_id,),
        )
        return None if row is None else str(row[0])

    async def record(self, trace: TraceRecord, worker_id: str) -> int | None:
        """The new trace's id; None when its partition does not exist."""
        if trace.partition_id is None:
            return None
        params = (
            trace.partition_id,
            trace.transaction_id,
            trace.consumer_group,
            trace.event_type,
            trace.data,
            list(trace.names),
            worker_id,
        )
        row = await self.pool.fetch_one(
            "SELECT queen.record_trace(%s::bigint, %s::text, %s::text, %s::text, %s::text,"
            " %s::text[], %s::text)",
            params,
        )
        return None if row is None or row[0] is None else int(row[0])

    async def for_message(self, partition_id: int, transaction_id: str) -> list[StoredTrace]:
        if not 0 < partition_id <= _MAX_BIGINT:
            return []
        return await self.pool.fetch_all(
            "SELECT id, event_type, data, consumer_group, worker_id, created_at, names"
            " FROM queen.message_traces(%s::bigint, %s::text)",
            (partition_id, transaction_id),
            row=StoredTrace,
        )

    async def by_name(self, name: str, limit: int, offset: int) -> tuple[int, list[StoredTrace]]:
        rows = await self.pool.fetch_all(
            "SELECT total, id, event_type, data, consumer_group, worker_id, created_at,"
            " names, transaction_id, partition_id, queue_name, partition_name"
            " FROM queen.traces_by_name(%s::text, %s::integer, %s::integer)",
            (name, limit, offset),
        )
        total = int(rows[0][0]) if rows else 0
        return total, [StoredTrace(*row[1:]) for row in rows if row[1] is not None]

    async def names(self, limit: int, offset: int) -> tuple[int, list[TraceName]]:
        rows = await self.pool.fetch_all(
            "SELECT total, name, trace_count, message_count, last_seen"
            " FROM queen.trace_names(%s::integer, %s::integer)",
            (limit, offset),
        )
        total = int(rows[0][0]) if rows else 0
        return total, [TraceName(*row[1:]) for row in rows if row[1] is not None]

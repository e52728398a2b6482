"""Retention, eviction and sidecar pruning on PostgreSQL: one pass = bounded batches, one
process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from queen.storage.pool import ConnectionPool

_RETENTION_LOCK = 0x5155_4545_4E01  # one advisory lock id: one retention pass at a time


@dataclass(slots=True)
class PassOutcome:
    """What one pass removed; ``ran`` is False when another process held the pass lock."""

    ran: bool = False
    segments: int = 0
    messages: int = 0
    sidecar_rows: int = 0
    evicted_segments: int = 0
    evicted_messages: int = 0
    traces: int = 0
    batches: int = 0
    tables_analyzed: int = 0  # tables that had outgrown their planner statistics
    # the shortest retentionSeconds, completedRetentionSeconds (of queues with retention on)
    # or maxWaitTimeSeconds of any queue, in seconds; None when no queue has one
    shortest_s: int | None = None


@dataclass(slots=True)
class QueueHoldings:
    queue_id: int
    namespace: str
    task: str
    dedup_window_seconds: int
    retention_seconds: int
    completed_retention_seconds: int
    partitions: int
    segments: int
    messages: int
    sidecar_entries: int
    retention_enabled: bool = False
    max_wait_time_seconds: int = 0


_SHORTEST_SQL = """
    SELECT min(t) FROM queen.queues q
    CROSS JOIN LATERAL (VALUES (CASE WHEN q.retention_enabled THEN nullif(q.retention_s, 0) END),
                               (CASE WHEN q.retention_enabled
                                     THEN nullif(q.completed_retention_s, 0) END),
                               (nullif(q.max_wait_time_s, 0))) AS v (t)
"""


def _pass(conn: psycopg.Connection[Any], batch_limit: int, max_batches: int) -> PassOutcome:
    outcome = PassOutcome()
    shortest = conn.execute(_SHORTEST_SQL).fetchone()
    outcome.shortest_s = None if shortest is None or shortest[0] is None else int(shortest[0])
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (_RETENTION_LOCK,)).fetchone()
    if not row or not row[0]:
        return outcome
    outcome.ran = True
    try:
        while outcome.batches < max_batches:  # whole segments past their retention
            seg = conn.execute(
                "SELECT segments, messages FROM queen.retention_batch(%s)", (batch_limit,)
            ).fetchone()
            outcome.batches += 1
            if not seg or not seg[0]:
                break
            outcome.segments += int(seg[0])
            outcome.messages += int(seg[1])
        _evict(conn, outcome, batch_limit, max_batches)
        pruning_ends = outcome.batches + max_batches
        while outcome.batches < pruning_ends:  # sidecar rows outside their window
            pruned = conn.execute(
                "SELECT removed FROM queen.prune_dedup_batch(%s)", (batch_limit,)
            ).fetchone()
            outcome.batches += 1
            if not pruned or not pruned[0]:
                break
            outcome.sidecar_rows += int(pruned[0])
        outcome.traces = _trace_batches(conn, batch_limit, max_batches)
        analyzed = conn.execute("SELECT queen.refresh_statistics()").fetchone()
        outcome.tables_analyzed = int(analyzed[0]) if analyzed else 0
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (_RETENTION_LOCK,))
    return outcome


def _evict(
    conn: psycopg.Connection[Any], outcome: PassOutcome, batch_limit: int, max_batches: int
) -> None:
    """Segments that waited longer than their queue's maxWaitTimeSeconds (queen.evict_batch),
    at most ``max_batches`` batches."""
    for _ in range(max_batches):
        row = conn.execute(
            "SELECT segments, messages FROM queen.evict_batch(%s)", (batch_limit,)
        ).fetchone()
        outcome.batches += 1
        if not row or not row[0]:
            break
        outcome.evicted_segments += int(row[0])
        outcome.evicted_messages += int(row[1])


def _trace_batches(conn: psycopg.Connection[Any], batch_limit: int, max_batches: int) -> int:
    """Traces whose messages are gone, in at most ``max_batches`` batches."""
    removed = 0
    for _ in range(max_batches):
        row = conn.execute(
            "SELECT removed FROM queen.trace_retention_batch(%s)", (batch_limit,)
        ).fetchone()
        if not row or not row[0]:
            break
        removed += int(row[0])
    return removed


class PgRetentionStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    async def run_pass(self, batch_limit: int, max_batches: int) -> PassOutcome:
        """One retention pass, unless another broker process is running one."""
        return await self.pool.run(lambda conn: _pass(conn, batch_limit, max_batches))

    async def holdings(self, queue: str) -> QueueHoldings | None:
        def read(conn: psycopg.Connection[Any]) -> QueueHoldings | None:
            row = conn.execute("SELECT * FROM queen.queue_holdings(%s)", (queue,)).fetchone()
            if row is None:
                return None
            flags = conn.execute(
                "SELECT retention_enabled, max_wait_time_s FROM queen.queues WHERE id = %s",
                (row[0],),
            ).fetchone()
            return QueueHoldings(*row, *(flags or ()))

        return await self.pool.run(read)  # two statements on one connection

    async def totals(self) -> dict[str, int]:
        """What retention and pruning removed so far, all broker processes together."""
        rows = await self.pool.fetch_all("SELECT name, value FROM queen.retention_totals")
        return {str(name): int(value) for name, value in rows}

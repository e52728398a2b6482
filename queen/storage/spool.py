"""What the spool replay asks the database: when queues were deleted."""

from __future__ import annotations

from queen.storage.pool import ConnectionPool


async def deleted_queues(pool: ConnectionPool, names: list[str]) -> dict[str, int]:
    """For those of ``names`` that were deleted: the time of the latest deletion (Unix ns)."""
    rows = await pool.fetch_all(
        """SELECT name, (extract(epoch FROM deleted_at) * 1000000)::bigint
           FROM queen.deleted_queues WHERE name = ANY(%s)""",
        (names,),
    )
    return {str(name): int(micros) * 1000 for name, micros in rows}

"""``queen.system_state``: small JSON documents under a key, shared by every broker process
(the maintenance switches)."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from queen.storage.pool import ConnectionPool


async def get_state(pool: ConnectionPool, key: str) -> Any:
    """The value stored under ``key``, or None."""
    row = await pool.fetch_one("SELECT value FROM queen.system_state WHERE key = %s", (key,))
    return None if row is None else row[0]


async def set_state(pool: ConnectionPool, key: str, value: Any) -> None:
    await pool.execute(
        """INSERT INTO queen.system_state (key, value, updated_at) VALUES (%s, %s, now())
           ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = now()""",
        (key, Jsonb(value)),
    )

"""The PostgreSQL store: schema migration, partition registry and the one-round-trip push write.

A batch of segment writes is one call of ``queen.push_segments`` in autocommit mode: the call
locks the partitions in id order, probes the dedup sidecar, allocates offsets, inserts the
segments and sidecar rows, bumps ``next_offset`` and commits, all in a single round trip.

Columns travel as texts joined by ``chr(31)`` and are split by the server: psycopg adapts a
Python list element by element (about 12 µs per element measured here), while a joined string
costs well under a microsecond per element. Encoded JSON never holds a raw control character,
names and transaction ids are refused with control characters at intake, and a value that still
contains the separator (a producer identity, say) sends the batch down the slower exact path.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

import psycopg

from queen.errors import StoreError
from queen.frames import concat
from queen.model import PartitionKey
from queen.storage import system
from queen.storage.base import SegmentWrite, WriteResult
from queen.storage.pool import ConnectionPool

log = logging.getLogger("queen.storage")

SEP = "\x1f"
_MIGRATION_LOCK = 0x5155_4545_4E00  # "QUEEN\0": one advisory lock id for schema changes

_PUSH_SQL = b"SELECT statuses, originals FROM queen.push_segments($1, $2, $3, $4, $5, $6, $7, $8)"
# The same call in psycopg's placeholder style, for tools that write through psycopg (bench/).
PUSH_SQL_PSYCOPG = re.sub(r"\$\d", "%s", _PUSH_SQL.decode())
_ENSURE_SQL = (
    b"SELECT queen.ensure_partitions(string_to_array($1, chr(31)), string_to_array($2, chr(31)))"
)
_PUSH_ARRAYS_SQL = (
    "SELECT statuses, originals FROM queen.push_frames(%s::bigint[], %s::integer[], "
    "%s::uuid[], %s::text[], %s::text[], %s::text[], %s::uuid[], %s::integer[])"
)

# Applied in this order at every start-up; each file is idempotent. A room of the broker that
# needs tables of its own adds its file here.
SCHEMA_FILES = (
    "schema.sql",
    "system.sql",
    "consume.sql",
    "retention.sql",
    "spool.sql",
    "admin.sql",
    "streams.sql",
)


def schema_sql() -> str:
    files = resources.files("queen.storage")
    return "\n".join(files.joinpath(name).read_text("utf-8") for name in SCHEMA_FILES)


# Tables of the original Queen broker, which also keeps its tables in a schema named "queen".
# None of them is ever one of ours: finding one means the database belongs to that broker.
FOREIGN_TABLES = ("messages", "partition_consumers")


class ForeignSchemaError(StoreError):
    """The database holds another broker's "queen" schema; migrating would damage it."""


def check_foreign_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`ForeignSchemaError` if schema "queen" holds the original broker's tables."""
    rows = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'queen' AND c.relname = ANY(%s) ORDER BY c.relname""",
        (list(FOREIGN_TABLES),),
    ).fetchall()
    if rows:
        found = ", ".join(f"queen.{name}" for (name,) in rows)
        db = conn.info.dbname
        raise ForeignSchemaError(
            f'database "{db}" holds the schema of the original Queen broker (found {found}); '
            'this broker keeps its own tables in a schema named "queen" and cannot share it. '
            "Point DATABASE_URL (or PG_DB) at another database, or rename that schema "
            "(ALTER SCHEMA queen RENAME TO ...) if the original broker no longer uses it. "
            "Nothing was changed."
        )


def schema_digest() -> str:
    """A short hash of the schema this build applies: what ``migrate_sync`` records."""
    return hashlib.sha256(schema_sql().encode()).hexdigest()[:16]


SCHEMA_STATE_KEY = "schema"  # in queen.system_state: {"digest": schema_digest()}


def migrate_sync(conn: psycopg.Connection[Any]) -> None:
    """Create or update the schema; safe to run from several processes at once. The digest
    of the schema applied is recorded (``SCHEMA_STATE_KEY``) for :func:`schema_state`.

    Raises :class:`ForeignSchemaError`, changing nothing, when the database holds the original
    broker's schema."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        check_foreign_schema(conn)
        conn.execute(schema_sql().encode())
        conn.execute(
            """INSERT INTO queen.system_state (key, value, updated_at)
               VALUES (%s, jsonb_build_object('digest', %s::text), now())
               ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = now()
               WHERE queen.system_state.value IS DISTINCT FROM excluded.value""",
            (SCHEMA_STATE_KEY, schema_digest()),
        )


class SchemaState(enum.Enum):
    """What a broker of this build would do with a database's schema at start."""

    ABSENT = "absent"  # no schema "queen": it would create it
    CURRENT = "current"  # this build's schema is applied: nothing to change
    STALE = "stale"  # another build's (or an unrecorded) schema: it would update it
    FOREIGN = "foreign"  # the original broker's tables: it refuses to start


def schema_state(conn: psycopg.Connection[Any]) -> tuple[SchemaState, str]:
    """Read (never change) the schema of ``conn``'s database: its state and a line for an
    operator."""
    row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'queen'").fetchone()
    if row is None:
        return SchemaState.ABSENT, 'no schema "queen" yet: queen serve will create it'
    try:
        check_foreign_schema(conn)
    except ForeignSchemaError as exc:
        return SchemaState.FOREIGN, str(exc)
    ours = schema_digest()
    recorded = None
    if conn.execute("SELECT to_regclass('queen.system_state')").fetchone() not in (None, (None,)):
        found = conn.execute(
            "SELECT value ->> 'digest', updated_at FROM queen.system_state WHERE key = %s",
            (SCHEMA_STATE_KEY,),
        ).fetchone()
        if found is not None:
            recorded = found
    if recorded is not None and recorded[0] == ours:
        return (
            SchemaState.CURRENT,
            f"up to date (schema {ours}, applied {recorded[1]:%Y-%m-%d %H:%M})",
        )
    was = f"schema {recorded[0]}" if recorded is not None else "a schema with no digest recorded"
    return SchemaState.STALE, f"would migrate: the database has {was}, this build applies {ours}"


class PgStore:
    """:class:`queen.storage.base.Store` on PostgreSQL."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.migrated = False

    async def migrate(self) -> None:
        await self.pool.run(migrate_sync)
        self.migrated = True

    async def ping(self) -> None:
        await self.pool.ping()

    async def get_state(self, key: str) -> Any:
        """The JSON value stored under ``key`` in ``queen.system_state``, or None."""
        return await system.get_state(self.pool, key)

    async def set_state(self, key: str, value: Any) -> None:
        await system.set_state(self.pool, key, value)

    async def encrypted_queues(self) -> set[str]:
        """The names of the queues configured with ``encryptionEnabled``."""

        def call(conn: psycopg.Connection[Any]) -> set[str]:
            rows = conn.execute("SELECT name FROM queen.queues WHERE encryption_enabled").fetchall()
            return {str(r[0]) for r in rows}

        return await self.pool.run(call)

    async def ensure_partitions(self, keys: Sequence[PartitionKey]) -> list[int]:
        """The ids of ``keys`` (created if missing), in one round trip."""
        if not keys or any(SEP in k.queue or SEP in k.partition for k in keys):
            return [await self.ensure_partition(k) for k in keys]
        rows = await self.pool.query(
            "queen_ensure_partitions",
            _ENSURE_SQL,
            [
                SEP.join(k.queue for k in keys).encode(),
                SEP.join(k.partition for k in keys).encode(),
            ],
        )
        if not rows or rows[0][0] is None:
            raise StoreError("ensure_partitions returned nothing")
        ids = [int(v) for v in rows[0][0].decode().strip("{}").split(",")]
        if len(ids) != len(keys):
            raise StoreError("ensure_partitions returned a wrong number of ids")
        return ids

    async def ensure_partition(self, key: PartitionKey) -> int:
        def call(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(
                "SELECT queen.ensure_partition(%s, %s)", (key.queue, key.partition)
            ).fetchone()
            if row is None or row[0] is None:
                raise StoreError(f"partition {key.queue}/{key.partition} could not be created")
            return int(row[0])

        return await self.pool.run(call)

    async def write_segments(self, writes: Sequence[SegmentWrite]) -> list[WriteResult]:
        params = _encode(writes)
        if params is not None:
            rows = await self.pool.query(
                "queen_push", _PUSH_SQL, [None if p is None else p.encode() for p in params]
            )
            if not rows or rows[0][0] is None:
                raise StoreError("push_segments returned no outcome")
            found = rows[0][1]
            return _decode(writes, rows[0][0].decode(), found.decode() if found else None)

        def call(conn: psycopg.Connection[Any]) -> tuple[str, str | None]:
            row = conn.execute(_PUSH_ARRAYS_SQL, _encode_arrays(writes)).fetchone()
            if row is None or row[0] is None:
                raise StoreError("push_frames returned no outcome")
            return row[0], row[1]

        statuses, originals = await self.pool.run(call)
        return _decode(writes, statuses, originals)


def _join(values: list[str]) -> str | None:
    """Join with the separator; None if a value contains it (then the exact path is used)."""
    text = SEP.join(values)
    return text if text.count(SEP) == len(values) - 1 else None


def _leaders(writes: Sequence[SegmentWrite]) -> list[int] | None:
    """First-wins positions across the batch (1-based), or None when no write repeats a
    transaction id (the server then takes its fast path)."""
    if all(len(set(w.transaction_ids)) == len(w) for w in writes):
        return None
    leaders: list[int] = []
    base = 1
    for w in writes:
        leaders.extend(base + lead for lead in w.leaders)
        base += len(w)
    return leaders


def _encode(writes: Sequence[SegmentWrite]) -> tuple[str | None, ...] | None:
    """The push_segments arguments, or None if a value holds the separator."""
    frames = concat(writes)
    subs, traces, leaders = frames.producer_subs, frames.trace_ids, _leaders(writes)
    joined_txids = _join(frames.transaction_ids)
    joined_subs = _join([s or "" for s in subs]) if subs is not None else None
    if joined_txids is None or (subs is not None and joined_subs is None):
        return None
    return (
        SEP.join(str(w.partition_id) for w in writes),
        SEP.join(str(len(w)) for w in writes),
        SEP.join(frames.message_ids),
        joined_txids,
        b"\x1f".join(frames.payloads).decode("utf-8"),
        joined_subs,
        SEP.join(t or "" for t in traces) if traces is not None else None,
        SEP.join(map(str, leaders)) if leaders is not None else None,
    )


def _encode_arrays(writes: Sequence[SegmentWrite]) -> tuple[list[Any] | None, ...]:
    """Exact but slow encoding, for batches holding the separator inside a value."""
    frames = concat(writes)
    return (
        [w.partition_id for w in writes],
        [len(w) for w in writes],
        frames.message_ids,
        frames.transaction_ids,
        [p.decode("utf-8") for p in frames.payloads],
        frames.producer_subs,
        frames.trace_ids,
        _leaders(writes),
    )


def _decode(
    writes: Sequence[SegmentWrite], statuses: str, originals: str | None
) -> list[WriteResult]:
    if len(statuses) != sum(len(w) for w in writes):
        raise StoreError("push_segments returned a wrong number of statuses")
    originals_iter = iter(originals.split(",") if originals else ())
    results: list[WriteResult] = []
    start = 0
    for w in writes:
        chunk = statuses[start : start + len(w)]
        start += len(w)
        result = WriteResult()
        if "2" in chunk:
            result.partition_missing = True
        elif "1" in chunk:
            result.duplicates = {
                pos: next(originals_iter) for pos, st in enumerate(chunk) if st == "1"
            }
        results.append(result)
    return results

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
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg
import trio
from psycopg import sql

from queen.errors import QueenError, StoreError
from queen.frames import concat
from queen.model import PartitionKey
from queen.storage import system
from queen.storage.base import STORED, SegmentWrite, WriteResult
from queen.storage.pool import ConnectionPool

log = logging.getLogger("queen.storage")

SEP = "\x1f"
MIGRATION_LOCK = 0x5155_4545_4E00  # "QUEEN\0": one advisory lock id for schema changes

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

# Applied in this order whenever the schema is not this build's (see migrate_once_sync); each
# file is idempotent. A room of the broker that needs tables of its own adds its file here.
SCHEMA_FILES = (
    "schema.sql",
    "system.sql",
    "consume.sql",
    "retention.sql",
    "spool.sql",
    "admin.sql",
    "streams.sql",
    "sql_api.sql",
)


def schema_sql() -> str:
    files = resources.files("queen.storage")
    return "\n".join(files.joinpath(name).read_text("utf-8") for name in SCHEMA_FILES)


# Tables of the original Queen broker, which also keeps its tables in a schema named "queen".
# None of them is ever a table of ours (queen.messages is our view, sql_api.sql): finding one
# as a table means the database belongs to that broker.
FOREIGN_TABLES = ("messages", "partition_consumers")


class ForeignSchemaError(StoreError):
    """The database holds another broker's "queen" schema; migrating would damage it."""


def check_foreign_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`ForeignSchemaError` if schema "queen" holds the original broker's tables."""
    rows = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'queen' AND c.relname = ANY(%s) AND c.relkind IN ('r', 'p')
           ORDER BY c.relname""",
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

# The tables a migration locks first, in the order the push path takes them (cursor rows
# before partition rows, then the partitions' queues, the sidecar and the segments); every
# other table of schema "queen" follows in name order.
_LOCK_ORDER = ("cursors", "partitions", "queues", "dedup", "segments")
MIGRATION_GIVE_UP_S = 60.0  # how long a migration keeps trying to take its tables' locks


class Migration(enum.Enum):
    """What one attempt at migrating did."""

    CURRENT = "current"  # this build's schema was recorded: nothing locked, nothing changed
    APPLIED = "applied"  # the schema was applied and its digest recorded
    BUSY = "busy"  # the tables' locks were not all free in time: nothing changed, try again


class SchemaBusy(StoreError):
    """The migration never got the locks of the schema's tables (long transactions hold
    them); nothing was changed."""


class _TablesBusy(QueenError):
    """The tables' locks were not all free within the bound (the transaction rolls back)."""


def _recorded(conn: psycopg.Connection[Any]) -> tuple[str | None, datetime] | None:
    """The digest recorded in ``system_state`` and when, or None (none recorded)."""
    if conn.execute("SELECT to_regclass('queen.system_state')").fetchone() in (None, (None,)):
        return None
    row = conn.execute(
        "SELECT value ->> 'digest', updated_at FROM queen.system_state WHERE key = %s",
        (SCHEMA_STATE_KEY,),
    ).fetchone()
    return None if row is None else (row[0], row[1])


def migrate_once_sync(conn: psycopg.Connection[Any]) -> Migration:
    """One attempt at bringing the schema to this build's; see :func:`migrate_sync`.

    ``conn`` is in autocommit mode. When the recorded digest is this build's, the schema is
    current and the call ends there: it read the catalog and one row of ``system_state``, and
    took no lock that a push (of any build) waits for. Otherwise, in one transaction: the
    migration's advisory lock (a second process starting meanwhile waits here, holding
    nothing, and then finds the digest current), the original broker's tables looked for, the
    digest read again, then every table of the schema locked ACCESS EXCLUSIVE in one
    statement, those of the push path first, in the order it takes them. That statement may
    last at most half of PostgreSQL's ``deadlock_timeout``. A transaction that waits for one
    of these locks began waiting after the statement started, so its deadlock check comes
    after the statement is over, when the migration either holds every lock it needs (and
    waits for nothing more until it commits) or has rolled back (:attr:`Migration.BUSY`):
    a transaction waiting for the migration (a push of a broker of any build) waits while
    the schema is applied, and is never the one cancelled to break a deadlock with it."""
    if schema_state(conn)[0] is SchemaState.CURRENT:
        return Migration.CURRENT
    ours = schema_digest()
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            check_foreign_schema(conn)
            recorded = _recorded(conn)
            if recorded is not None and recorded[0] == ours:
                return Migration.CURRENT
            _lock_tables(conn)
            conn.execute(schema_sql().encode())
            conn.execute(
                """INSERT INTO queen.system_state (key, value, updated_at)
                   VALUES (%s, jsonb_build_object('digest', %s::text), now())
                   ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = now()
                   WHERE queen.system_state.value IS DISTINCT FROM excluded.value""",
                (SCHEMA_STATE_KEY, ours),
            )
    except _TablesBusy:
        return Migration.BUSY
    log.info("applied the schema (digest %s)", ours)
    return Migration.APPLIED


def _lock_tables(conn: psycopg.Connection[Any]) -> None:
    """Lock every table of schema "queen" ACCESS EXCLUSIVE (in the transaction open on
    ``conn``) within half of ``deadlock_timeout``, or raise :class:`_TablesBusy`."""
    names = [
        str(name)
        for (name,) in conn.execute(
            """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = 'queen' AND c.relkind IN ('r', 'p')
               ORDER BY array_position(%s::text[], c.relname::text), c.relname""",
            (list(_LOCK_ORDER),),
        ).fetchall()
    ]
    if not names:  # a new database: nothing to wait for
        return
    row = conn.execute(
        """SELECT current_setting('statement_timeout'),
                  greatest(1, floor(extract(epoch FROM
                      current_setting('deadlock_timeout')::interval) * 500))::bigint"""
    ).fetchone()
    assert row is not None
    session_timeout, bound_ms = row
    conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{bound_ms}ms",))
    tables = sql.SQL(", ").join(sql.Identifier("queen", name) for name in names)
    try:
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(tables))
    except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
        raise _TablesBusy from exc  # past the bound, or past a lock_timeout of the role
    conn.execute("SELECT set_config('statement_timeout', %s, true)", (session_timeout,))


def migrate_sync(
    conn: psycopg.Connection[Any], *, give_up_s: float = MIGRATION_GIVE_UP_S
) -> Migration:
    """Create or update the schema; safe to run from several processes at once, and while
    brokers push (:func:`migrate_once_sync`). The digest of the schema applied is recorded
    (``SCHEMA_STATE_KEY``) for :func:`schema_state`. Returns what was done.

    Raises :class:`ForeignSchemaError`, changing nothing, when the database holds the original
    broker's schema, and :class:`SchemaBusy` when the tables' locks were never free within
    ``give_up_s``."""
    give_up = time.monotonic() + give_up_s
    for pause in retry_pauses():
        outcome = migrate_once_sync(conn)
        if outcome is not Migration.BUSY:
            return outcome
        if time.monotonic() + pause > give_up:
            break
        time.sleep(pause)
    raise busy_error(give_up_s)


def retry_pauses() -> Iterator[float]:
    """The pauses between attempts at migrating: 50 ms, doubling up to 1 s."""
    pause = 0.05
    while True:
        yield pause
        pause = min(1.0, pause * 2)


def busy_error(give_up_s: float) -> SchemaBusy:
    return SchemaBusy(
        f"could not migrate the schema: its tables stayed locked by other transactions for "
        f"{give_up_s:g} s; nothing was changed"
    )


class SchemaState(enum.Enum):
    """What a broker of this build would do with a database's schema at start."""

    ABSENT = "absent"  # no schema "queen": it would create it
    CURRENT = "current"  # this build's schema is applied: nothing to change
    STALE = "stale"  # another build's (or an unrecorded) schema: it would update it
    FOREIGN = "foreign"  # the original broker's tables: it refuses to start


def server_version(conn: psycopg.Connection[Any]) -> str:
    """The version of ``conn``'s PostgreSQL server, as it reports it ("?" if it does not)."""
    row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


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
    recorded = _recorded(conn)
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

    async def migrate(self, *, give_up_s: float = MIGRATION_GIVE_UP_S) -> Migration:
        """:func:`migrate_sync`, each attempt one call of the pool, the pauses Trio's."""
        give_up = trio.current_time() + give_up_s
        waited = False
        for pause in retry_pauses():
            outcome = await self.pool.run(migrate_once_sync)
            if outcome is not Migration.BUSY:
                self.migrated = True
                return outcome
            if not waited:
                waited = True
                log.info("migrating the schema: its tables are in use; trying again")
            if trio.current_time() + pause > give_up:
                break
            await trio.sleep(pause)
        raise busy_error(give_up_s)

    async def ping(self) -> None:
        await self.pool.ping()

    async def get_state(self, key: str) -> Any:
        """The JSON value stored under ``key`` in ``queen.system_state``, or None."""
        return await system.get_state(self.pool, key)

    async def set_state(self, key: str, value: Any) -> None:
        await system.set_state(self.pool, key, value)

    async def encrypted_queues(self) -> set[str]:
        """The names of the queues configured with ``encryptionEnabled``."""
        rows = await self.pool.fetch_all("SELECT name FROM queen.queues WHERE encryption_enabled")
        return {str(r[0]) for r in rows}

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
        row = await self.pool.fetch_one(
            "SELECT queen.ensure_partition(%s, %s)", (key.queue, key.partition)
        )
        if row is None or row[0] is None:
            raise StoreError(f"partition {key.queue}/{key.partition} could not be created")
        return int(row[0])

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

        row = await self.pool.fetch_one(_PUSH_ARRAYS_SQL, _encode_arrays(writes))
        if row is None or row[0] is None:
            raise StoreError("push_frames returned no outcome")
        return _decode(writes, row[0], row[1])


def _join(values: list[str]) -> str | None:
    """Join with the separator; None if a value contains it (then the exact path is used)."""
    text = SEP.join(values)
    return text if text.count(SEP) == len(values) - 1 else None


def _leaders(writes: Sequence[SegmentWrite], transaction_ids: list[str]) -> list[int] | None:
    """First-wins positions across the batch (1-based), or None when no write repeats a
    transaction id (the server then takes its fast path). ``transaction_ids``: the batch's."""
    if len(set(transaction_ids)) == len(transaction_ids):
        return None  # no id repeats in the whole batch
    columns = [w.transaction_ids for w in writes]
    if list(map(len, map(set, columns))) == list(map(len, columns)):
        return None  # ids repeat across partitions only
    leaders: list[int] = []
    base = 1
    for w in writes:
        leaders.extend([base + lead for lead in w.first_wins()])
        base += len(w.message_ids)
    return leaders


def _encode(writes: Sequence[SegmentWrite]) -> tuple[str | None, ...] | None:
    """The push_segments arguments, or None if a value holds the separator."""
    frames = concat(writes)
    subs, traces = frames.producer_subs, frames.trace_ids
    leaders = _leaders(writes, frames.transaction_ids)
    joined_txids = _join(frames.transaction_ids)
    joined_subs = _join([s or "" for s in subs]) if subs is not None else None
    if joined_txids is None or (subs is not None and joined_subs is None):
        return None
    return (
        SEP.join([str(w.partition_id) for w in writes]),
        SEP.join(map(str, _counts(writes))),
        SEP.join(frames.message_ids),
        joined_txids,
        b"\x1f".join(frames.payloads).decode("utf-8"),
        joined_subs,
        SEP.join([t or "" for t in traces]) if traces is not None else None,
        SEP.join(map(str, leaders)) if leaders is not None else None,
    )


def _counts(writes: Sequence[SegmentWrite]) -> list[int]:
    """The frames of each write."""
    return list(map(len, [w.message_ids for w in writes]))


def _encode_arrays(writes: Sequence[SegmentWrite]) -> tuple[list[Any] | None, ...]:
    """Exact but slow encoding, for batches holding the separator inside a value."""
    frames = concat(writes)
    return (
        [w.partition_id for w in writes],
        _counts(writes),
        frames.message_ids,
        frames.transaction_ids,
        [p.decode("utf-8") for p in frames.payloads],
        frames.producer_subs,
        frames.trace_ids,
        _leaders(writes, frames.transaction_ids),
    )


def _decode(
    writes: Sequence[SegmentWrite], statuses: str, originals: str | None
) -> list[WriteResult]:
    """One result per write from one status per frame ("0" stored, "1" duplicate, "2"
    partition missing) and the ids the duplicates name, in frame order."""
    counts = _counts(writes)
    if len(statuses) != sum(counts):
        raise StoreError("push_segments returned a wrong number of statuses")
    if "1" not in statuses and "2" not in statuses:
        return [STORED] * len(writes)  # the common case: everything stored
    originals_iter = iter(originals.split(",") if originals else ())
    results: list[WriteResult] = []
    start = 0
    for count in counts:
        chunk = statuses[start : start + count]
        start += count
        if "2" in chunk:
            results.append(WriteResult(partition_missing=True))
        elif "1" in chunk:
            found = {pos: next(originals_iter) for pos, st in enumerate(chunk) if st == "1"}
            results.append(WriteResult(found))
        else:
            results.append(STORED)
    return results

"""Every SQL statement of ``queen import``: reading an original Queen database, and writing what
is read into this broker's schema together with the import's own bookkeeping
(``queen/storage/import.sql``).

The original keeps its tables in a schema named ``queen`` too: ``queues`` and ``partitions``
keyed by UUID, one ``messages`` row per message (ordered in a partition by ``(created_at,
id)``), one ``partition_consumers`` row per (partition, consumer group) whose
``(last_consumed_created_at, last_consumed_id)`` is the last message done, the named groups'
subscription starts in ``consumer_groups_metadata``, and ``dead_letter_queue`` rows that point
at their message. Only those tables and columns are read.

The functions take a psycopg connection and are synchronous: the importer is a batch job run
from the command line, reading the source in one read-only snapshot and writing the target in
one transaction per batch (see :mod:`queen.migrate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg

from queen.storage.postgres import migrate_sync

QUEUE_MODE = "__QUEUE_MODE__"
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"

# Tables the importer reads, with the columns it needs of each.
ORIGINAL_COLUMNS: dict[str, tuple[str, ...]] = {
    "queues": ("id", "name"),
    "partitions": ("id", "queue_id", "name"),
    "messages": ("id", "transaction_id", "partition_id", "payload", "created_at"),
    "partition_consumers": (
        "partition_id",
        "consumer_group",
        "last_consumed_id",
        "last_consumed_created_at",
    ),
    "dead_letter_queue": ("id", "message_id", "partition_id", "consumer_group"),
}


# --- values -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DatabaseIdentity:
    """Enough to tell whether two connections reach the same database."""

    system_id: int | None  # pg_control_system(), when the role may read it
    server: str  # address and port the server answered on ("local" over a Unix socket)
    database: str
    database_oid: int

    def same_as(self, other: DatabaseIdentity) -> bool:
        if (self.database, self.database_oid) != (other.database, other.database_oid):
            return False
        if self.system_id is not None and other.system_id is not None:
            return self.system_id == other.system_id
        return self.server == other.server


@dataclass(frozen=True, slots=True)
class OriginalQueue:
    """A queue of the original with its options, in this broker's terms and units."""

    source_id: str
    name: str
    namespace: str
    task: str
    priority: int
    lease_time_s: int
    retry_limit: int
    retry_delay_ms: int
    ttl_s: int
    dead_letter_queue: bool
    dlq_after_max_retries: bool
    delayed_processing_s: int
    window_buffer_s: int
    retention_s: int
    completed_retention_s: int
    retention_enabled: bool
    encryption_enabled: bool
    max_wait_time_s: int
    max_size: int
    created_at: datetime | None


@dataclass(frozen=True, slots=True)
class OriginalPartition:
    source_id: str
    source_queue: str
    name: str
    created_at: datetime | None
    messages: int
    encrypted: int  # messages stored encrypted by the original


@dataclass(frozen=True, slots=True)
class OriginalMessage:
    id: str
    transaction_id: str
    trace_id: str | None
    payload: str  # JSON text
    created_at: datetime
    encrypted: bool
    producer_sub: str | None


@dataclass(frozen=True, slots=True)
class OriginalPosition:
    """One ``partition_consumers`` row: ``done`` messages of the partition (in its order) are
    behind the cursor, None when it never moved; ``retries`` failed deliveries of the batch
    at the cursor."""

    source_partition: str
    consumer_group: str
    done: int | None
    retries: int


@dataclass(frozen=True, slots=True)
class OriginalSubscription:
    """Where a named group starts on a queue (or one partition of it) that it has not
    consumed yet: after every message created up to ``since``."""

    consumer_group: str
    queue: str
    partition: str  # "" for the whole queue
    mode: str
    since: datetime


@dataclass(frozen=True, slots=True)
class OriginalDeadLetter:
    source_id: str
    source_partition: str
    consumer_group: str
    before: int  # messages of the partition ahead of this one: its place in the order
    message: OriginalMessage
    error: str | None
    retry_count: int
    failed_at: datetime | None


@dataclass(frozen=True, slots=True)
class ImportedPartition:
    """What the target holds of one source partition."""

    partition_id: int
    messages: int
    last_created_at: datetime | None
    last_id: str | None


@dataclass(frozen=True, slots=True)
class ImportState:
    """What earlier imports brought over: source queue id -> queue id (present queues only),
    source partition id -> progress, dead letters copied."""

    queues: dict[str, int]
    deleted_queues: frozenset[str]  # imported, then deleted here: left alone
    partitions: dict[str, ImportedPartition]
    deleted_partitions: frozenset[str]  # imported, then deleted here: left alone
    dead_letters: frozenset[str]


@dataclass(frozen=True, slots=True)
class CursorWrite:
    partition_id: int
    queue_id: int
    consumer_group: str
    next_offset: int
    attempts: int  # failed deliveries of the message at next_offset (0: none)


@dataclass(frozen=True, slots=True)
class GroupWrite:
    queue_id: int
    consumer_group: str
    subscription_mode: str  # 'all', 'now' or 'at' (this broker's)
    subscribed_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeadLetterWrite:
    source_id: str
    queue_id: int
    partition_id: int
    consumer_group: str
    msg_offset: int
    message_id: str
    transaction_id: str
    payload: str
    producer_sub: str | None
    trace_id: str | None
    error: str | None
    retry_count: int
    failed_at: datetime | None


@dataclass(frozen=True, slots=True)
class PositionsWritten:
    cursors_written: int  # created or moved
    cursors_kept: int  # moved here since an earlier import: left as they are
    groups: int
    dead_letters: int


class PartitionMoved(Exception):
    """A partition being imported received messages from somewhere else since the import
    began: its remaining messages can no longer be put after the imported ones in order."""


# --- identity and shape -------------------------------------------------------------------


def identity(conn: psycopg.Connection[Any]) -> DatabaseIdentity:
    row = conn.execute(
        """SELECT coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'local'),
                  current_database(),
                  (SELECT d.oid::bigint FROM pg_database d WHERE d.datname = current_database()),
                  has_function_privilege('pg_control_system()', 'EXECUTE')"""
    ).fetchone()
    assert row is not None
    system_id = None
    if row[3]:
        found = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()
        system_id = int(found[0]) if found else None
    return DatabaseIdentity(system_id, str(row[0]), str(row[1]), int(row[2]))


def original_shape_problem(conn: psycopg.Connection[Any]) -> str | None:
    """None when the database holds an original Queen schema the importer can read; else
    what is missing or wrong, in a few words."""
    rows = conn.execute(
        """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
           FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'queen'
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           WHERE c.relkind IN ('r', 'p')"""
    ).fetchall()
    columns: dict[str, dict[str, str]] = {}
    for table, column, kind in rows:
        columns.setdefault(table, {})[column] = kind
    if not columns:
        return 'it has no schema "queen"'
    if "segments" in columns and "messages" not in columns:
        return "it is a Queen on Trio database (queen.segments), not an original Queen database"
    for table, needed in ORIGINAL_COLUMNS.items():
        if table not in columns:
            return f"it has no table queen.{table}"
        missing = [c for c in needed if c not in columns[table]]
        if missing:
            return f"queen.{table} has no column {', '.join(missing)}"
    if columns["queues"]["id"] != "uuid" or columns["messages"]["payload"] != "jsonb":
        return "queen.queues.id is not a uuid or queen.messages.payload is not jsonb"
    return None


# --- reading the original -----------------------------------------------------------------


def open_snapshot(conn: psycopg.Connection[Any]) -> None:
    """Begin the one read-only, repeatable-read transaction every later read runs in, so
    messages, positions and dead letters are read as of one moment."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")


def _int(row: dict[str, Any], key: str, default: int) -> int:
    value = row.get(key)
    return default if value is None else int(value)


def _bool(row: dict[str, Any], key: str) -> bool:
    return bool(row.get(key) or False)


def read_queues(conn: psycopg.Connection[Any]) -> list[OriginalQueue]:
    # to_jsonb: columns added in later versions of the original may be absent.
    rows = conn.execute(
        "SELECT to_jsonb(q), q.created_at FROM queen.queues q ORDER BY q.name"
    ).fetchall()
    queues = []
    for row, created in rows:
        queues.append(
            OriginalQueue(
                source_id=row["id"],
                name=row["name"],
                namespace=row.get("namespace") or "",
                task=row.get("task") or "",
                priority=_int(row, "priority", 0),
                lease_time_s=_int(row, "lease_time", 300),
                retry_limit=_int(row, "retry_limit", 3),
                retry_delay_ms=_int(row, "retry_delay", 1000),
                ttl_s=_int(row, "ttl", 3600),
                dead_letter_queue=_bool(row, "dead_letter_queue"),
                dlq_after_max_retries=_bool(row, "dlq_after_max_retries"),
                delayed_processing_s=_int(row, "delayed_processing", 0),
                window_buffer_s=_int(row, "window_buffer", 0),
                retention_s=_int(row, "retention_seconds", 0),
                completed_retention_s=_int(row, "completed_retention_seconds", 0),
                retention_enabled=_bool(row, "retention_enabled"),
                encryption_enabled=_bool(row, "encryption_enabled"),
                max_wait_time_s=_int(row, "max_wait_time_seconds", 0),
                max_size=_int(row, "max_queue_size", 0),
                created_at=created,
            )
        )
    return queues


def read_partitions(conn: psycopg.Connection[Any]) -> list[OriginalPartition]:
    has_flag = conn.execute(
        """SELECT EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = 'queen.messages'::regclass
                            AND attname = 'is_encrypted' AND NOT attisdropped)"""
    ).fetchone()
    encrypted = "count(*) FILTER (WHERE m.is_encrypted)" if has_flag and has_flag[0] else "0"
    rows = conn.execute(
        f"""SELECT p.id::text, p.queue_id::text, p.name, p.created_at,
                   coalesce(c.n, 0), coalesce(c.e, 0)
            FROM queen.partitions p
            JOIN queen.queues q ON q.id = p.queue_id
            LEFT JOIN LATERAL (SELECT count(*) AS n, {encrypted} AS e
                               FROM queen.messages m WHERE m.partition_id = p.id) c ON true
            ORDER BY q.name, p.name"""
    ).fetchall()
    return [OriginalPartition(r[0], r[1], r[2], r[3], int(r[4]), int(r[5])) for r in rows]


def _message_columns(conn: psycopg.Connection[Any]) -> str:
    present = {
        name
        for (name,) in conn.execute(
            """SELECT attname FROM pg_attribute
               WHERE attrelid = 'queen.messages'::regclass AND attnum > 0 AND NOT attisdropped"""
        ).fetchall()
    }
    trace = "m.trace_id::text" if "trace_id" in present else "NULL::text"
    flag = "coalesce(m.is_encrypted, false)" if "is_encrypted" in present else "false"
    sub = "m.producer_sub" if "producer_sub" in present else "NULL::text"
    return f"m.id::text, m.transaction_id, {trace}, m.payload::text, m.created_at, {flag}, {sub}"


def _message(row: Sequence[Any]) -> OriginalMessage:
    return OriginalMessage(row[0], row[1], row[2], row[3], row[4], bool(row[5]), row[6])


class OriginalReader:
    """Reads one original database inside the snapshot :func:`open_snapshot` began."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._columns = _message_columns(conn)

    def messages_after(
        self, partition: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[OriginalMessage]:
        """Up to ``limit`` messages of ``partition`` following ``after`` (a message's
        ``(created_at, id)``), in the partition's order."""
        since, last = after if after is not None else (None, _ZERO_UUID)
        rows = self.conn.execute(
            f"""SELECT {self._columns} FROM queen.messages m
                WHERE m.partition_id = %s
                  AND (%s::timestamptz IS NULL OR (m.created_at, m.id) > (%s, %s::uuid))
                ORDER BY m.created_at, m.id LIMIT %s""",
            (partition, since, since, last, limit),
        ).fetchall()
        return [_message(r) for r in rows]

    def count_through(self, partition: str, at: tuple[datetime, str]) -> int:
        """How many messages of ``partition`` come at or before ``at`` in its order."""
        row = self.conn.execute(
            """SELECT count(*) FROM queen.messages m
               WHERE m.partition_id = %s AND (m.created_at, m.id) <= (%s, %s::uuid)""",
            (partition, at[0], at[1]),
        ).fetchone()
        return int(row[0]) if row else 0

    def positions(self) -> list[OriginalPosition]:
        rows = self.conn.execute(
            """SELECT pc.partition_id::text, coalesce(pc.consumer_group, %s),
                      CASE WHEN pc.last_consumed_created_at IS NULL THEN NULL
                           ELSE (SELECT count(*) FROM queen.messages m
                                 WHERE m.partition_id = pc.partition_id
                                   AND (m.created_at, m.id)
                                       <= (pc.last_consumed_created_at, pc.last_consumed_id))
                      END,
                      coalesce((to_jsonb(pc) ->> 'batch_retry_count')::integer, 0)
               FROM queen.partition_consumers pc
               WHERE pc.partition_id IS NOT NULL
               ORDER BY 1, 2""",
            (QUEUE_MODE,),
        ).fetchall()
        return [
            OriginalPosition(r[0], r[1], None if r[2] is None else int(r[2]), int(r[3]))
            for r in rows
        ]

    def subscriptions(self) -> list[OriginalSubscription]:
        found = self.conn.execute(
            "SELECT to_regclass('queen.consumer_groups_metadata') IS NOT NULL"
        ).fetchone()
        if not found or not found[0]:
            return []
        rows = self.conn.execute(
            """SELECT consumer_group, queue_name, partition_name, subscription_mode,
                      subscription_timestamp
               FROM queen.consumer_groups_metadata
               WHERE queue_name <> '' AND subscription_timestamp IS NOT NULL
               ORDER BY 1, 2, 3"""
        ).fetchall()
        return [OriginalSubscription(r[0], r[1], r[2] or "", r[3], r[4]) for r in rows]

    def dead_letters(self) -> list[OriginalDeadLetter]:
        rows = self.conn.execute(
            f"""SELECT d.id::text, m.partition_id::text, coalesce(d.consumer_group, %s),
                       (SELECT count(*) FROM queen.messages x
                        WHERE x.partition_id = m.partition_id
                          AND (x.created_at, x.id) < (m.created_at, m.id)),
                       d.error_message, coalesce(d.retry_count, 0), d.failed_at,
                       {self._columns}
                FROM queen.dead_letter_queue d
                JOIN queen.messages m ON m.id = d.message_id
                ORDER BY d.failed_at, d.id""",
            (QUEUE_MODE,),
        ).fetchall()
        return [
            OriginalDeadLetter(
                source_id=r[0],
                source_partition=r[1],
                consumer_group=r[2],
                before=int(r[3]),
                error=r[4],
                retry_count=int(r[5]),
                failed_at=r[6],
                message=_message(r[7:]),
            )
            for r in rows
        ]

    def subscriptions_through(self, wanted: Sequence[tuple[str, datetime]]) -> list[int]:
        """For each (partition, time): how many of its messages were created up to that
        time (a subscription's start), in input order."""
        if not wanted:
            return []
        rows = self.conn.execute(
            """SELECT (SELECT count(*) FROM queen.messages m
                       WHERE m.partition_id = u.p
                         AND (m.created_at, m.id) <= (u.t, %s::uuid))
               FROM unnest(%s::uuid[], %s::timestamptz[]) WITH ORDINALITY AS u (p, t, o)
               ORDER BY u.o""",
            (_ZERO_UUID, [p for p, _ in wanted], [t for _, t in wanted]),
        ).fetchall()
        return [int(r[0]) for r in rows]


# --- the target ---------------------------------------------------------------------------


def prepare_target(conn: psycopg.Connection[Any]) -> None:
    """This broker's schema (:func:`migrate_sync`, which refuses an original's database) and
    the import's bookkeeping tables."""
    migrate_sync(conn)
    sql = resources.files("queen.storage").joinpath("import.sql").read_text("utf-8")
    with conn.transaction():
        conn.execute(sql.encode())


def import_state(conn: psycopg.Connection[Any]) -> ImportState:
    """What earlier imports brought over; empty when none ran (nothing is created here, so
    a dry run can call it)."""
    found = conn.execute("SELECT to_regclass('queen.imported_dead_letters') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return ImportState({}, frozenset(), {}, frozenset(), frozenset())
    queues: dict[str, int] = {}
    deleted: set[str] = set()
    for source, queue_id, present in conn.execute(
        """SELECT i.source_queue::text, i.queue_id,
                  EXISTS (SELECT 1 FROM queen.queues q WHERE q.id = i.queue_id)
           FROM queen.imported_queues i"""
    ).fetchall():
        if present:
            queues[source] = int(queue_id)
        else:
            deleted.add(source)
    partitions: dict[str, ImportedPartition] = {}
    gone: set[str] = set()
    for r in conn.execute(
        """SELECT i.source_partition::text, i.partition_id, i.messages, i.last_created_at,
                  i.last_id::text,
                  EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = i.partition_id)
           FROM queen.imported_partitions i"""
    ).fetchall():
        if r[5]:
            partitions[r[0]] = ImportedPartition(int(r[1]), int(r[2]), r[3], r[4])
        else:
            gone.add(r[0])
    letters = frozenset(
        r[0]
        for r in conn.execute("SELECT source_id::text FROM queen.imported_dead_letters").fetchall()
    )
    return ImportState(queues, frozenset(deleted), partitions, frozenset(gone), letters)


def existing_queues(conn: psycopg.Connection[Any], names: Sequence[str]) -> dict[str, int]:
    """Queues of these names the target holds already: name -> id."""
    found = conn.execute("SELECT to_regclass('queen.queues') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return {}
    rows = conn.execute(
        "SELECT name, id FROM queen.queues WHERE name = ANY (%s)", (list(names),)
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def create_queue(conn: psycopg.Connection[Any], q: OriginalQueue, dedup_window_s: int) -> int:
    """Create the queue with its options and remember where it came from; its id."""
    with conn.transaction():
        row = conn.execute(
            """INSERT INTO queen.queues (
                   name, namespace, task, dedup_window_seconds, lease_time_s, retry_limit,
                   retry_delay_ms, max_size, ttl_s, dead_letter_queue, dlq_after_max_retries,
                   priority, delayed_processing_s, window_buffer_s, retention_s,
                   completed_retention_s, retention_enabled, max_wait_time_s,
                   encryption_enabled, created_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
                       %s, coalesce(%s, now()))
               RETURNING id""",
            (
                q.name,
                q.namespace,
                q.task,
                dedup_window_s,
                q.lease_time_s,
                q.retry_limit,
                q.retry_delay_ms,
                q.max_size,
                q.ttl_s,
                q.dead_letter_queue,
                q.dlq_after_max_retries,
                q.priority,
                q.delayed_processing_s,
                q.window_buffer_s,
                q.retention_s,
                q.completed_retention_s,
                q.retention_enabled,
                q.max_wait_time_s,
                q.encryption_enabled,
                q.created_at,
            ),
        ).fetchone()
        assert row is not None
        conn.execute(
            "INSERT INTO queen.imported_queues (source_queue, queue_id) VALUES (%s, %s)",
            (q.source_id, row[0]),
        )
        return int(row[0])


def create_partition(conn: psycopg.Connection[Any], queue_id: int, p: OriginalPartition) -> int:
    """Create the partition and its progress row; its id."""
    with conn.transaction():
        row = conn.execute(
            """INSERT INTO queen.partitions (queue_id, name, created_at)
               VALUES (%s, %s, coalesce(%s, now()))
               ON CONFLICT (queue_id, name) DO UPDATE SET name = EXCLUDED.name
               RETURNING id, next_offset""",
            (queue_id, p.name, p.created_at),
        ).fetchone()
        assert row is not None
        if row[1] != 0:
            raise PartitionMoved(f"partition {p.name!r} already holds messages here")
        conn.execute(
            """INSERT INTO queen.imported_partitions (source_partition, partition_id)
               VALUES (%s, %s)""",
            (p.source_id, row[0]),
        )
        return int(row[0])


SEP = "\x1f"

# One statement stores a batch: the frame columns arrive whole (joined by chr(31), split by the
# server: far cheaper than adapting Python lists element by element), the segments as
# (start, count, time) and cut out of them as slices; the dedup sidecar rows of the frames
# inside the window come from the same slices.
_BATCH_SQL = """
WITH cols AS (
    SELECT {mids} AS mids, {txs} AS txs, {payloads} AS payloads, {subs} AS subs,
           {traces} AS traces
),
seg AS (
    SELECT * FROM unnest(%(lo)s::integer[], %(cnt)s::integer[], %(at)s::timestamptz[],
                         %(has_sub)s::boolean[], %(has_trace)s::boolean[])
                  AS s (lo, cnt, at, has_sub, has_trace)
),
stored AS (
    INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at,
                                message_ids, transaction_ids, payloads, producer_subs,
                                trace_ids)
    SELECT %(pid)s, %(base)s + s.lo, %(base)s + s.lo + s.cnt - 1, s.at,
           c.mids[s.lo + 1 : s.lo + s.cnt], c.txs[s.lo + 1 : s.lo + s.cnt],
           c.payloads[s.lo + 1 : s.lo + s.cnt],
           CASE WHEN s.has_sub THEN c.subs[s.lo + 1 : s.lo + s.cnt] END,
           CASE WHEN s.has_trace THEN c.traces[s.lo + 1 : s.lo + s.cnt] END
    FROM seg s CROSS JOIN cols c
)
INSERT INTO queen.dedup (key_hash, partition_id, transaction_id, msg_offset, created_at)
SELECT hashtextextended(t.tx, %(pid)s), %(pid)s, t.tx, %(base)s + s.lo + t.i - 1, s.at
FROM seg s CROSS JOIN cols c
CROSS JOIN LATERAL unnest(c.txs[s.lo + 1 : s.lo + s.cnt]) WITH ORDINALITY AS t (tx, i)
WHERE %(win)s > 0 AND s.at > now() - make_interval(secs => %(win)s)
"""
_JOINED = _BATCH_SQL.format(
    mids="string_to_array(%(mids)s, chr(31))::uuid[]",
    txs="string_to_array(%(txs)s, chr(31))",
    payloads="string_to_array(%(payloads)s, chr(31))",
    subs="string_to_array(%(subs)s, chr(31), '')",
    traces="string_to_array(%(traces)s, chr(31), '')::uuid[]",
)
_ARRAYS = _BATCH_SQL.format(
    mids="%(mids)s::uuid[]",
    txs="%(txs)s::text[]",
    payloads="%(payloads)s::text[]",
    subs="%(subs)s::text[]",
    traces="%(traces)s::uuid[]",
)


def _columns(
    messages: Sequence[OriginalMessage], payloads: Sequence[str]
) -> tuple[str, dict[str, Any]]:
    """The statement and its frame columns: joined texts, or (a value holding the separator,
    or an empty producer identity, which the joined form reads as none) lists."""
    mids = [m.id for m in messages]
    txs = [m.transaction_id for m in messages]
    subs = [m.producer_sub for m in messages]
    traces = [m.trace_id for m in messages]
    texts = [*txs, *payloads, *(x for x in subs if x is not None)]
    if any(SEP in t for t in texts) or "" in subs:
        return _ARRAYS, {
            "mids": mids,
            "txs": txs,
            "payloads": list(payloads),
            "subs": subs,
            "traces": traces,
        }
    return _JOINED, {
        "mids": SEP.join(mids),
        "txs": SEP.join(txs),
        "payloads": SEP.join(payloads),
        "subs": SEP.join(x or "" for x in subs),
        "traces": SEP.join(x or "" for x in traces),
    }


def write_messages(
    conn: psycopg.Connection[Any],
    *,
    partition_id: int,
    source_partition: str,
    messages: Sequence[OriginalMessage],
    payloads: Sequence[str],
    dedup_window_s: int,
    segment_frames: int = 1000,
) -> None:
    """Append ``messages`` (the next ones of the source partition, in its order; their stored
    payloads in ``payloads``) to the partition in one transaction, together with the import's
    progress: after a kill the partition holds whole batches only, and the progress row says
    which. Messages created together (one push of the original) share a segment, whose time
    is their creation time. Dedup sidecar rows are written for the messages still inside the
    queue's window, with their creation time, so a producer retrying an old send after the
    switch still gets ``duplicate``.

    Raises :class:`PartitionMoved` when the partition holds messages the import did not put
    there (its offsets would no longer follow the source's order)."""
    if not messages:
        return
    lo: list[int] = []
    cnt: list[int] = []
    at: list[datetime] = []
    has_sub: list[bool] = []
    has_trace: list[bool] = []
    start = 0
    for end in range(1, len(messages) + 1):
        if (
            end == len(messages)
            or messages[end].created_at != messages[start].created_at
            or end - start >= segment_frames
        ):
            run = messages[start:end]
            lo.append(start)
            cnt.append(end - start)
            at.append(run[0].created_at)
            has_sub.append(any(m.producer_sub is not None for m in run))
            has_trace.append(any(m.trace_id is not None for m in run))
            start = end
    sql, params = _columns(messages, payloads)
    with conn.transaction():
        row = conn.execute(
            """SELECT p.next_offset, i.messages
               FROM queen.partitions p
               JOIN queen.imported_partitions i ON i.partition_id = p.id
               WHERE p.id = %s AND i.source_partition = %s
               FOR UPDATE OF p, i""",
            (partition_id, source_partition),
        ).fetchone()
        if row is None or row[0] != row[1]:
            raise PartitionMoved(
                "it holds messages stored here since the import began"
                if row is not None
                else "it was deleted here"
            )
        conn.execute(
            sql,
            {
                **params,
                "pid": partition_id,
                "base": int(row[0]),
                "win": dedup_window_s,
                "lo": lo,
                "cnt": cnt,
                "at": at,
                "has_sub": has_sub,
                "has_trace": has_trace,
            },
        )
        last = messages[-1]
        conn.execute(
            "UPDATE queen.partitions SET next_offset = next_offset + %s WHERE id = %s",
            (len(messages), partition_id),
        )
        conn.execute(
            """UPDATE queen.imported_partitions
               SET messages = messages + %s, last_created_at = %s, last_id = %s
               WHERE source_partition = %s""",
            (len(messages), last.created_at, last.id, source_partition),
        )


def write_positions(
    conn: psycopg.Connection[Any],
    groups: Sequence[GroupWrite],
    cursors: Sequence[CursorWrite],
    dead_letters: Sequence[DeadLetterWrite],
) -> PositionsWritten:
    """In one transaction: the named groups' subscriptions (kept if present), the cursors
    (created where the group has none and never had one from an import; moved where the
    import's last position is still untouched; otherwise left as this broker moved them),
    the pending failure counts at the cursors written, and the dead letters not copied yet.
    No lease is written: every message that was leased is delivered again."""
    with conn.transaction():
        made = 0
        for g in groups:
            made += conn.execute(
                """INSERT INTO queen.consumer_groups (queue_id, consumer_group,
                                                      subscription_mode, subscribed_at)
                   VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING""",
                (g.queue_id, g.consumer_group, g.subscription_mode, g.subscribed_at),
            ).rowcount
        written = kept = 0
        for c in cursors:
            row = conn.execute(
                """SELECT c.next_offset, c.acked = '{}' AND c.lease_id IS NULL
                          AND c.delivered_at IS NULL AND c.not_before IS NULL,
                          i.next_offset
                   FROM (SELECT 1) one
                   LEFT JOIN queen.cursors c
                          ON c.partition_id = %(p)s AND c.consumer_group = %(g)s
                   LEFT JOIN queen.imported_cursors i
                          ON i.partition_id = %(p)s AND i.consumer_group = %(g)s""",
                {"p": c.partition_id, "g": c.consumer_group},
            ).fetchone()
            assert row is not None
            current, untouched, imported = row
            if current is None and imported is None:
                conn.execute(
                    """INSERT INTO queen.cursors (partition_id, consumer_group, queue_id,
                                                  next_offset)
                       VALUES (%s, %s, %s, %s)""",
                    (c.partition_id, c.consumer_group, c.queue_id, c.next_offset),
                )
            elif current is not None and untouched and current == imported:
                if current == c.next_offset:
                    continue
                conn.execute(
                    """UPDATE queen.cursors SET next_offset = %s
                       WHERE partition_id = %s AND consumer_group = %s""",
                    (c.next_offset, c.partition_id, c.consumer_group),
                )
                conn.execute(
                    """DELETE FROM queen.failures
                       WHERE partition_id = %s AND consumer_group = %s""",
                    (c.partition_id, c.consumer_group),
                )
            else:
                kept += 1
                continue
            written += 1
            conn.execute(
                """INSERT INTO queen.imported_cursors (partition_id, consumer_group, next_offset)
                   VALUES (%s, %s, %s)
                   ON CONFLICT (partition_id, consumer_group)
                   DO UPDATE SET next_offset = EXCLUDED.next_offset""",
                (c.partition_id, c.consumer_group, c.next_offset),
            )
            if c.attempts > 0:
                conn.execute(
                    """INSERT INTO queen.failures (partition_id, consumer_group, msg_offset,
                                                   queue_id, attempts)
                       VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
                    (c.partition_id, c.consumer_group, c.next_offset, c.queue_id, c.attempts),
                )
        letters = 0
        for d in dead_letters:
            row = conn.execute(
                """WITH ins AS (
                       INSERT INTO queen.dlq (queue_id, partition_id, consumer_group, msg_offset,
                                              message_id, transaction_id, payload, producer_sub,
                                              trace_id, error_message, retry_count, failed_at)
                       SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
                              coalesce(%s, clock_timestamp())
                       WHERE NOT EXISTS (SELECT 1 FROM queen.imported_dead_letters x
                                         WHERE x.source_id = %s)
                       RETURNING id)
                   INSERT INTO queen.imported_dead_letters (source_id, dlq_id)
                   SELECT %s, ins.id FROM ins
                   RETURNING dlq_id""",
                (
                    d.queue_id,
                    d.partition_id,
                    d.consumer_group,
                    d.msg_offset,
                    d.message_id,
                    d.transaction_id,
                    d.payload,
                    d.producer_sub,
                    d.trace_id,
                    d.error,
                    d.retry_count,
                    d.failed_at,
                    d.source_id,
                    d.source_id,
                ),
            ).fetchone()
            letters += row is not None
        conn.execute("SELECT queen.refresh_statistics()")
    return PositionsWritten(written, kept, made, letters)

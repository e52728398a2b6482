"""Reading an original Queen database, for ``queen import``.

The original keeps its tables in a schema named ``queen`` too: ``queues`` and ``partitions``
keyed by UUID, one ``messages`` row per message (ordered in a partition by ``(created_at,
id)``), one ``partition_consumers`` row per (partition, consumer group) whose
``(last_consumed_created_at, last_consumed_id)`` is the last message done, the named groups'
subscription starts in ``consumer_groups_metadata``, and ``dead_letter_queue`` rows that point
at their message. Only those tables and columns are read, with synchronous psycopg calls, in
one read-only snapshot (:func:`open_snapshot`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from queen.storage.import_records import (
    QUEUE_MODE,
    DatabaseIdentity,
    OriginalDeadLetter,
    OriginalMessage,
    OriginalPartition,
    OriginalPosition,
    OriginalQueue,
    OriginalSubscription,
)

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

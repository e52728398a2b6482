"""Writing what ``queen import`` copies into this broker's schema, together with the import's
own bookkeeping (``queen/storage/import.sql``): synchronous psycopg calls, one transaction per
batch of messages and one for the positions (see :mod:`queen.migrate`). Reading the original
is :mod:`queen.storage.original`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg

from queen.storage.import_records import (
    CursorWrite,
    DeadLetterWrite,
    GroupWrite,
    ImportedPartition,
    ImportState,
    OriginalMessage,
    OriginalPartition,
    OriginalQueue,
    PartitionMoved,
    PositionsWritten,
)
from queen.storage.postgres import migrate_sync


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
    served: set[str] = set()
    for r in conn.execute(
        """SELECT i.source_partition::text, i.partition_id, i.messages, i.last_created_at,
                  i.last_id::text, p.next_offset
           FROM queen.imported_partitions i
           LEFT JOIN queen.partitions p ON p.id = i.partition_id"""
    ).fetchall():
        if r[5] is not None:
            partitions[r[0]] = ImportedPartition(int(r[1]), int(r[2]), r[3], r[4])
            if int(r[5]) != int(r[2]):
                served.add(r[0])
        else:
            gone.add(r[0])
    served_new = frozenset(
        (r[0], r[1])
        for r in conn.execute(
            """SELECT i.source_queue::text, p.name
               FROM queen.imported_queues i
               JOIN queen.partitions p ON p.queue_id = i.queue_id
               WHERE p.next_offset > 0
                 AND NOT EXISTS (SELECT 1 FROM queen.imported_partitions x
                                 WHERE x.partition_id = p.id)"""
        ).fetchall()
    )
    letters = frozenset(
        r[0]
        for r in conn.execute("SELECT source_id::text FROM queen.imported_dead_letters").fetchall()
    )
    return ImportState(
        queues,
        frozenset(deleted),
        partitions,
        frozenset(gone),
        letters,
        frozenset(served),
        served_new,
    )


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

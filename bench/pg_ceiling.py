"""The PostgreSQL ceiling: the broker's rows written by a plain psycopg loop, nothing else.

No HTTP, no actors, no batcher, no Trio. ``connections`` threads (by default as many as the
broker keeps push transactions in flight) each own one connection and one queue of
``shape.partitions`` partitions, so they never wait for each other's row locks, and write
batches shaped like the broker's requests: ``shape.items`` frames, item ``n`` in partition
``n % partitions``, ~100-byte JSON payloads, unique transactionIds, UUIDv7 ids from
:func:`queen.ids.mint_ids`. A batch is one segment row per partition it touches (parallel
arrays) plus one dedup sidecar row per frame. :data:`VARIANTS` says how each variant writes
and commits them (``fn``: the broker's own statement, encoded by its own encoder).
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.procfs import Meter
from bench.scenarios import PgShape
from bench.servers import Database
from queen.ids import mint_ids
from queen.storage.base import SegmentWrite

# The broker's statement and column encoding, so "the same rows" means the same bytes sent.
from queen.storage.postgres import PUSH_SQL_PSYCOPG, SEP, _encode

VARIANTS: dict[str, str] = {
    "fn": "queen.push_segments per batch, one commit per batch",
    "fn-group": "G push_segments calls in one transaction",
    "fn-merged": "G batches packed into one push_segments call (one segment per partition)",
    "insert": "plain INSERT segments + sidecar, UPDATE next_offset, one commit per batch",
    "insert-group": "plain INSERTs of G batches in one transaction",
}

_INSERT_SEGMENTS = """
INSERT INTO queen.segments (partition_id, first_offset, last_offset, message_ids,
                            transaction_ids, payloads)
SELECT s.pid, s.first_off, s.last_off, string_to_array(s.mids, chr(31))::uuid[],
       string_to_array(s.txids, chr(31)), string_to_array(s.payloads, chr(31))
FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::text[], %s::text[], %s::text[])
     AS s(pid, first_off, last_off, mids, txids, payloads)
"""
_INSERT_SIDECAR = """
INSERT INTO queen.dedup (key_hash, partition_id, transaction_id, msg_offset)
SELECT hashtextextended(d.txid, d.pid), d.pid, d.txid, d.off
FROM unnest(string_to_array(%s, chr(31))::bigint[], string_to_array(%s, chr(31)),
            string_to_array(%s, chr(31))::bigint[]) AS d(pid, txid, off)
"""
_BUMP_OFFSETS = """
UPDATE queen.partitions p SET next_offset = u.next
FROM unnest(%s::bigint[], %s::bigint[]) AS u(pid, next) WHERE p.id = u.pid
"""


class _Writer:
    """One connection writing one queue's partitions in a loop (runs in its own thread)."""

    def __init__(
        self, db: Database, shape: PgShape, variant: str, group: int, queue: str, tag: str
    ) -> None:
        self.shape, self.group, self.tag = shape, group, tag
        self.conn = db.connect()
        self.pids = [
            int(self._one("SELECT queen.ensure_partition(%s, %s)", (queue, f"p{i}")))
            for i in range(shape.partitions)
        ]
        self.offsets = dict.fromkeys(self.pids, 0)
        rows = self.conn.execute(
            "SELECT id, next_offset FROM queen.partitions WHERE id = ANY(%s)", (self.pids,)
        ).fetchall()
        self.offsets.update({int(pid): int(off) for pid, off in rows})
        self.write: Callable[[list[list[SegmentWrite]]], int] = getattr(
            self, "_" + variant.replace("-", "_")
        )
        self.next_batch = self.frames = self.batches = self.commits = 0
        self.error: BaseException | None = None

    def _one(self, sql: str, params: tuple[Any, ...]) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        assert row is not None
        return row[0]

    def batch(self) -> list[SegmentWrite]:
        """The next batch: one write per partition it touches, frames in item order."""
        k = self.next_batch
        self.next_batch += 1
        items = self.shape.items
        ids = mint_ids(items)
        writes: dict[int, SegmentWrite] = {}
        for i in range(items):
            n = k * items + i
            pid = self.pids[n % self.shape.partitions]
            w = writes.get(pid)
            if w is None:
                w = writes[pid] = SegmentWrite(pid, [], [], [], [])
            w.leaders.append(len(w.message_ids))
            w.message_ids.append(ids[i])
            w.transaction_ids.append(f"{self.tag}-{n}")
            w.payloads.append(
                b'{"orderId":%d,"total":4200,"customer":"cust-%03d",'
                b'"note":"benchmark payload, about one hundred bytes"}' % (n, n % 997)
            )
        return list(writes.values())

    def loop(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                batches = [self.batch() for _ in range(self.group)]
                self.frames += self.write(batches)
                self.batches += len(batches)
                self.commits += 1
        except BaseException as exc:
            self.error = exc
        finally:
            self.conn.close()

    # --- variants: each writes its batches and commits once, returning the frames stored

    def _call(self, writes: list[SegmentWrite]) -> psycopg.Cursor[Any]:
        params = _encode(writes)
        if params is None:
            raise RuntimeError("a benchmark value holds the column separator")
        return self.conn.execute(PUSH_SQL_PSYCOPG, params, prepare=True)

    @staticmethod
    def _stored(cursor: psycopg.Cursor[Any]) -> int:
        row = cursor.fetchone()
        if row is None or row[0] is None:
            raise RuntimeError("push_segments returned nothing")
        return str(row[0]).count("0")

    def _fn(self, batches: list[list[SegmentWrite]]) -> int:
        return self._stored(self._call(batches[0]))

    def _fn_group(self, batches: list[list[SegmentWrite]]) -> int:
        with self.conn.pipeline():
            with self.conn.transaction():
                cursors = [self._call(writes) for writes in batches]
            return sum(self._stored(c) for c in cursors)

    def _fn_merged(self, batches: list[list[SegmentWrite]]) -> int:
        merged: dict[int, SegmentWrite] = {}
        for writes in batches:
            for w in writes:
                into = merged.get(w.partition_id)
                if into is None:
                    merged[w.partition_id] = SegmentWrite(
                        w.partition_id, [*w.message_ids], [*w.transaction_ids], [*w.payloads], []
                    )
                else:
                    into.message_ids.extend(w.message_ids)
                    into.transaction_ids.extend(w.transaction_ids)
                    into.payloads.extend(w.payloads)
        for w in merged.values():
            w.leaders = list(range(len(w.message_ids)))
        return self._stored(self._call(list(merged.values())))

    def _insert(self, batches: list[list[SegmentWrite]]) -> int:
        seg: tuple[list[Any], ...] = ([], [], [], [], [], [])
        side_pids: list[str] = []
        side_txids: list[str] = []
        side_offs: list[str] = []
        touched: dict[int, int] = {}
        for writes in batches:
            for w in writes:
                first = self.offsets[w.partition_id]
                n = len(w)
                self.offsets[w.partition_id] = touched[w.partition_id] = first + n
                seg[0].append(w.partition_id)
                seg[1].append(first)
                seg[2].append(first + n - 1)
                seg[3].append(SEP.join(w.message_ids))
                seg[4].append(SEP.join(w.transaction_ids))
                seg[5].append(b"\x1f".join(w.payloads).decode())
                side_pids.extend([str(w.partition_id)] * n)
                side_txids.extend(w.transaction_ids)
                side_offs.extend(str(first + j) for j in range(n))
        with self.conn.pipeline(), self.conn.transaction():
            self.conn.execute(_INSERT_SEGMENTS, seg, prepare=True)
            self.conn.execute(
                _INSERT_SIDECAR,
                (SEP.join(side_pids), SEP.join(side_txids), SEP.join(side_offs)),
                prepare=True,
            )
            self.conn.execute(_BUMP_OFFSETS, (list(touched), list(touched.values())), prepare=True)
        return len(side_pids)

    _insert_group = _insert


def run_pg_ceiling(
    db: Database,
    shape: PgShape,
    variant: str,
    *,
    seconds: float,
    warmup_s: float,
    group: int,
    connections: int,
    queue_prefix: str,
    tag: str,
) -> dict[str, Any]:
    """Write for ``warmup_s`` + ``seconds``; count what committed during ``seconds``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown PostgreSQL ceiling variant {variant!r}")
    g = group if variant.endswith(("-group", "-merged")) else 1
    writers = [
        _Writer(db, shape, variant, g, f"{queue_prefix}{shape.name.lower()}-{variant}-{t}", tag)
        for t in range(connections)
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=w.loop, args=(stop,), daemon=True) for w in writers]
    for t in threads:
        t.start()

    def counts() -> list[int]:
        return [sum(getattr(w, k) for w in writers) for k in ("frames", "batches", "commits")]

    try:
        time.sleep(warmup_s)
        before, meter = counts(), Meter(db.postmaster_pid)
        time.sleep(seconds)
        (frames, batches, commits), window = map(operator.sub, counts(), before), meter.stop()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    for w in writers:
        if w.error is not None:
            raise RuntimeError(f"PostgreSQL ceiling {shape.name}/{variant} failed: {w.error}")
    wall = window["wall_s"]
    return {
        "shape": shape.name,
        "variant": variant,
        "items_per_batch": shape.items,
        "partitions": shape.partitions,
        "group": g,  # batches per commit
        "connections": connections,
        "seconds": wall,
        "frames": frames,
        "batches": batches,
        "commits": commits,
        "msg_per_s": frames / wall,
        "commits_per_s": commits / wall,
        "db_cpu_s": window["db_cpu_s"],
        "client_cpu_s": window["server_cpu_s"],  # this process: the writers
    }

"""The PostgreSQL ceiling (docs/benchmark.md): the broker's rows written by a plain psycopg loop.
``connections`` threads each own one connection and one queue (no waiting on each other's row
locks) and put ``group`` batches in one call of the broker's own statement, encoded by its own
encoder, one commit per call: ``fn-merged``, as the report and the targets call it."""

from __future__ import annotations

import operator
import threading
import time
from typing import Any

import orjson

from bench.inproc import item
from bench.scenarios import PgShape
from bench.servers import Database, Meter
from queen.ids import mint_ids
from queen.storage.base import SegmentWrite

# The broker's statement and column encoding, so "the same rows" means the same bytes sent.
from queen.storage.postgres import PUSH_SQL_PSYCOPG, _encode

VARIANT = "fn-merged"
ABOUT = "G batches packed into one push_segments call (one segment per partition)"


class _Writer:
    """One connection writing one queue's partitions in a loop (runs in its own thread)."""

    def __init__(self, db: Database, shape: PgShape, group: int, queue: str, tag: str) -> None:
        self.shape, self.group, self.tag = shape, group, tag
        self.conn = db.connect()
        ensure = "SELECT queen.ensure_partition(%s, %s)"
        self.pids = [
            int(self.conn.execute(ensure, (queue, f"p{i}")).fetchall()[0][0])
            for i in range(shape.partitions)
        ]
        self.sent = self.frames = self.commits = 0
        self.error: BaseException | None = None

    def writes(self) -> list[SegmentWrite]:
        """The next ``group`` batches as one write per partition, frames in item order."""
        count = self.shape.items * self.group
        first, self.sent = self.sent, self.sent + count
        writes: dict[int, SegmentWrite] = {}
        for n, message_id in zip(range(first, first + count), mint_ids(count), strict=True):
            pid = self.pids[n % self.shape.partitions]
            w = writes.get(pid)
            if w is None:
                w = writes[pid] = SegmentWrite(pid, [], [], [])
            pushed = item("", self.shape.partitions, n, self.tag)
            w.message_ids.append(message_id)
            w.transaction_ids.append(pushed["transactionId"])
            w.payloads.append(orjson.dumps(pushed["payload"]))
        for w in writes.values():
            w.leaders = list(range(len(w)))  # every frame a first occurrence
        return list(writes.values())

    def loop(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                params = _encode(self.writes())
                if params is None:
                    raise RuntimeError("a benchmark value holds the column separator")
                row = self.conn.execute(PUSH_SQL_PSYCOPG, params, prepare=True).fetchone()
                if row is None or row[0] is None:
                    raise RuntimeError("push_segments returned nothing")
                self.frames += str(row[0]).count("0")  # one "0" (stored) per frame
                self.commits += 1
        except BaseException as exc:
            self.error = exc
        finally:
            self.conn.close()


def run_pg_ceiling(
    db: Database,
    shape: PgShape,
    *,
    seconds: float,
    warmup_s: float,
    group: int,
    connections: int,
    queue_prefix: str,
    tag: str,
) -> dict[str, Any]:
    """Write for ``warmup_s`` + ``seconds``; count what committed during ``seconds``."""
    prefix = f"{queue_prefix}{shape.name.lower()}-{VARIANT}"
    writers = [_Writer(db, shape, group, f"{prefix}-{t}", tag) for t in range(connections)]
    stop = threading.Event()
    threads = [threading.Thread(target=w.loop, args=(stop,), daemon=True) for w in writers]
    for t in threads:
        t.start()

    def counts() -> list[int]:
        return [sum(getattr(w, k) for w in writers) for k in ("frames", "commits")]

    try:
        time.sleep(warmup_s)
        before, meter = counts(), Meter(db.postmaster_pid)
        time.sleep(seconds)
        (frames, commits), window = map(operator.sub, counts(), before), meter.stop()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    for w in writers:
        if w.error is not None:
            raise RuntimeError(f"PostgreSQL ceiling {shape.name}/{VARIANT} failed: {w.error}")
    wall = window["wall_s"]
    return {
        "shape": shape.name,
        "variant": VARIANT,
        "items_per_batch": shape.items,
        "partitions": shape.partitions,
        "group": group,  # batches per commit
        "connections": connections,
        "seconds": wall,
        "frames": frames,
        "batches": commits * group,
        "commits": commits,
        "msg_per_s": frames / wall,
        "commits_per_s": commits / wall,
        "db_cpu_s": window["db_cpu_s"],
        "client_cpu_s": window["server_cpu_s"],  # this process: the writers
    }

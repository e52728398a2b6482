"""What waiting pops cost a pusher: ``python -m bench.waiting_pops``.

One ``queen serve`` per step on one embedded PostgreSQL; wrk pushes 1 item per request on 8
connections over 10 partitions of one queue for ``--duration`` seconds, alone or while
``--pops`` long polls wait on as many other, empty queues (each a client that asks again as
soon as it is answered: ``wait=true&timeout=20000&batch=10&autoAck=true``). The figures per
step: pushes per second, and the broker's and PostgreSQL's CPU per push request.

``--idle`` measures the polls alone instead: for 10 s with nothing pushed, the database
transactions, broker CPU and PostgreSQL CPU they cost.

``--trees A,B`` runs the broker from each of those source trees in turn (a checkout of
another commit, say), alternating them step by step, so a before/after comparison comes from
one run on one database. Nothing here is part of the test suite: it prints figures.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.scenarios import Load
from bench.servers import ROOT, Database, Server, open_database, start_broker
from bench.wrk import ensure_wrk, run_wrk

PUSH = Load(1, 8, 10)
IDLE_S = 10.0


def waiting_pops(base: str, queues: list[str], stop: threading.Event) -> list[threading.Thread]:
    def one(queue: str) -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            while not stop.is_set():
                try:
                    http.get(
                        f"/api/v1/pop/queue/{queue}",
                        params={
                            "wait": "true",
                            "timeout": "20000",
                            "batch": "10",
                            "autoAck": "true",
                        },
                    )
                except httpx.HTTPError:
                    if not stop.is_set():
                        time.sleep(0.1)

    threads = [threading.Thread(target=one, args=(q,), daemon=True) for q in queues]
    for t in threads:
        t.start()
    return threads


@contextlib.contextmanager
def polled_broker(
    tree: Path, pops: int, db: Database, workdir: Path, name: str
) -> Iterator[Server]:
    """One broker process from ``tree``, with ``pops`` long polls waiting on as many empty
    queues of their own; stopped, polls and all, on the way out."""
    server = start_broker(db, workers=1, workdir=workdir, name=name, tree=tree)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        server.wait_ready()
        queues = [f"wp-{name}-idle-{i}" for i in range(pops)]
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            for q in queues:  # the queues exist and are empty
                http.post("/api/v1/configure", json={"queue": q})
        threads = waiting_pops(server.base_url, queues, stop)
        time.sleep(2.0)  # every poll has made its first look and waits
        yield server
    finally:
        stop.set()
        server.stop()
        for t in threads:
            t.join(timeout=1)


def _cpu_delta(
    before: tuple[float, float | None], after: tuple[float, float | None]
) -> tuple[float, float | None]:
    """Broker and PostgreSQL CPU seconds between two readings (PostgreSQL: None if remote)."""
    pg = None if before[1] is None or after[1] is None else after[1] - before[1]
    return after[0] - before[0], pg


def _cpu(server: Server, db: Database) -> tuple[float, float | None]:
    return server.cpu_s(), db.cpu_s()


def push_step(
    tree: Path, pops: int, db: Database, workdir: Path, wrk: str, seconds: float, name: str
) -> str:
    with polled_broker(tree, pops, db, workdir, name) as server:
        queue = f"wp-{name}-pushed"
        run_wrk(wrk, server.base_url, PUSH, seconds=2, queue=queue, tag=f"{name}-w")
        before = _cpu(server, db)
        report, _ = run_wrk(wrk, server.base_url, PUSH, seconds=seconds, queue=queue, tag=name)
        broker_s, pg_s = _cpu_delta(before, _cpu(server, db))
    n = max(1, report.ok_requests)
    pg = "-" if pg_s is None else f"{pg_s / n * 1e6:,.0f}"
    return (
        f"{pops:>3} pops waiting  {report.requests_per_s:>7,.0f} push/s  "
        f"broker {broker_s / n * 1e6:>6,.0f} µs/push  PostgreSQL {pg} µs/push"
    )


def idle_step(tree: Path, pops: int, db: Database, workdir: Path, name: str) -> str:
    with polled_broker(tree, pops, db, workdir, name) as server:
        x0, before = _commits(db), _cpu(server, db)
        time.sleep(IDLE_S)
        x1, (broker_s, pg_s) = _commits(db), _cpu_delta(before, _cpu(server, db))
    pg = "-" if pg_s is None else f"{pg_s:.2f} s"
    transactions = x1 - x0 - 1  # less the one that read the first count
    return (
        f"{pops} pops waiting {IDLE_S:g} s, nothing pushed: {transactions} transactions, "
        f"broker {broker_s:.2f} s CPU, PostgreSQL {pg}"
    )


def _commits(db: Database) -> int:
    with db.connect() as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pops", type=int, default=40, help="long polls on other, empty queues")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per step")
    p.add_argument("--rounds", type=int, default=2, help="steps per tree and variant")
    p.add_argument("--trees", default=str(ROOT), help="comma-separated source trees")
    p.add_argument("--idle", action="store_true", help="the polls alone, nothing pushed")
    args = p.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    wrk = "" if args.idle else ensure_wrk()
    variants = [args.pops] if args.idle else [0, args.pops]
    workdir = Path(tempfile.mkdtemp(prefix="queen-wp-"))
    try:
        with open_database(None, workdir) as db:
            print(f"database: {db.description}, {db.version}")
            for rnd in range(args.rounds):
                for pops in variants:
                    for k, tree in enumerate(trees):
                        name = f"r{rnd}-p{pops}-t{k}-{secrets.token_hex(2)}"
                        if args.idle:
                            line = idle_step(tree, pops, db, workdir, name)
                        else:
                            line = push_step(tree, pops, db, workdir, wrk, args.duration, name)
                        print(f"{tree.name:>12}  {line}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

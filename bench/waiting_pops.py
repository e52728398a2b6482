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
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.scenarios import Load
from bench.servers import ROOT, Database, Server, free_port, open_database
from bench.wrk import ensure_wrk, run_wrk

PUSH = Load(1, 8, 10)


def start(tree: Path, db: Database, workdir: Path, name: str) -> Server:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "QUEEN_WORKER_ID"}
    env.update(
        {
            "DATABASE_URL": db.conninfo,
            "QUEEN_HOST": "127.0.0.1",
            "QUEEN_PORT": str(port),
            "QUEEN_WORKERS": "1",
            "FILE_BUFFER_DIR": str(workdir / f"spool-{name}"),
            "QUEEN_LOG_LEVEL": "warning",
            "PYTHONPATH": str(tree),
        }
    )
    log = workdir / f"{name}.log"
    argv = [sys.executable, "-m", "queen.cli", "serve"]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, env=env, cwd=tree, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    return Server(f"broker ({name})", [proc], port, 1, log)


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


def step(
    tree: Path, pops: int, db: Database, workdir: Path, wrk: str, seconds: float, name: str
) -> dict[str, Any]:
    server = start(tree, db, workdir, name)
    stop = threading.Event()
    try:
        server.wait_ready()
        queues = [f"wp-{name}-idle-{i}" for i in range(pops)]
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            for q in queues:  # the queues exist and are empty
                http.post("/api/v1/configure", json={"queue": q})
        threads = waiting_pops(server.base_url, queues, stop)
        time.sleep(2.0)  # every poll has made its first look and waits
        queue = f"wp-{name}-pushed"
        run_wrk(wrk, server.base_url, PUSH, seconds=2, queue=queue, tag=f"{name}-w")
        broker0, pg0 = server.cpu_s(), db.cpu_s()
        report, _ = run_wrk(wrk, server.base_url, PUSH, seconds=seconds, queue=queue, tag=name)
        broker1, pg1 = server.cpu_s(), db.cpu_s()
        stop.set()
    finally:
        server.stop()
    for t in threads:
        t.join(timeout=1)
    n = max(1, report.ok_requests)
    return {
        "push_per_s": report.requests_per_s,
        "broker_us": (broker1 - broker0) / n * 1e6,
        "pg_us": (pg1 - pg0) / n * 1e6 if pg0 is not None and pg1 is not None else None,
    }


def idle_step(tree: Path, pops: int, db: Database, workdir: Path, name: str) -> dict[str, Any]:
    server = start(tree, db, workdir, name)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        server.wait_ready()
        queues = [f"wp-{name}-idle-{i}" for i in range(pops)]
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            for q in queues:
                http.post("/api/v1/configure", json={"queue": q})
        threads = waiting_pops(server.base_url, queues, stop)
        time.sleep(3.0)  # every poll has made its first look and waits
        x0, broker0, pg0 = _commits(db), server.cpu_s(), db.cpu_s()
        time.sleep(10.0)
        x1, broker1, pg1 = _commits(db), server.cpu_s(), db.cpu_s()
        stop.set()
    finally:
        server.stop()
    for t in threads:
        t.join(timeout=1)
    return {
        "transactions": x1 - x0 - 1,  # less the one that read the first count
        "broker_s": broker1 - broker0,
        "pg_s": pg1 - pg0 if pg0 is not None and pg1 is not None else None,
    }


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
    wrk = ensure_wrk()
    workdir = Path(tempfile.mkdtemp(prefix="queen-wp-"))
    rows: list[tuple[str, int, dict[str, Any]]] = []
    try:
        with open_database(None, workdir) as db:
            print(f"database: {db.description}, {db.version}")
            for rnd in range(args.rounds) if args.idle else ():
                for k, tree in enumerate(trees):
                    name = f"r{rnd}-idle-t{k}-{secrets.token_hex(2)}"
                    got = idle_step(tree, args.pops, db, workdir, name)
                    pg = "-" if got["pg_s"] is None else f"{got['pg_s']:.2f} s"
                    print(
                        f"{tree.name:>12}  {args.pops} pops waiting 10 s, nothing pushed: "
                        f"{got['transactions']} transactions, broker {got['broker_s']:.2f} s CPU,"
                        f" PostgreSQL {pg}",
                        flush=True,
                    )
            for rnd in range(0 if args.idle else args.rounds):
                for pops in (0, args.pops):
                    for k, tree in enumerate(trees):
                        name = f"r{rnd}-p{pops}-t{k}-{secrets.token_hex(2)}"
                        got = step(tree, pops, db, workdir, wrk, args.duration, name)
                        rows.append((tree.name, pops, got))
                        pg = "-" if got["pg_us"] is None else f"{got['pg_us']:,.0f}"
                        print(
                            f"{tree.name:>12}  {pops:>3} pops waiting  "
                            f"{got['push_per_s']:>7,.0f} push/s  broker {got['broker_us']:>6,.0f}"
                            f" µs/push  PostgreSQL {pg} µs/push",
                            flush=True,
                        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

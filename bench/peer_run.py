"""The peer run: every peer shape on the original and on ours, alternating (original, ours,
original, ours, ...), each step a fresh server on a fresh database of one PostgreSQL server.

    ./bench/run.sh --peer                               # every shape, 2 rounds
    ./bench/run.sh --peer --peer-shapes S1,PIPE --rounds 3 --duration 10
    ./bench/run.sh --peer --pg-bin /usr/lib/postgresql/15/bin --write-results

Only the ratios of one alternating run mean much on a shared machine: its speed drifts by up
to a half within minutes, and alternation spreads the drift over both servers.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from bench import machine, peer, peer_consume, peer_report, pipeline
from bench.peer_consume import HttpConsume
from bench.peer_measure import Meter, per_100k
from bench.peer_report import CEILINGS, SIDES
from bench.pipeline import PipelineShape
from bench.scenarios import Load
from bench.servers import (
    Database,
    Server,
    open_database,
    start_broker,
    start_http_ceiling,
    start_hypercorn_floor,
)
from bench.wrk import WrkReport, ensure_wrk, run_wrk, wrk_version
from queen.settings import Settings

HERE = Path(__file__).resolve().parent
# At the push shapes, besides SIDES, the HTTP stack alone (CEILINGS), with ours' process count
# and no database: "stack" is our Quart-Trio app and serving layer answering the push without a
# broker (bench.http_ceiling), "hypercorn" a bare ASGI callable on Hypercorn
# (bench.hypercorn_floor).

PUSH: dict[str, Load] = {
    "S1": Load(1, 64, 100),
    "S2": Load(10, 32, 100),
    "S3": Load(100, 32, 10),
}
CONSUME: dict[str, HttpConsume] = {
    c.name: c
    for c in (
        HttpConsume("C1", 100_000, 100, 8, 100),
        HttpConsume("C2", 10_000, 10_000, 8, 10),
        HttpConsume("C3", 100_000, 100, 8, 100, groups=3),
    )
}
PIPELINE = PipelineShape()
SHAPES = [*PUSH, *CONSUME, PIPELINE.name]


def describe(name: str) -> str:
    if name in PUSH:
        return f"push (wrk): {PUSH[name].describe()}"
    if name in CONSUME:
        return f"consume over HTTP: {CONSUME[name].describe()}"
    return PIPELINE.describe()


def select(names: str) -> list[str]:
    if names.strip().lower() == "all":
        return list(SHAPES)
    chosen = [n.strip().upper() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in SHAPES]
    if unknown or not chosen:
        raise ValueError(f"unknown peer shapes {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    return [n for n in SHAPES if n in chosen]


@dataclass(slots=True)
class PeerOptions:
    shapes: list[str]
    rounds: int = 2
    duration_s: float = 25.0
    warmup_s: float = 5.0
    pipeline_s: float = 60.0
    pipeline_warmup_s: float = 15.0
    wrk_threads: int = 1
    database_url: str | None = None
    pg_bin: Path | None = None
    ours_workers: int = 0  # queen serve's default: one process per core
    ceilings: bool = True  # the push shapes' HTTP stack alone (CEILINGS)


class PeerRun:
    def __init__(self, options: PeerOptions, *, log: Callable[[str], None] = print) -> None:
        self.options = options
        self.log = log
        self.run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)
        self.wrk = ""
        self.skipped: dict[str, str] = {}
        self.steps: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def _usable(self) -> list[str]:
        shapes = list(self.options.shapes)
        if any(s in PUSH for s in shapes):
            self.wrk = ensure_wrk()
        if PIPELINE.name in shapes:
            reason = pipeline.missing()
            if reason is None:
                try:
                    pipeline.prepare(self.log)
                except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                    reason = f"the pipeline could not be prepared: {exc}"
            if reason is not None:
                self.skipped[PIPELINE.name] = reason
                self.log(f"skipping {PIPELINE.name}: {reason}")
                shapes.remove(PIPELINE.name)
        return shapes

    def execute(self) -> dict[str, Any]:
        o = self.options
        shapes = self._usable()
        started = datetime.now(UTC)
        before = machine.describe()
        total = sum(len(self._sides(name)) for name in shapes) * o.rounds
        self.log(f"peer benchmark {self.run_id}: {total} steps ({', '.join(shapes)})")
        workdir = Path(tempfile.mkdtemp(prefix="queen-peer-"))
        failed = True
        try:
            with open_database(o.database_url, workdir, tcp=True, bin_dir=o.pg_bin) as server:
                self.log(f"database: {server.description}, {server.version}")
                number = 0
                for name in shapes:
                    for rnd in range(o.rounds):
                        for side in self._sides(name):
                            number += 1
                            self.log(f"[{number}/{total}] {name} {side} (round {rnd + 1})")
                            record = self._step(name, side, rnd, server, workdir)
                            self.steps.setdefault(name, {}).setdefault(side, []).append(record)
                            self.log("      " + peer_report.step_line(name, record))
                database = {
                    "description": server.description,
                    "version": server.version,
                    "settings": server.settings,
                    "cpu_measured": server.postmaster_pid is not None,
                }
            failed = False
        finally:
            if failed:
                self.log(f"logs of the servers are kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        return {
            "format": 1,
            "kind": "peer",
            "run_id": self.run_id,
            "started_at": started.isoformat(timespec="seconds"),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "options": {
                "shapes": shapes,
                "rounds": o.rounds,
                "duration_s": o.duration_s,
                "warmup_s": o.warmup_s,
                "pipeline_s": o.pipeline_s,
                "pipeline_warmup_s": o.pipeline_warmup_s,
                "wrk_threads": o.wrk_threads,
                "ours_workers": o.ours_workers,
                "ours_processes": ours_processes(o.ours_workers),
                "ceilings": o.ceilings,
            },
            "machine": before,
            "load_average_after": [round(v, 2) for v in os.getloadavg()],
            "wrk": wrk_version(self.wrk) if self.wrk else "not used",
            "database": database,
            "original": _original(),
            "broker_env": {
                k: v
                for k, v in sorted(os.environ.items())
                if k.startswith("QUEEN_") and k not in ("DATABASE_URL", "QUEEN_WORKER_ID")
            },
            "skipped": self.skipped,
            "shapes": {
                name: {"description": describe(name), "steps": self.steps.get(name, {})}
                for name in shapes
            },
        }

    def _sides(self, name: str) -> tuple[str, ...]:
        return SIDES + CEILINGS if name in PUSH and self.options.ceilings else SIDES

    # --- one step ---------------------------------------------------------------------------

    def _step(
        self, name: str, side: str, rnd: int, server_db: Database, workdir: Path
    ) -> dict[str, Any]:
        o = self.options
        dbname = f"peer_{name.lower()}_{rnd + 1}_{side}"
        if side in CEILINGS:
            return self._ceiling(name, side, dbname, server_db, workdir)
        with peer.fresh_database(server_db, dbname) as db:
            if side == "original":
                server = peer.start_original(db, workdir=workdir, name=dbname)
            else:
                server = start_broker(db, workers=o.ours_workers, workdir=workdir, name=dbname)
            try:
                server.wait_ready()
                meter = Meter(server, server_db, dbname)
                if name in PUSH:
                    record = self._push(name, server, meter, dbname)
                    record["stored"] = peer.stored_messages(db, side == "original")
                elif name in CONSUME:
                    record = self._consume(name, server, meter, dbname)
                else:
                    record = self._pipeline(server, meter, workdir)
            finally:
                server.stop()
        return record

    def _ceiling(
        self, name: str, side: str, label: str, server_db: Database, workdir: Path
    ) -> dict[str, Any]:
        """The push shape against the HTTP stack alone (no broker, no database)."""
        processes = ours_processes(self.options.ours_workers)
        start = start_http_ceiling if side == "stack" else start_hypercorn_floor
        server = start(workers=processes, workdir=workdir, name=label)
        try:
            server.wait_ready()
            return self._push(name, server, Meter(server, server_db, label), label)
        finally:
            server.stop()

    def _push(self, name: str, server: Server, meter: Meter, tag: str) -> dict[str, Any]:
        o, load = self.options, PUSH[name]
        queue = f"peer-{name.lower()}"
        tag = f"{self.run_id}-{tag}"

        def wrk(seconds: float, suffix: str) -> WrkReport:
            report, _ = run_wrk(
                self.wrk,
                server.base_url,
                load,
                seconds=seconds,
                queue=queue,
                tag=tag + suffix,
                threads=o.wrk_threads,
            )
            return report

        warm = wrk(o.warmup_s, "-w")
        meter.start()
        report = wrk(o.duration_s, "-m")
        window = meter.stop()
        messages = report.ok_requests * load.items
        record: dict[str, Any] = {
            "msg_per_s": messages / report.duration_s if report.duration_s else 0.0,
            "requests_per_s": report.requests_per_s,
            "latency_ms": {
                "p50": report.percentiles_ms.get("50"),
                "p99": report.percentiles_ms.get("99"),
                "max": report.latency_max_ms,
            },
            "errors": report.non_2xx + sum(report.socket_errors.values()),
            "answered": (warm.ok_requests + report.ok_requests) * load.items,
            "messages": messages,
            **window,
        }
        per_100k(record, messages)
        return record

    def _consume(self, name: str, server: Server, meter: Meter, tag: str) -> dict[str, Any]:
        shape = CONSUME[name]
        queue = f"peer-{name.lower()}"
        trio.run(peer_consume.fill, server.base_url, queue, shape, f"{self.run_id}-{tag}")
        meter.start()
        record = trio.run(peer_consume.drain, server.base_url, queue, shape)
        record.update(meter.stop())
        per_100k(record, record["messages"])
        return record

    def _pipeline(self, server: Server, meter: Meter, workdir: Path) -> dict[str, Any]:
        o = self.options
        record = pipeline.run(
            server.base_url,
            PIPELINE,
            seconds=o.pipeline_s,
            warmup_s=o.pipeline_warmup_s,
            workdir=workdir,
            start=meter.start,
            stop=meter.stop,
        )
        record.update(peer_report.pipeline_figures(record["summary"]))
        per_100k(record, record["pushed"])
        return record


def ours_processes(workers: int) -> int:
    """How many processes ``queen serve`` runs with ``--workers workers`` (0: its default)."""
    return Settings(database_url="memory://").with_changes(workers=workers).processes()


def _original() -> dict[str, Any]:
    path = peer.binary()
    head = subprocess.run(
        ["git", "-C", str(pipeline.repo()), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "binary": str(path),
        "built": datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds"),
        "mirror_head": head.stdout.strip() or None,
        "settings": dict(peer.SETTINGS),
    }


def options(args: argparse.Namespace) -> PeerOptions:
    if (
        args.rounds <= 0
        or args.duration <= 0
        or args.pipeline_duration <= 0
        or args.ours_workers < 0
    ):
        raise ValueError(
            "--rounds, --duration and --pipeline-duration must be positive, --ours-workers "
            "0 or more"
        )
    return PeerOptions(
        shapes=select(args.peer_shapes),
        rounds=args.rounds,
        duration_s=args.duration,
        warmup_s=max(0.0, args.warmup),
        pipeline_s=args.pipeline_duration,
        pipeline_warmup_s=max(0.0, args.pipeline_warmup),
        wrk_threads=args.wrk_threads,
        database_url=os.environ.get("DATABASE_URL") or None,
        pg_bin=args.pg_bin,
        ours_workers=args.ours_workers,
        ceilings=not args.no_http_ceiling,
    )


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``./bench/run.sh --peer ...`` (parsed by :mod:`bench.cli`)."""
    if args.render:
        doc = json.loads(args.render.read_text())
    else:
        reason = peer.missing()
        if reason is not None:
            print(f"bench: {reason}; skipping the peer shapes")
            return 0
        doc = PeerRun(options(args), log=lambda line: print(line, flush=True)).execute()
        doc["command"] = shlex.join(["./bench/run.sh", *argv])
        output = args.output or HERE / "results" / f"peer-{doc['run_id']}.json"
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nresults: {output}")
    print()
    print(peer_report.terminal(doc))
    if args.write_results:
        path: Path = args.write_results
        existing = path.read_text() if path.exists() else None
        path.write_text(peer_report.merge(existing, doc))
        print(f"written: {path}")
    return 0

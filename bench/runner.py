"""One benchmark run: the plan (each ceiling beside the first scenario it bounds), the steps
(each wrk run measured by :func:`bench.measure.measure`), and the results document (a
JSON-ready dict) that :mod:`bench.report` renders."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import counters, machine
from bench.measure import Window, measure, per_100k, window_record
from bench.pg_ceiling import VARIANTS, run_pg_ceiling
from bench.scenarios import (
    CONSUME,
    EMBEDDED,
    HTTP_CEILINGS,
    PG_SHAPES,
    SCENARIOS,
    AnyScenario,
    ConsumeLoad,
    Embedded,
    Load,
)
from bench.servers import (
    Database,
    Server,
    drop_queues,
    open_database,
    start_broker,
    start_http_ceiling,
    vacuum,
)
from bench.wrk import WrkReport, run_wrk, wrk_version

COVER_LIMIT_S = 120.0  # longest extra warm-up spent giving every partition its actor
CONSUME_STEP_S = 60.0  # rough length of a consume step (fill and drain), for the estimate
INPROC_LIMIT_S = 900.0  # an in-process step that takes longer is stopped and reported


@dataclass(slots=True)
class Options:
    scenarios: list[AnyScenario]
    duration_s: float = 25.0
    warmup_s: float = 5.0
    http_ceilings: bool = True
    pg_ceilings: bool = True
    pg_duration_s: float = 10.0
    pg_warmup_s: float = 2.0
    pg_group: int = 10
    pg_connections: int = 2
    pg_variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    wrk_threads: int = 1
    database_url: str | None = None
    keep_data: bool = False


@dataclass(slots=True)
class Step:
    kind: str  # "http", "broker", "embedded", "consume" or "pg"
    name: str  # ceiling, scenario or PostgreSQL shape name
    variant: str = ""

    def label(self) -> str:
        if self.kind == "http":
            return f"{self.name} HTTP ceiling"
        if self.kind == "pg":
            return f"{self.name} PostgreSQL ceiling {self.variant}"
        if self.kind == "embedded":
            return f"{self.name} embedding API"
        if self.kind == "consume":
            return f"{self.name} consume"
        return f"{self.name} broker"


def plan(options: Options) -> list[Step]:
    """Each ceiling runs once, next to the first scenario it bounds."""
    steps: list[Step] = []
    seen: set[str] = set()
    for s in options.scenarios:
        if isinstance(s, ConsumeLoad):
            steps.append(Step("consume", s.name))
            continue
        if isinstance(s, Embedded):
            steps.append(Step("embedded", s.name))
        else:
            if options.http_ceilings and s.http not in seen:
                seen.add(s.http)
                steps.append(Step("http", s.http))
            steps.append(Step("broker", s.name))
        if options.pg_ceilings and s.pg not in seen:
            seen.add(s.pg)
            steps.extend(Step("pg", s.pg, v) for v in options.pg_variants)
    return steps


def estimate_s(steps: list[Step], options: Options) -> float:
    per_wrk = options.warmup_s + options.duration_s + 4
    per_pg = options.pg_warmup_s + options.pg_duration_s + 1
    per_kind = {"pg": per_pg, "consume": CONSUME_STEP_S}
    return sum(per_kind.get(st.kind, per_wrk) for st in steps) + 5


class Run:
    """Carries one run from the first step to the results document."""

    def __init__(self, options: Options, wrk: str, *, log: Callable[[str], None] = print) -> None:
        self.options = options
        self.wrk = wrk
        self.log = log
        self.run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)
        self.queue_prefix = f"qbench-{self.run_id}-"
        self.http: dict[str, dict[str, Any]] = {}
        self.pg: dict[str, dict[str, dict[str, Any]]] = {}
        self.scenarios: dict[str, dict[str, Any]] = {}
        self.embedded: dict[str, dict[str, Any]] = {}
        self.consume: dict[str, dict[str, Any]] = {}

    def execute(self) -> dict[str, Any]:
        options = self.options
        steps = plan(options)
        started = datetime.now(UTC)
        machine_before = machine.describe()
        self.log(
            f"queen benchmark {self.run_id}: {len(steps)} steps, about "
            f"{estimate_s(steps, options) / 60:.0f} min"
        )
        workdir = Path(tempfile.mkdtemp(prefix="queen-bench-"))
        failed = True
        try:
            with open_database(options.database_url, workdir) as db:
                self.log(f"database: {db.description}, {db.version}")
                try:
                    for number, step in enumerate(steps, 1):
                        self.log(f"[{number}/{len(steps)}] {self._announce(step)}")
                        self.log("      " + self._step(step, db, workdir))
                        if not options.keep_data:
                            # Every step starts from the same, empty database: what one step
                            # stored (millions of sidecar rows) must not slow the next one.
                            drop_queues(db, self.queue_prefix)
                            vacuum(db)
                finally:
                    if options.database_url is not None and not options.keep_data:
                        drop_queues(db, self.queue_prefix)
                database = {
                    "description": db.description,
                    "version": db.version,
                    "settings": db.settings,
                    "cpu_measured": db.postmaster_pid is not None,
                }
            failed = False
        finally:
            if failed:
                self.log(f"logs of the servers are kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        self._compare()
        return {
            "format": 1,
            "run_id": self.run_id,
            "started_at": started.isoformat(timespec="seconds"),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "options": {
                "scenarios": [s.name for s in options.scenarios],
                "duration_s": options.duration_s,
                "warmup_s": options.warmup_s,
                "pg_duration_s": options.pg_duration_s,
                "pg_warmup_s": options.pg_warmup_s,
                "pg_group": options.pg_group,
                "pg_connections": options.pg_connections,
                "wrk_threads": options.wrk_threads,
            },
            "machine": machine_before,
            "load_average_after": [round(v, 2) for v in os.getloadavg()],
            "wrk": wrk_version(self.wrk) if self.wrk else "not used",
            "database": database,
            "broker_env": _queen_env(),
            "http_ceilings": self.http,
            "pg_ceilings": self.pg,
            "scenarios": self.scenarios,
            "embedded": self.embedded,
            "consume": self.consume,
        }

    # --- steps -------------------------------------------------------------------------------

    def _announce(self, step: Step) -> str:
        o = self.options
        if step.kind == "pg":
            what = f"{PG_SHAPES[step.name].describe()}: {VARIANTS[step.variant]}"
            what = what.replace(" G ", f" {o.pg_group} ")
            timing = f"{o.pg_warmup_s:g} s warm-up + {o.pg_duration_s:g} s"
        elif step.kind == "embedded":
            what = EMBEDDED[step.name].describe()
            timing = f"{o.warmup_s:g} s warm-up + {o.duration_s:g} s"
        elif step.kind == "consume":
            return f"{step.label()}: {CONSUME[step.name].describe()}"
        else:
            source = HTTP_CEILINGS[step.name] if step.kind == "http" else SCENARIOS[step.name]
            what = source.describe()
            timing = f"{o.warmup_s:g} s warm-up + {o.duration_s:g} s"
        return f"{step.label()}: {what} ({timing})"

    def _step(self, step: Step, db: Database, workdir: Path) -> str:
        if step.kind == "http":
            return self._http(step.name, db, workdir)
        if step.kind == "broker":
            return self._broker(step.name, db, workdir)
        if step.kind in ("embedded", "consume"):
            return self._inproc(step, db, workdir)
        return self._pg(step.name, step.variant, db)

    def _wrk_pair(
        self, server: Server, db: Database, load: Load, name: str, processes: int
    ) -> Window:
        """Warm up, then measure, each with a transactionId space of its own."""
        o = self.options
        queue = self.queue_prefix + name.lower()
        tag = f"{self.run_id}-{name}"
        if o.warmup_s > 0:
            warm, _ = run_wrk(
                self.wrk,
                server.base_url,
                load,
                seconds=o.warmup_s,
                queue=queue,
                tag=tag + "-w",
                threads=o.wrk_threads,
            )
            if processes:
                self._cover_partitions(server, load, queue, tag, warm, processes)
        return measure(
            server,
            db,
            self.wrk,
            load,
            seconds=o.duration_s,
            queue=queue,
            tag=tag + "-m",
            threads=o.wrk_threads,
            broker_processes=processes,
        )

    def _cover_partitions(
        self, server: Server, load: Load, queue: str, tag: str, warm: WrkReport, processes: int
    ) -> None:
        """Warm up on until (nearly) every partition has an actor, so the window measures
        the steady state rather than the creation of partitions (S4 has 10,000)."""
        deadline = time.monotonic() + COVER_LIMIT_S
        sent = warm.requests
        chunk = 1
        while True:
            snapshot = counters.fetch_metrics(server.base_url, processes)
            active = sum(v.get("queen_actors_active", 0.0) for v in snapshot.values())
            missing = load.partitions - active
            left = deadline - time.monotonic()
            if missing <= load.partitions * 0.01 or left <= 1:
                return
            per_s = max(1.0, warm.requests_per_s * min(load.items, load.partitions))
            seconds = min(left, missing / per_s * 1.2 + 1)
            self.log(
                f"      warm-up: {active:,.0f} of {load.partitions:,} partitions have an "
                f"actor; {seconds:.0f} s more"
            )
            warm, _ = run_wrk(
                self.wrk,
                server.base_url,
                load,
                seconds=seconds,
                queue=queue,
                tag=f"{tag}-w{chunk}",
                threads=self.options.wrk_threads,
                start=sent,
            )
            sent += warm.requests
            chunk += 1

    def _http(self, name: str, db: Database, workdir: Path) -> str:
        ceiling = HTTP_CEILINGS[name]
        server = start_http_ceiling(workers=ceiling.workers, workdir=workdir, name=name)
        try:
            server.wait_ready()
            win = self._wrk_pair(server, db, ceiling.load, name, 0)
        finally:
            server.stop()
        record = {"description": ceiling.describe(), "workers": ceiling.workers}
        record.update(window_record(win, ceiling.load))
        self.http[name] = record
        return _summary(record)

    def _broker(self, name: str, db: Database, workdir: Path) -> str:
        s = SCENARIOS[name]
        server = start_broker(db, workers=s.workers, workdir=workdir, name=name)
        try:
            server.wait_ready()
            win = self._wrk_pair(server, db, s.load, name, s.workers)
        finally:
            server.stop()
        record: dict[str, Any] = {
            "description": s.describe(),
            "note": s.note,
            "workers": s.workers,
            "http_ceiling": s.http,
            "pg_shape": s.pg,
        }
        record.update(window_record(win, s.load))
        figures = counters.push_figures(win.counters or {})
        record.update(
            {
                "counters": dataclasses.asdict(figures),
                "requests_per_tx": figures.requests_per_tx,
                "partitions_per_tx": figures.partitions_per_tx,
                "frames_per_tx": figures.frames_per_tx,
                "actors_active": win.actors_active,
            }
        )
        if figures.items > 0:  # CPU per message the broker actually took in during the window
            record["server_cpu_s_per_100k"] = per_100k(win.server_cpu_s, figures.items)
            record["db_cpu_s_per_100k"] = per_100k(win.db_cpu_s, figures.items)
        self.scenarios[name] = record
        text = _summary(record)
        if figures.requests_per_tx is not None:
            text += (
                f"  req/tx {figures.requests_per_tx:.1f}"
                f"  part/tx {figures.partitions_per_tx or 0:.1f}"
            )
        if figures.failed:
            text += f"  FAILED ITEMS {figures.failed:,.0f}"
        return text

    def _inproc(self, step: Step, db: Database, workdir: Path) -> str:
        """An E or C step in a process of its own (:mod:`bench.inproc`)."""
        o = self.options
        argv = [
            sys.executable,
            "-m",
            "bench.inproc",
            step.name,
            "--database-url",
            db.conninfo,
            "--duration",
            str(o.duration_s),
            "--warmup",
            str(o.warmup_s),
            "--queue-prefix",
            self.queue_prefix,
            "--tag",
            f"{self.run_id}-{step.name}",
        ]
        if db.postmaster_pid is not None:
            argv += ["--db-pid", str(db.postmaster_pid)]
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "QUEEN_WORKER_ID")}
        env.setdefault("QUEEN_LOG_LEVEL", "warning")
        log_path = workdir / f"{step.name}.log"
        with log_path.open("ab") as log:
            done = subprocess.run(
                argv,
                env=env,
                cwd=Path(__file__).resolve().parent.parent,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                timeout=INPROC_LIMIT_S,
                check=False,
            )
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"{step.label()} failed (status {done.returncode}); see {log_path}")
        record: dict[str, Any] = json.loads(lines[-1])
        if step.kind == "embedded":
            e = EMBEDDED[step.name]
            record.update({"description": e.describe(), "note": e.note, "pg_shape": e.pg})
            self.embedded[step.name] = record
            text = _summary(record)
            if record.get("requests_per_tx") is not None:
                text += f"  req/tx {record['requests_per_tx']:.1f}"
            return text
        c = CONSUME[step.name]
        record.update({"description": c.describe(), "note": c.note})
        self.consume[step.name] = record
        return _consume_summary(record)

    def _pg(self, name: str, variant: str, db: Database) -> str:
        o = self.options
        result = run_pg_ceiling(
            db,
            PG_SHAPES[name],
            variant,
            seconds=o.pg_duration_s,
            warmup_s=o.pg_warmup_s,
            group=o.pg_group,
            connections=o.pg_connections,
            queue_prefix=self.queue_prefix,
            tag=f"{self.run_id}-{name}-{variant}",
        )
        record = dataclasses.asdict(result)
        record["description"] = PG_SHAPES[name].describe()
        record["db_cpu_s_per_100k"] = per_100k(result.db_cpu_s, result.frames)
        record["client_cpu_s_per_100k"] = per_100k(result.client_cpu_s, result.frames)
        self.pg.setdefault(name, {})[variant] = record
        return (
            f"{result.msg_per_s:>10,.0f} msg/s  {result.commits_per_s:,.0f} commits/s"
            f"  ({result.group} batch{'es' if result.group > 1 else ''}/commit, "
            f"{result.connections} connections)"
        )

    def _compare(self) -> None:
        """Each scenario's msg/s as a fraction of its ceilings."""
        for record in self.scenarios.values():
            msg = record["msg_per_s"]
            http = self.http.get(record["http_ceiling"])
            record["vs_http"] = msg / http["msg_per_s"] if http and http["msg_per_s"] else None
            pg = self.pg.get(record["pg_shape"], {})
            record["vs_pg"] = {v: msg / r["msg_per_s"] for v, r in pg.items() if r["msg_per_s"]}
        for record in self.embedded.values():
            pg = self.pg.get(record["pg_shape"], {})
            msg = record["msg_per_s"]
            record["vs_pg"] = {v: msg / r["msg_per_s"] for v, r in pg.items() if r["msg_per_s"]}


def _consume_summary(record: dict[str, Any]) -> str:
    pop, ack = record.get("pop_ms") or {}, record.get("ack_ms") or {}
    text = (
        f"{record['msg_per_s']:>10,.0f} msg/s  pop p50 {pop.get('p50', 0):.1f} ms"
        f"  p99 {pop.get('p99', 0):.1f} ms  ack p50 {ack.get('p50', 0):.1f} ms"
        f"  p99 {ack.get('p99', 0):.1f} ms  broker {record['server_cores']:.2f} cores"
    )
    single = record.get("single_pop_ms")
    if single:
        text += f"  single pop p50 {single['p50']:.1f} ms"
    if not record.get("finished", True):
        text += "  UNFINISHED"
    return text


def _summary(record: dict[str, Any]) -> str:
    lat = record["latency_ms"]
    text = (
        f"{record['msg_per_s']:>10,.0f} msg/s  p50 {lat.get('p50', 0):.1f} ms"
        f"  p99 {lat.get('p99', 0):.1f} ms  max {lat.get('max', 0):.0f} ms"
        f"  server {record['server_cores']:.2f} cores"
    )
    if "other_cores" in record:
        text += f"  other load {record['other_cores']:.2f}"
    errors = sum(record["errors"].values())
    return text + (f"  ERRORS {errors:,}" if errors else "")


def _queen_env() -> dict[str, str]:
    hidden = {"DATABASE_URL", "QUEEN_WORKER_ID"}
    return {
        k: v for k, v in sorted(os.environ.items()) if k.startswith("QUEEN_") and k not in hidden
    }

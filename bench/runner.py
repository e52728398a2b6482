"""One benchmark run: the plan, the steps (each a measured window; the PostgreSQL ceiling, a
plain psycopg loop, runs here), and the results document that :mod:`bench.report` renders. Also
what the peer run and PGMQ's share: run ids, the scratch folder, the document's head."""

from __future__ import annotations

import contextlib
import operator
import os
import platform
import secrets
import shutil
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import orjson

from bench import inproc, servers
from bench.report import step_line
from bench.scenarios import (
    ALL,
    HTTP_CEILINGS,
    PG_SHAPES,
    SCENARIOS,
    AnyScenario,
    ConsumeLoad,
    Embedded,
    Load,
    PgShape,
)
from bench.servers import Database, Meter, Server, per_100k
from bench.wrk import WrkReport, run_wrk, wrk_version
from queen.ids import mint_ids
from queen.storage.base import SegmentWrite

# The broker's statement and column encoding, so "the same rows" means the same bytes sent.
from queen.storage.postgres import PUSH_SQL_PSYCOPG, _encode

COVER_LIMIT_S = 120.0  # longest extra warm-up spent giving every partition its actor
INPROC_LIMIT_S = 900.0  # an in-process step that takes longer is stopped and reported
MB = 1024 * 1024
VARIANT = "fn-merged"  # the PostgreSQL ceiling, as the report and the targets call it
ABOUT = "G batches packed into one push_segments call (one segment per partition)"
_SHOWN_OPTIONS = "duration_s warmup_s pg_duration_s pg_warmup_s pg_group pg_connections wrk_threads"
_PACKAGES = ("queen-trio", "trio", "hypercorn", "quart", "quart-trio", "psycopg", "orjson")
_PUSH = "items items_failed items_buffered transactions segments requests_committed"
COUNTERS = [f"push_{name}" for name in _PUSH.split()]  # queen_<name>_total: what the report reads
SETTLE_S = 1.2  # a worker publishes its counters every second: then a reading has them all
Wrk = Callable[[float, str, int], WrkReport]  # a wrk run of a step: seconds, tag suffix, start


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)


@contextlib.contextmanager
def scratch(prefix: str, log: Callable[[str], None]) -> Iterator[Path]:
    """A folder for the servers' logs and data, kept (and named) when the run fails."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield workdir
    except BaseException:
        log(f"logs of the servers are kept in {workdir}")
        raise
    shutil.rmtree(workdir, ignore_errors=True)


def _first(path: str, key: str) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip() if ":" in line else line.split("=", 1)[1]
    return None


def _package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def describe_machine() -> dict[str, Any]:
    memory_kib = _first("/proc/meminfo", "MemTotal")
    os_name = _first("/etc/os-release", "PRETTY_NAME=")
    return {
        "cpu": _first("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory_kib.split()[0]) / 1024 / 1024, 1) if memory_kib else None,
        "os": os_name.strip('"') if os_name else platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {name: _package(name) for name in _PACKAGES},
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }


def head(run_id: str, started: datetime, before: dict[str, Any], wrk: str) -> dict[str, Any]:
    """What every results document begins with: the run, the machine, the broker's settings."""
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("QUEEN_")}
    env.pop("QUEEN_WORKER_ID", None)
    return {
        "format": 1,
        "run_id": run_id,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": before,
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "wrk": wrk_version(wrk) if wrk else "not used",
        "broker_env": env,
    }


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
    wrk_threads: int = 1
    database_url: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    kind: str  # "http", "broker", "embedded", "consume" or "pg"
    name: str  # ceiling, scenario or PostgreSQL shape name

    def describe(self, o: Options) -> str:
        kinds = {"http": "HTTP ceiling", "embedded": "embedding API"}
        kinds["pg"] = f"PostgreSQL ceiling {VARIANT}"
        label = f"{self.name} {kinds.get(self.kind, self.kind)}"
        if self.kind == "pg":
            about = ABOUT.replace("G ", f"{o.pg_group} ")
            what = f"{PG_SHAPES[self.name].describe()}: {about}"
            return f"{label}: {what} ({o.pg_warmup_s:g} s warm-up + {o.pg_duration_s:g} s)"
        what = (HTTP_CEILINGS[self.name] if self.kind == "http" else ALL[self.name]).describe()
        timing = f" ({o.warmup_s:g} s warm-up + {o.duration_s:g} s)"
        return f"{label}: {what}{timing if self.kind != 'consume' else ''}"


def plan(options: Options) -> list[Step]:
    """Each ceiling runs once, next to the first scenario it bounds."""
    steps: list[Step] = []
    seen: set[str] = set()
    for s in options.scenarios:
        if isinstance(s, ConsumeLoad):
            steps.append(Step("consume", s.name))
            continue
        if not isinstance(s, Embedded) and options.http_ceilings and s.http not in seen:
            seen.add(s.http)
            steps.append(Step("http", s.http))
        steps.append(Step("embedded" if isinstance(s, Embedded) else "broker", s.name))
        if options.pg_ceilings and s.pg not in seen:
            seen.add(s.pg)
            steps.append(Step("pg", s.pg))
    return steps


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
            pushed = inproc.item("", self.shape.partitions, n, self.tag)
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
    """The PostgreSQL ceiling: ``connections`` threads, each with a connection and a queue of its
    own (no waiting on each other's row locks), put ``group`` batches in one call of the broker's
    own statement per commit, for ``warmup_s`` + ``seconds``; what committed during ``seconds``."""
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


class _Peak(threading.Thread):
    """Samples ``read()`` every half second until :meth:`stop`; keeps the largest value."""

    def __init__(self, read: Callable[[], int]) -> None:
        super().__init__(daemon=True)
        self.read, self.peak, self.done = read, read(), threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.peak = max(self.peak, self.read())

    def stop(self) -> int:
        self.done.set()
        self.join()
        return max(self.peak, self.read())


GROUPS = {"http": "http_ceilings", "broker": "scenarios", "embedded": "embedded"}


class Run:
    """Carries one run from the first step to the results document."""

    def __init__(self, options: Options, wrk: str, *, log: Callable[[str], None] = print) -> None:
        self.options, self.wrk, self.log = options, wrk, log
        self.run_id = new_run_id()
        self.queue_prefix = f"qbench-{self.run_id}-"
        self.groups: dict[str, dict[str, Any]] = {
            k: {} for k in ("http_ceilings", "pg_ceilings", "scenarios", "embedded", "consume")
        }

    def execute(self) -> dict[str, Any]:
        o = self.options
        steps = plan(o)
        started, before = datetime.now(UTC), describe_machine()
        self.log(f"queen benchmark {self.run_id}: {len(steps)} steps")
        with (
            scratch("queen-bench-", self.log) as workdir,
            servers.open_database(o.database_url, workdir) as db,
        ):
            self.log(f"database: {db.description}, {db.version}")
            try:
                for number, step in enumerate(steps, 1):
                    self.log(f"[{number}/{len(steps)}] {step.describe(o)}")
                    self.log("      " + progress(self._step(step, db, workdir)))
                    # every step starts from the same, empty database (servers.vacuum)
                    servers.drop_queues(db, self.queue_prefix)
                    servers.vacuum(db)
            finally:
                if o.database_url is not None:
                    servers.drop_queues(db, self.queue_prefix)
        self._compare()
        return {
            **head(self.run_id, started, before, self.wrk),
            "options": {
                "scenarios": [s.name for s in o.scenarios],
                **{k: getattr(o, k) for k in _SHOWN_OPTIONS.split()},
            },
            "database": db.describe(),
            **self.groups,
        }

    def _step(self, step: Step, db: Database, workdir: Path) -> dict[str, Any]:
        """Run one step; its record, filed in its group of the results document."""
        o, name = self.options, step.name
        if step.kind == "pg":
            result = run_pg_ceiling(
                db,
                PG_SHAPES[name],
                seconds=o.pg_duration_s,
                warmup_s=o.pg_warmup_s,
                group=o.pg_group,
                connections=o.pg_connections,
                queue_prefix=self.queue_prefix,
                tag=f"{self.run_id}-{name}-{VARIANT}",
            )
            record = {**result, "description": PG_SHAPES[name].describe()}
            per_100k(record, result["frames"], ("db_cpu_s", "client_cpu_s"))
            self.groups["pg_ceilings"][name] = {VARIANT: record}
            return record
        if step.kind == "http":
            c = HTTP_CEILINGS[name]
            server = servers.start_http_stack(
                "bench.http_ceiling", workers=c.workers, workdir=workdir, name=name
            )
            about: dict[str, Any] = {"description": c.describe(), "workers": c.workers}
            record = {**about, **self._window(server, db, c.load, name, 0)}
        elif step.kind == "broker":
            s = SCENARIOS[name]
            server = servers.start_broker(db, workers=s.workers, workdir=workdir, name=name)
            about = {"description": s.describe(), "note": s.note, "workers": s.workers}
            about.update(http_ceiling=s.http, pg_shape=s.pg)
            record = {**about, **self._window(server, db, s.load, name, s.workers)}
        else:
            e, log, tag = ALL[name], workdir / f"{name}.log", f"{self.run_id}-{name}"
            step_args = dict(duration=o.duration_s, warmup=o.warmup_s, tag=tag)
            step_args["queue_prefix"] = self.queue_prefix
            record = inproc.in_process(["bench.inproc", name], db, log, INPROC_LIMIT_S, **step_args)
            record["description"] = e.describe()
            record.update(note=e.note, **({"pg_shape": e.pg} if isinstance(e, Embedded) else {}))
        self.groups[GROUPS.get(step.kind, step.kind)][name] = record
        return record

    def _window(
        self, server: Server, db: Database, load: Load, name: str, processes: int
    ) -> dict[str, Any]:
        """Warm up, then one measured wrk window (with ``processes``, the broker's: its counters
        too), each with a transactionId space of its own. The server is stopped afterwards."""
        o = self.options
        queue, tag = self.queue_prefix + name.lower(), f"{self.run_id}-{name}"

        def wrk(seconds: float, suffix: str, start: int = 0) -> WrkReport:
            url, threads = server.base_url, o.wrk_threads
            return run_wrk(self.wrk, url, load, seconds, queue, tag + suffix, threads, start)

        try:
            server.wait_ready()
            if o.warmup_s > 0:
                warm = wrk(o.warmup_s, "-w")
                if processes:
                    self._cover_partitions(server, load, wrk, warm, processes)
            before = fetch_metrics(server.base_url, processes) if processes else {}
            meter, rss = Meter(db.postmaster_pid, server.pids), _Peak(server.rss_bytes)
            report = wrk(o.duration_s, "-m")
            w, rss_max = meter.stop(), rss.stop()
            after = fetch_metrics(server.base_url, processes) if processes else {}
        finally:
            server.stop()
        messages = report.ok_requests * load.items
        record: dict[str, Any] = {
            **report.figures(load.items),
            "errors": {"non_2xx": report.non_2xx, **report.socket_errors},
            **w,
            "wrk_cpu_s": report.cpu_s,
            "rss_mb": rss_max / MB,
        }
        if processes:
            figures = push_figures(before, after)
            record.update(counters=figures, requests_per_tx=figures["requests_per_tx"])
            record["partitions_per_tx"] = figures["partitions_per_tx"]
            if figures["push_items"] > 0:  # CPU per message the broker took in
                messages = figures["push_items"]
        return per_100k(record, messages)

    def _cover_partitions(
        self, server: Server, load: Load, wrk: Wrk, warm: WrkReport, processes: int
    ) -> None:
        """Warm up on until (nearly) every partition has an actor, so the window measures
        the steady state rather than the creation of partitions (S4 has 10,000)."""
        deadline = time.monotonic() + COVER_LIMIT_S
        sent, chunk = warm.requests, 1
        while True:
            active = fetch_metrics(server.base_url, processes).get("queen_actors_active")
            missing = load.partitions - (active or 0.0)
            left = deadline - time.monotonic()
            if missing <= load.partitions * 0.01 or left <= 1:
                return
            per_s = max(1.0, warm.requests_per_s * min(load.items, load.partitions))
            seconds = min(left, missing / per_s * 1.2 + 1)
            self.log(
                f"      warm-up: {active or 0:,.0f} of {load.partitions:,} partitions have an "
                f"actor; {seconds:.0f} s more"
            )
            warm = wrk(seconds, f"-w{chunk}", sent)
            sent, chunk = sent + warm.requests, chunk + 1

    def _compare(self) -> None:
        """Each scenario's msg/s as a fraction of its ceilings."""
        g = self.groups
        for record in [*g["scenarios"].values(), *g["embedded"].values()]:
            msg = record["msg_per_s"]
            if "http_ceiling" in record:
                http = g["http_ceilings"].get(record["http_ceiling"])
                record["vs_http"] = msg / http["msg_per_s"] if http and http["msg_per_s"] else None
            pg = g["pg_ceilings"].get(record["pg_shape"], {})
            record["vs_pg"] = {v: msg / r["msg_per_s"] for v, r in pg.items() if r["msg_per_s"]}


def progress(r: dict[str, Any]) -> str:
    """A step's line while the run goes on."""
    if "commits_per_s" in r:
        return (
            f"{r['msg_per_s']:>10,.0f} msg/s  {r['commits_per_s']:,.0f} commits/s"
            f"  ({r['group']} batch{'es' if r['group'] > 1 else ''}/commit, "
            f"{r['connections']} connections)"
        )
    errors = sum((r.get("errors") or {}).values()) + (r.get("counters") or {}).get("failed", 0)
    notes = [
        f"single pop p50 {r['single_pop_ms']['p50']:.1f} ms" if r.get("single_pop_ms") else "",
        f"req/tx {r['requests_per_tx']:.1f}" if r.get("requests_per_tx") is not None else "",
        f"ERRORS {errors:,.0f}" if errors else "",
        "UNFINISHED" if r.get("finished") is False else "",
    ]
    latency = "pop_ms" if "pop_ms" in r else "latency_ms"
    return step_line(r, latency, "server", "  ".join(filter(None, notes)))


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format, unlabelled samples only (all the broker writes)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("#") and "{" not in line:
            with contextlib.suppress(ValueError):
                values[parts[0]] = float(parts[1])
    return values


def process_count(text: str) -> int:
    """How many broker processes a /metrics answer covers (samples of ``queen_process_id``)."""
    samples = ("queen_process_id ", "queen_process_id{")
    return sum(1 for line in text.splitlines() if line.startswith(samples))


def fetch_metrics(base_url: str, processes: int = 1, timeout_s: float = 30.0) -> dict[str, float]:
    """One reading of /metrics (whichever worker answers sums every worker's), once it covers
    ``processes`` broker processes (with several, ``SETTLE_S`` after being asked)."""
    deadline = time.monotonic() + timeout_s
    if processes > 1:
        time.sleep(SETTLE_S)
    while True:
        request = urllib.request.Request(f"{base_url}/metrics", headers={"Connection": "close"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read().decode()
        if (covered := process_count(text)) >= processes:
            return parse_metrics(text)
        if time.monotonic() > deadline:
            raise RuntimeError(f"/metrics covers {covered} of {processes} broker processes")
        time.sleep(0.2)


def push_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """A window's counters: each one's increase (one absent before counts from zero), the
    items not stored by this run, and per transaction the requests and partitions."""
    d = {
        k: after.get(f"queen_{k}_total", 0.0) - before.get(f"queen_{k}_total", 0.0)
        for k in COUNTERS
    }
    tx = d["push_transactions"]
    return {
        **d,
        "failed": d["push_items_failed"] + d["push_items_buffered"],
        "requests_per_tx": d["push_requests_committed"] / tx if tx > 0 else None,
        "partitions_per_tx": d["push_segments"] / tx if tx > 0 else None,
    }

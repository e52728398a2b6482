"""The peer run (``./bench/run.sh --peer``; docs/benchmark.md): every peer shape on the original
C++ server and on ours, alternating, each step a fresh server on a fresh database of one
PostgreSQL server; and the original as a peer: where its build is, how it starts (from its
``server`` folder, over TCP), the CPU of a step's own database."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import trio
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from bench import inproc, original_runner, peer_report, pipeline, servers
from bench.inproc import percentiles
from bench.original_runner import SHAPES as RUNNER
from bench.original_runner import RunnerShape
from bench.peer_report import CEILINGS, SIDES
from bench.pipeline import DEFAULT_BINARY, PipelineShape
from bench.runner import describe_machine, head, new_run_id, scratch
from bench.scenarios import CONSUME as CONSUME_LOADS
from bench.scenarios import SCENARIOS, ConsumeLoad, pick
from bench.servers import Database, Meter, Server, per_100k, read_stat
from bench.wrk import ensure_wrk, run_wrk
from queen.settings import Settings

BINARY_ENV = "QUEEN_PEER_SERVER"

# Its worker threads one per core here (its default is per core of the machine it was tuned on),
# pools sized for PostgreSQL's default max_connections (100), warnings logged as queen serve's.
SETTINGS: dict[str, str] = {
    "NUM_WORKERS": str(os.cpu_count() or 2),
    "DB_POOL_SIZE": "20",
    "SIDECAR_POOL_SIZE": "20",
    "LOG_LEVEL": "warn",
}


def binary() -> Path:
    return Path(os.environ.get(BINARY_ENV) or DEFAULT_BINARY)


def missing() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    path = binary()
    if not os.access(path, os.X_OK):
        return (
            f"peer not built: no {path} (build it with ../shared/peer/build-original.sh "
            f"or name it with {BINARY_ENV})"
        )
    if not (path.parent.parent.parent / "lib" / "schema").is_dir():
        return f"peer incomplete: {path} has no lib/schema beside its server folder"
    return None


def start_original(db: Database, *, workdir: Path, name: str) -> Server:
    """The original on a free port of 127.0.0.1, on ``db`` (a TCP conninfo)."""
    parts = conninfo_to_dict(db.conninfo)
    host = str(parts.get("host") or "")
    if not host or host.startswith("/"):
        raise RuntimeError(f"the original reaches PostgreSQL over TCP only, not {db.description}")
    port, spool = servers.free_port(), workdir / f"peer-spool-{name}"
    spool.mkdir(parents=True, exist_ok=True)
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TZ") if k in os.environ}
    env.update(HOST="127.0.0.1", PORT=str(port), FILE_BUFFER_DIR=str(spool), **SETTINGS)
    env.update(PG_HOST=host, PG_PORT=str(parts.get("port") or 5432))
    # trust authentication ignores the password; the original insists on one
    for key, part in (("PG_USER", "user"), ("PG_PASSWORD", "password"), ("PG_DB", "dbname")):
        env[key] = str(parts.get(part) or "postgres")
    log_path, path = workdir / f"peer-{name}.log", binary()
    proc = servers.spawn([str(path)], env, log_path, cwd=path.parent.parent)
    return Server(f"original ({name})", [proc], port, 1, log_path)


@contextlib.contextmanager
def fresh_database(server: Database, dbname: str) -> Iterator[Database]:
    """A new, empty database ``dbname`` on ``server`` (dropped on exit, its sessions ended)."""
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname))
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
    with server.connect() as conn:
        conn.execute(drop)
        conn.execute(create)
    try:
        url = urlunsplit(urlsplit(server.conninfo)._replace(path="/" + dbname))
        yield replace(server, conninfo=url, description=f"{server.description}, database {dbname}")
    finally:
        with server.connect() as conn:
            conn.execute(drop)


def stored_messages(db: Database, original: bool) -> int:
    """Messages stored in ``db`` by the original (its message table) or by ours."""
    query = "SELECT coalesce(sum(next_offset), 0) FROM queen.partitions"
    if original:
        query = "SELECT count(*) FROM queen.messages"
    with db.connect() as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


class Backends(threading.Thread):
    """CPU seconds of the backends of database ``dbname`` since started. They come and go with
    its sessions: they are listed in ``pg_stat_activity`` every half second, each one's first
    and last CPU reading kept. A backend there at the start counts from that reading, one born
    later from zero; one that ends counts up to its last reading (at most 0.5 s short)."""

    def __init__(self, server: Database, dbname: str) -> None:
        super().__init__(daemon=True)
        self.server, self.dbname = server, dbname
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.done, self.opened = threading.Event(), threading.Event()
        self.start()
        self.opened.wait(10)

    def _sample(self, conn: Any, *, opening: bool = False) -> None:
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s"
        for (pid,) in conn.execute(query, (self.dbname,)).fetchall():
            stat = read_stat(int(pid))
            if stat is not None:
                self.first.setdefault(stat.pid, stat.cpu_s if opening else 0.0)
                self.last[stat.pid] = stat.cpu_s

    def run(self) -> None:
        with self.server.connect() as conn:
            self._sample(conn, opening=True)
            self.opened.set()
            while not self.done.wait(0.5):
                self._sample(conn)
            self._sample(conn)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


class Window(Meter):
    """One peer step's measured window: :class:`bench.servers.Meter`'s figures, and the CPU of
    the backends of the step's own database ``dbname``."""

    def __init__(self, server: Server, db: Database, dbname: str) -> None:
        super().__init__(db.postmaster_pid, server.pids)
        self.db, self.dbname = db, dbname
        self.backends: Backends | None = None

    def start(self) -> None:
        if self.db_pid is not None:
            self.backends = Backends(self.db, self.dbname)
        super().start()

    def stop(self) -> dict[str, Any]:
        figures = super().stop()
        figures["db_backends_cpu_s"] = self.backends.stop() if self.backends else None
        return figures


CPU_KEYS = ("server_cpu_s", "db_cpu_s", "db_backends_cpu_s", "client_cpu_s")

# At the push shapes, besides SIDES, the HTTP stack alone (CEILINGS: bench.http_ceiling, "stack",
# and bench.hypercorn_floor, "hypercorn") with ours' process count.
PUSH = {name: SCENARIOS[name].load for name in ("S1", "S2", "S3")}
# The C loads, each drained over HTTP by ``groups`` consumer groups at once (0: queue mode).
CONSUME = {name: (load, 3 if name == "C3" else 0) for name, load in CONSUME_LOADS.items()}
WAIT_MS = 30_000  # the consumers' long polls
PIPELINE = PipelineShape()
SHAPES = [*PUSH, *CONSUME, PIPELINE.name, *RUNNER]  # RUNNER: the original's own runner


def describe(name: str, pipelines: dict[str, PipelineShape] | None = None) -> str:
    if name in PUSH:
        return f"push (wrk): {PUSH[name].describe()}"
    if name in RUNNER:
        return RUNNER[name].describe()
    if name in CONSUME:
        load, groups = CONSUME[name]
        mode = f"{groups} consumer groups at once ({load.consumers} each)" if groups else ""
        what = replace(load, fan_out=False).describe()  # its groups read the queue at once here
        return f"consume over HTTP: {what}, {mode or 'queue mode'}"
    return (pipelines or {}).get(name, PIPELINE).describe()


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
    pipeline_partitions: tuple[int, ...] = (PIPELINE.partitions,)


class PeerRun:
    def __init__(self, options: PeerOptions, *, log: Callable[[str], None] = print) -> None:
        self.options, self.log, self.wrk = options, log, ""
        self.run_id = new_run_id()
        self.skipped: dict[str, str] = {}
        self.steps: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.pipelines = {s.name: s for s in map(PipelineShape.at, options.pipeline_partitions)}

    def _usable(self) -> list[str]:
        shapes = list(self.options.shapes)
        if any(s in PUSH for s in shapes):
            self.wrk = ensure_wrk()
        if PIPELINE.name in shapes:
            at = shapes.index(PIPELINE.name)
            if self._ready([PIPELINE.name], pipeline.missing, pipeline.prepare, "the pipeline"):
                shapes[at : at + 1] = list(self.pipelines)  # one shape per partition count
            else:
                del shapes[at]
        runner = [s for s in shapes if s in RUNNER]
        ready = original_runner.missing, original_runner.prepare
        if runner and not self._ready(runner, *ready, "the runner"):
            shapes = [s for s in shapes if s not in runner]
        return shapes

    def _ready(
        self,
        names: list[str],
        missing: Callable[[], str | None],
        prepare: Callable[[Callable[[str], None]], Path],
        what: str,
    ) -> bool:
        """Whether the Node benchmark of the shapes ``names`` can run here (installed now if
        need be); if not, they are skipped, and the run says why."""
        reason = missing()
        if reason is None:
            try:
                prepare(self.log)
            except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                reason = f"{what} could not be prepared: {exc}"
        if reason is not None:
            for name in names:
                self.skipped[name] = reason
            self.log(f"skipping {', '.join(names)}: {reason}")
        return reason is None

    def execute(self) -> dict[str, Any]:
        o = self.options
        shapes = self._usable()
        started, before = datetime.now(UTC), describe_machine()
        order = [(n, r, s) for n in shapes for r in range(o.rounds) for s in self._sides(n)]
        self.log(f"peer benchmark {self.run_id}: {len(order)} steps ({', '.join(shapes)})")
        with (
            scratch("queen-peer-", self.log) as workdir,
            servers.open_database(o.database_url, workdir, tcp=True, bin_dir=o.pg_bin) as server,
        ):
            self.log(f"database: {server.description}, {server.version}")
            for number, (name, rnd, side) in enumerate(order, 1):
                self.log(f"[{number}/{len(order)}] {name} {side} (round {rnd + 1})")
                record = self._step(name, side, rnd, server, workdir)
                self.steps.setdefault(name, {}).setdefault(side, []).append(record)
                self.log("      " + peer_report.step_line(name, record))
        return {
            **head(self.run_id, started, before, self.wrk),
            "kind": "peer",
            "options": {
                **{k: v for k, v in asdict(o).items() if k not in ("database_url", "pg_bin")},
                "shapes": shapes,
                "ours_processes": ours_processes(o.ours_workers),
            },
            "database": server.describe(),
            "original": _original(),
            "skipped": self.skipped,
            "shapes": {
                n: {"description": describe(n, self.pipelines), "steps": self.steps.get(n, {})}
                for n in shapes
            },
        }

    def _sides(self, name: str) -> tuple[str, ...]:
        return SIDES + CEILINGS if name in PUSH and self.options.ceilings else SIDES

    def _step(self, name: str, side: str, rnd: int, pg: Database, workdir: Path) -> dict[str, Any]:
        """One step on a fresh database of ``pg``, the run's PostgreSQL server."""
        workers = self.options.ours_workers
        dbname = f"peer_{name.lower()}_{rnd + 1}_{side}"
        if side in CEILINGS:
            return self._ceiling(name, side, dbname, pg, workdir)
        with fresh_database(pg, dbname) as db:
            if side == "original":
                server = start_original(db, workdir=workdir, name=dbname)
            else:
                server = servers.start_broker(db, workers=workers, workdir=workdir, name=dbname)
            try:
                server.wait_ready()
                meter = Window(server, pg, dbname)
                if name in PUSH:
                    record = self._push(name, server, meter, dbname)
                    record["stored"] = stored_messages(db, side == "original")
                elif name in CONSUME:
                    record = self._consume(name, server, meter, dbname)
                elif name in RUNNER:
                    record = self._runner(RUNNER[name], server, meter, workdir)
                    record["stored"] = stored_messages(db, side == "original")
                    record["unconsumed"] = original_runner.unconsumed(db, side == "original")
                else:
                    record = self._pipeline(self.pipelines[name], server, meter, workdir)
            finally:
                server.stop()
        return record

    def _ceiling(
        self, name: str, side: str, label: str, pg: Database, workdir: Path
    ) -> dict[str, Any]:
        """The push shape against the HTTP stack alone (no broker, no database)."""
        processes = ours_processes(self.options.ours_workers)
        module = "bench.http_ceiling" if side == "stack" else "bench.hypercorn_floor"
        server = servers.start_http_stack(module, workers=processes, workdir=workdir, name=label)
        try:
            server.wait_ready()
            return self._push(name, server, Window(server, pg, label), label)
        finally:
            server.stop()

    def _push(self, name: str, server: Server, meter: Window, tag: str) -> dict[str, Any]:
        o, load, url = self.options, PUSH[name], server.base_url
        queue, tag = f"peer-{name.lower()}", f"{self.run_id}-{tag}"
        warm = run_wrk(self.wrk, url, load, o.warmup_s, queue, tag + "-w", o.wrk_threads)
        meter.start()
        report = run_wrk(self.wrk, url, load, o.duration_s, queue, tag + "-m", o.wrk_threads)
        window = meter.stop()
        messages = report.ok_requests * load.items
        record: dict[str, Any] = {
            **report.figures(load.items),
            "errors": report.errors,
            "answered": (warm.ok_requests + report.ok_requests) * load.items,
            "messages": messages,
            **window,
        }
        return per_100k(record, messages, CPU_KEYS)

    def _consume(self, name: str, server: Server, meter: Window, tag: str) -> dict[str, Any]:
        load, groups = CONSUME[name]
        queue = f"peer-{name.lower()}"
        trio.run(fill, server.base_url, queue, load, f"{self.run_id}-{tag}")
        meter.start()
        record = {**trio.run(drain, server.base_url, queue, load, groups), **meter.stop()}
        return per_100k(record, record["messages"], CPU_KEYS)

    def _runner(
        self, shape: RunnerShape, server: Server, meter: Window, workdir: Path
    ) -> dict[str, Any]:
        seconds, url = self.options.duration_s, server.base_url
        record = original_runner.run(url, shape, seconds=seconds, workdir=workdir, meter=meter)
        return per_100k(record, record["answered"], CPU_KEYS)

    def _pipeline(
        self, shape: PipelineShape, server: Server, meter: Window, workdir: Path
    ) -> dict[str, Any]:
        o = self.options
        record = pipeline.run(
            server.base_url,
            shape,
            seconds=o.pipeline_s,
            warmup_s=o.pipeline_warmup_s,
            workdir=workdir,
            meter=meter,
        )
        record.update(peer_report.pipeline_figures(record["summary"]), partitions=shape.partitions)
        return per_100k(record, record["pushed"], CPU_KEYS)


def _client(base_url: str, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(WAIT_MS / 1000 + 30),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def fill(base_url: str, queue: str, load: ConsumeLoad, tag: str) -> None:
    """Fill the queue over HTTP (:func:`bench.inproc.fill`: 100 items a push, 8 at a time)."""
    async with _client(base_url, inproc.FILL_TASKS) as client:

        async def push(items: list[dict[str, Any]]) -> None:
            answer = await client.post("/api/v1/push", json={"items": items})
            if answer.status_code >= 300:
                raise RuntimeError(f"fill of {queue}: {answer.status_code} {answer.text}")

        await inproc.fill(push, queue, load.messages, load.partitions, tag)


async def _group(
    client: httpx.AsyncClient, queue: str, group: str | None, load: ConsumeLoad
) -> inproc.Drain:
    """One group's consumers, as the official JS client's ``consume()`` with ``.batch(n)``
    pops (long polls) and acks (``/api/v1/ack/batch``, one per batch)."""
    query = f"batch={load.batch}&wait=true&timeout={WAIT_MS}"
    if group is not None:
        query += f"&consumerGroup={quote(group)}"
    path = f"/api/v1/pop/queue/{quote(queue, safe='')}?{query}"

    async def pop() -> list[Any]:
        answer = await client.get(path)
        if answer.status_code == 204 or not answer.content:
            return []
        answer.raise_for_status()
        return list(answer.json().get("messages") or [])

    async def ack(messages: list[dict[str, Any]]) -> int:
        acks = [
            {
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "leaseId": m.get("leaseId"),
                "status": "completed",
                "error": None,
            }
            for m in messages
        ]
        body = {"acknowledgments": acks, "consumerGroup": group}
        reply = await client.post("/api/v1/ack/batch", json=body)
        reply.raise_for_status()
        answer = reply.json()
        rows = answer if isinstance(answer, list) else (answer or {}).get("results") or []
        return len(acks) - sum(1 for r in rows if isinstance(r, dict) and r.get("success") is False)

    return await inproc.drain(pop, ack, load.messages, load.consumers)


async def drain(base_url: str, queue: str, load: ConsumeLoad, groups: int) -> dict[str, Any]:
    """Every group (or queue mode) drains the queue at once; the figures of the whole."""
    names: list[str | None] = [f"g{k + 1}" for k in range(groups)] or [None]
    states: list[inproc.Drain] = []
    t0 = time.monotonic()
    async with _client(base_url, load.consumers * len(names)) as client:

        async def one(group: str | None) -> None:
            states.append(await _group(client, queue, group, load))

        async with trio.open_nursery() as nursery:
            for group in names:
                nursery.start_soon(one, group)
    wall = time.monotonic() - t0
    consumed = sum(s.consumed for s in states)
    return {
        "messages": consumed,
        "deliveries_expected": load.messages * len(names),
        "finished": all(s.finished for s in states),
        **{k: sum(getattr(s, k) for s in states) for k in ("pops", "empty_pops", "failed_acks")},
        "drain_s": wall,
        "msg_per_s": consumed / wall if wall > 0 else 0.0,
        "pop_ms": percentiles([v for s in states for v in s.pop_ms]),
        "ack_ms": percentiles([v for s in states for v in s.ack_ms]),
    }


def ours_processes(workers: int) -> int:
    """How many processes ``queen serve`` runs with ``--workers workers`` (0: its default)."""
    return Settings(database_url="memory://").with_changes(workers=workers).processes()


def _original() -> dict[str, Any]:
    path = binary()
    argv = ["git", "-C", str(pipeline.repo()), "rev-parse", "--short", "HEAD"]
    head = subprocess.run(argv, capture_output=True, text=True, check=False)
    return {
        "binary": str(path),
        "built": datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds"),
        "mirror_head": head.stdout.strip() or None,
        "settings": dict(SETTINGS),
    }


def options(args: argparse.Namespace) -> PeerOptions:
    try:
        partitions = [int(n) for n in args.pipeline_partitions.split(",") if n.strip()]
    except ValueError:
        partitions = []
    positive = (args.rounds, args.duration, args.pipeline_duration, *partitions)
    if not partitions or min(positive) <= 0 or args.ours_workers < 0:
        raise ValueError(
            "--rounds, --duration and --pipeline-duration must be positive, --ours-workers "
            "0 or more, --pipeline-partitions positive counts"
        )
    return PeerOptions(
        pipeline_partitions=tuple(partitions),
        shapes=pick(args.peer_shapes, SHAPES, "peer shapes"),
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The results document, or nothing where the original is not built (said so)."""
    reason = missing()
    if reason is not None:
        print(f"bench: {reason}; skipping the peer shapes")
        return {}
    return PeerRun(options(args), log=lambda line: print(line, flush=True)).execute()

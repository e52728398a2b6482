"""The original's own 4-stage pipeline benchmark (docs/benchmark.md), its scripts and its JS
client unchanged, exported from the original's mirror and installed into :func:`home`. A run does
what its ``runner.sh`` does around its own servers, with the knobs of :class:`PipelineShape`;
the consumers run on until every message the producer had acknowledged reached both tail groups
(or nothing arrived for longer than a lease), and ``analyze.js`` reports.

``warmup-partitions.js`` leaves one message in every partition of both queues, flagged for
``analyze.js`` to leave out. The consumers start first and take those before the measured
window opens and the producer starts: the window's CPU and requests are the producer's
messages' alone, as the steady state ``analyze.js`` reports is (at 1,000 partitions the 2,000
warm-up messages, each popped alone, would otherwise be a third of the window's requests)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.servers import ROOT, Meter, output_of, spawn, stop_all, tree_cpu_s

REPO_ENV = "QUEEN_PEER_REPO"
DEFAULT_REPO = ROOT.parent / ".mirror" / "queen-mq+queen" / "repo"
HOME_ENV = "QUEEN_PEER_PIPELINE"
DEFAULT_BINARY = ROOT.parent / "peer-build" / "server" / "bin" / "queen-server"
DEFAULT_HOME = ROOT.parent / "peer-build" / "pipeline"
SCRIPTS = "benchmark-queen/2026-04-26/pipeline/queen"
CLIENT = "clients/client-js"
QUIET_S = 65.0  # longer than the queues' lease (configure.js: 60 s): a lapsed lease redelivers
DRAIN_LIMIT_S = 240.0
STEP_LIMIT_S = 180.0  # configure.js, warmup-partitions.js, analyze.js
WARMUP_QUIET_S = 15.0  # the warm-up messages' drain ends early when nothing arrives this long
COUNTS_EVERY_S = 1.0  # count_requests.cjs writes its counts this often


@dataclass(frozen=True, slots=True)
class PipelineShape:
    """The knobs of the original's ``ecosystem.config.cjs`` (environment variables)."""

    name: str = "PIPE"
    producers: int = 1
    in_flight: int = 20
    target_rate: int = 5000  # per producer; its default, not reached here
    partitions: int = 100
    workers: int = 2
    analytics: int = 1
    log: int = 1
    concurrency: int = 10
    batch: int = 100

    @classmethod
    def at(cls, partitions: int) -> PipelineShape:
        """``PIPE`` at the knobs' own partition count, else ``PIPE-<partitions>``."""
        default = cls()
        if partitions == default.partitions:
            return default
        return cls(name=f"PIPE-{partitions}", partitions=partitions)

    def describe(self) -> str:
        return (
            f"the original's pipeline: {self.producers} producer of single-message pushes, "
            f"{self.in_flight} in flight, {self.partitions} partitions; {self.workers} workers "
            f"pop {self.batch} from q1 (group workers), push to q2, ack; groups analytics and "
            f"log on q2 ({self.analytics} + {self.log}); {self.concurrency} pops per consumer"
        )


def home() -> Path:
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME)


def repo() -> Path:
    return Path(os.environ.get(REPO_ENV) or DEFAULT_REPO)


def _prepared(where: Path) -> bool:
    installed = where / "node_modules" / "queen-mq" / "package.json"
    return (where / "queen" / "analyze.js").exists() and installed.exists()


def missing() -> str | None:
    """Why the pipeline cannot run here (after :func:`prepare`), or None."""
    if (reason := node_missing()) is not None:
        return reason
    if not _prepared(home()) and not (repo() / "HEAD").exists():
        return f"no pipeline in {home()} and no mirror of the original at {repo()}"
    return None


def node_missing() -> str | None:
    """Which of node and npm the original's Node benchmarks need is not installed, or None."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def export(path: str, into: Path) -> Path:
    """``path`` of the mirror's HEAD, extracted under ``into`` (the mirror lacks some large
    blobs elsewhere in the tree: git complains about them, the archive of ``path`` is whole)."""
    argv = ["git", "-C", str(repo()), "archive", "--format=tar", "HEAD", path]
    done = subprocess.run(argv, capture_output=True, check=False)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        if not tar.getnames():
            raise RuntimeError(f"git archive of {path} failed: {done.stderr.decode().strip()}")
        tar.extractall(into, filter="data")
    return into / path


def prepare(log: Callable[[str], None] = print) -> Path:
    """Export the scripts and the client and install them into :func:`home` (once)."""
    where = home()
    if _prepared(where):
        return where
    log(f"preparing the original's pipeline benchmark in {where} (npm install)")
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="queen-peer-") as tmp:
        scripts = export(SCRIPTS, Path(tmp))
        shutil.rmtree(where / "queen", ignore_errors=True)
        shutil.copytree(scripts, where / "queen")
        client = export(CLIENT, Path(tmp))
        pack = ["npm", "pack", "--silent", "--pack-destination", str(where)]
        packed = subprocess.run(pack, cwd=client, capture_output=True, text=True, check=True)
        tarball = packed.stdout.strip().splitlines()[-1]
    wanted = json.loads((where / "queen" / "package.json").read_text())["dependencies"]
    wanted["queen-mq"] = f"file:{tarball}"
    manifest = {"name": "queen-pipeline-peer", "private": True, "dependencies": wanted}
    (where / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    npm_install(where)
    return where


def npm_install(where: Path) -> None:
    """Install what ``where``'s package.json names."""
    install = ["npm", "install", "--no-audit", "--no-fund", "--silent"]
    subprocess.run(install, cwd=where, check=True, timeout=600)


class Tail:
    """The txids of every role's JSONL records, read as the files grow."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self.txids: dict[str, set[str]] = {}
        self.errors = 0

    def read(self) -> int:
        """Read what was appended since; return how many records that was."""
        new = 0
        for path in sorted(self.directory.glob("*.jsonl")):
            role = path.name.split("-")[0]
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in chunk[:end].splitlines():
                record = json.loads(line)
                new += 1
                if record.get("error"):
                    self.errors += 1
                else:
                    self.txids.setdefault(role, set()).add(str(record.get("txid")))
        return new

    def seen(self, role: str) -> int:
        """How many distinct txids ``role``'s records carry so far."""
        return len(self.txids.get(role, ()))

    def missing(self) -> int:
        """Pushed (acknowledged) txids that have not reached both tail groups."""
        produced = self.txids.get("producer", set())
        reached = self.txids.get("analytics", set()) & self.txids.get("log", set())
        return len(produced - reached)


def _once(script: str, env: dict[str, str], where: Path, log_path: Path) -> str:
    return output_of(["node", script], env, log_path, STEP_LIMIT_S, cwd=where / "queen")


def _stages(shape: PipelineShape, base: dict[str, str], seconds: float) -> list[dict[str, str]]:
    """The environments of its ecosystem's processes, the consumers outliving the producer."""
    stay = str(round(seconds + DRAIN_LIMIT_S + 60))
    consumer = {"DURATION_SEC": stay, "CONCURRENCY": str(shape.concurrency)}
    consumer.update(BATCH_SIZE=str(shape.batch), MAX_PARTITIONS_PER_POP="1")
    producer = {"QUEUE_NAME": "pipe-q1", "DURATION_SEC": str(round(seconds))}
    producer.update(TARGET_RATE=str(shape.target_rate), IN_FLIGHT=str(shape.in_flight))
    worker = {**consumer, "SOURCE_QUEUE": "pipe-q1", "TARGET_QUEUE": "pipe-q2"}
    tail = {**consumer, "QUEUE_NAME": "pipe-q2"}
    roles = [  # script, processes, environment
        ("producer.js", shape.producers, producer),
        ("worker.js", shape.workers, {**worker, "GROUP": "workers"}),
        ("consumer.js", shape.analytics, {**tail, "GROUP": "analytics"}),
        ("consumer.js", shape.log, {**tail, "GROUP": "log"}),
    ]
    return [
        {**base, **env, "INSTANCE": str(i + 1), "SCRIPT": script}
        for script, count, env in roles
        for i in range(count)
    ]


def run(
    base_url: str,
    shape: PipelineShape,
    *,
    seconds: float,
    warmup_s: float,
    workdir: Path,
    meter: Meter,
) -> dict[str, Any]:
    """One pipeline against ``base_url``; ``meter`` measures the stages, from their start to the
    end of the drain."""
    where = home()
    results = Path(tempfile.mkdtemp(prefix="pipeline-", dir=workdir))
    log_path = results / "node.log"
    keep = ("PATH", "HOME", "LANG", "TZ")
    base = {k: os.environ[k] for k in keep if k in os.environ}
    base.update(SERVER_URL=base_url, RESULTS_DIR=str(results), QUEUES="pipe-q1,pipe-q2")
    base["NUM_PARTITIONS"] = str(shape.partitions)
    _once("configure.js", base, where, log_path)
    _once("warmup-partitions.js", base, where, log_path)
    counted = results / "requests"  # each stage's requests by route (count_requests.cjs)
    counted.mkdir()
    stages = _stages(shape, base, seconds)
    started: list[subprocess.Popen[bytes]] = []

    def start(envs: list[dict[str, str]]) -> list[subprocess.Popen[bytes]]:
        procs = [
            spawn(
                ["node", env.pop("SCRIPT")],
                {**env, **_counting(counted)},
                log_path,
                cwd=where / "queen",
            )
            for env in envs
        ]
        started.extend(procs)
        return procs

    tail = Tail(results)
    try:
        consumers = start(stages[shape.producers :])  # first: they take the warm-up
        warmup = _drain_warmup(tail, shape)
        time.sleep(COUNTS_EVERY_S * 1.5)  # the consumers' counts written since the drain
        before = requests_counted(counted)
        meter.start()
        # Reaped at the end, the consumers count among the clients with all their CPU time:
        # what they spent before the window is taken off.
        early_s = tree_cpu_s(proc.pid for proc in consumers)
        producers = start(stages[: shape.producers])
        for proc in producers:
            proc.wait(timeout=seconds + 120)
        drained_at = quiet_since = time.monotonic()
        while time.monotonic() - drained_at < DRAIN_LIMIT_S:
            if tail.read():
                quiet_since = time.monotonic()
            if tail.missing() == 0 or time.monotonic() - quiet_since > QUIET_S:
                break
            time.sleep(1.0)
        drain_s = time.monotonic() - drained_at
    finally:
        stop_all(started, 30.0)
    window = meter.stop()
    window["client_cpu_s"] -= early_s
    tail.read()
    env = {**base, "WARMUP_SEC": str(round(warmup_s))}
    summary: dict[str, Any] = json.loads(_once("analyze.js", env, where, log_path))
    return {
        "summary": summary,
        "pushed": len(tail.txids.get("producer", ())),
        "push_errors": tail.errors,
        "missing_all": tail.missing(),
        "drain_s": drain_s,
        "requests": _less(requests_counted(counted), before),
        "warmup": warmup,
        **window,
    }


def _drain_warmup(tail: Tail, shape: PipelineShape) -> dict[str, Any]:
    """Wait until the consumers have taken ``warmup-partitions.js``'s messages: one in every
    partition of q1, which the workers forward to q2, and one in every partition of q2, so the
    workers log ``partitions`` records and each tail group twice that. Ends early when nothing
    arrives for :data:`WARMUP_QUIET_S`; says what it saw."""
    want = {
        "worker": shape.partitions,
        "analytics": 2 * shape.partitions,
        "log": 2 * shape.partitions,
    }
    began = quiet_since = time.monotonic()
    while not all(tail.seen(role) >= n for role, n in want.items()):
        if tail.read():
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > WARMUP_QUIET_S:
            break
        time.sleep(0.2)
    seen = {role: tail.seen(role) for role in want}
    drained = all(seen[role] >= n for role, n in want.items())
    return {"drained": drained, "seconds": time.monotonic() - began, "records": seen}


def _less(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {route: n - before.get(route, 0) for route, n in after.items()}


def _counting(into: Path) -> dict[str, str]:
    script = Path(__file__).with_name("count_requests.cjs")
    return {"NODE_OPTIONS": f"--require {script}", "QUEEN_BENCH_COUNTS": str(into)}


def requests_counted(directory: Path) -> dict[str, int]:
    """The stages' HTTP requests by route, added up over their processes' files."""
    total: dict[str, int] = {}
    for path in directory.glob("*.json"):
        for route, count in json.loads(path.read_text() or "{}").items():
            total[route] = total.get(route, 0) + int(count)
    return total

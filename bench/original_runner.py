"""The original's own producer and consumer benchmark (its ``benchmark-queen/2026-04-26/_runner``:
``bench-producer.js`` and ``bench-consumer.js`` on autocannon), its scripts unchanged, exported
from the original's mirror and installed into :func:`home`. A step does what its
``run_test.sh`` does around its own server: the producer (``MSGS_PER_PUSH`` items per push, each
push to one of ``MAX_PARTITION + 1`` partitions in turn) and the consumer (long-poll pops of 100
with ``autoAck``, in queue mode) start together and run for the window; then the database says
how many messages are stored and how many no pop has taken. The shapes are its ``bp-*`` tests
(``run_master.sh``): 1,001 partitions, one producer worker and one consumer worker of 50
connections each, 1, 10 or 100 items per push."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import pipeline
from bench.servers import Database, Meter, spawn, stop_all

SCRIPTS = "benchmark-queen/2026-04-26/_runner"
FILES = ("bench-producer.js", "bench-consumer.js")
# run_test.sh runs them from the original's examples/, whose manifest says what they import
MANIFEST = "examples/package.json"
DEPENDENCIES = ("autocannon", "axios")
QUEUE = "bench-runner"
FAILURES = ("errors", "non2xx", "timeouts")  # autocannon's counts (errors include timeouts)
LIMIT_S = 120.0  # past the window: the scripts gather their workers' results and print


@dataclass(frozen=True, slots=True)
class RunnerShape:
    """The knobs of the runner's ``run_test.sh`` (environment variables of both scripts)."""

    name: str
    msgs_per_push: int
    max_partition: int = 1000
    producer_connections: int = 50
    consumer_connections: int = 50
    consumer_batch: int = 100

    def describe(self) -> str:
        items = "1 item" if self.msgs_per_push == 1 else f"{self.msgs_per_push} items"
        return (
            f"the original's own runner (its bp-{self.msgs_per_push} test): autocannon pushes of "
            f"{items} to one of {self.max_partition + 1:,} partitions in turn, "
            f"{self.producer_connections} connections, beside {self.consumer_connections} "
            f"connections of long-poll pops of {self.consumer_batch} with autoAck (queue mode)"
        )

    def environment(self, base_url: str, seconds: float) -> dict[str, str]:
        return {
            "SERVER_URL": base_url,
            "QUEUE_NAME": QUEUE,
            "NUM_WORKERS": "1",
            "DURATION": str(max(1, round(seconds))),
            "MAX_PARTITION": str(self.max_partition),
            "MSGS_PER_PUSH": str(self.msgs_per_push),
            "CONSUMER_BATCH": str(self.consumer_batch),
        }


SHAPES: dict[str, RunnerShape] = {
    s.name: s for s in (RunnerShape("BP1", 1), RunnerShape("BP10", 10), RunnerShape("BP100", 100))
}


def home() -> Path:
    return pipeline.home().parent / "runner"


def _prepared(where: Path) -> bool:
    scripts = all((where / name).exists() for name in FILES)
    return scripts and all((where / "node_modules" / d).exists() for d in DEPENDENCIES)


def missing() -> str | None:
    """Why the runner cannot run here (after :func:`prepare`), or None."""
    if (reason := pipeline.node_missing()) is not None:
        return reason
    if not _prepared(home()) and not (pipeline.repo() / "HEAD").exists():
        return f"no runner in {home()} and no mirror of the original at {pipeline.repo()}"
    return None


def prepare(log: Callable[[str], None] = print) -> Path:
    """Export the two scripts and install what they import into :func:`home` (once)."""
    where = home()
    if _prepared(where):
        return where
    log(f"preparing the original's runner benchmark in {where} (npm install)")
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="queen-peer-") as tmp:
        scripts = pipeline.export(SCRIPTS, Path(tmp))
        for name in FILES:
            shutil.copy2(scripts / name, where / name)
        theirs = json.loads(pipeline.export(MANIFEST, Path(tmp)).read_text())["dependencies"]
    wanted = {name: theirs[name] for name in DEPENDENCIES}
    manifest = {"name": "queen-runner-peer", "private": True, "type": "module"}
    (where / "package.json").write_text(json.dumps({**manifest, "dependencies": wanted}) + "\n")
    pipeline.npm_install(where)
    return where


def last_object(output: str, role: str) -> dict[str, Any]:
    """The last ``result`` record of ``role`` a script printed (its result is indented over
    several lines; its start record and anything else it logs are single lines)."""
    decoder, found = json.JSONDecoder(), None
    for start, char in enumerate(output):
        if char == "{" and (start == 0 or output[start - 1] == "\n"):
            try:
                value, _ = decoder.raw_decode(output, start)
            except ValueError:
                continue
            if isinstance(value, dict) and value.get("role") == role:
                found = value if value.get("event") == "result" else found
    if found is None:
        raise ValueError(f"no result of the {role} in its output")
    return found


def unconsumed(db: Database, original: bool) -> int:
    """Messages of the runner's queue that no pop has taken yet (queue mode)."""
    ours = """
        SELECT coalesce(sum(p.next_offset - coalesce(c.next_offset, 0)), 0)
        FROM queen.partitions p
        JOIN queen.queues q ON q.id = p.queue_id
        LEFT JOIN queen.cursors c
          ON c.partition_id = p.id AND c.consumer_group = '__QUEUE_MODE__'
        WHERE q.name = %(queue)s"""
    theirs = """
        SELECT count(*)
        FROM queen.messages m
        JOIN queen.partitions p ON p.id = m.partition_id
        JOIN queen.queues q ON q.id = p.queue_id
        LEFT JOIN queen.partition_consumers pc
          ON pc.partition_id = p.id AND pc.consumer_group = '__QUEUE_MODE__'
        WHERE q.name = %(queue)s
          AND (pc.last_consumed_created_at IS NULL
               OR (m.created_at, m.id) > (pc.last_consumed_created_at, pc.last_consumed_id))"""
    with db.connect() as conn:
        row = conn.execute(theirs if original else ours, {"queue": QUEUE}).fetchone()
    return int(row[0]) if row else 0


def figures(
    shape: RunnerShape, produced: dict[str, Any], consumed: dict[str, Any]
) -> dict[str, Any]:
    """The step's figures from the two scripts' results. autocannon's ``errors`` include its
    ``timeouts``: a request failed when it is an error or answered other than 2xx."""
    latency = produced.get("latency") or {}
    requests, failed = int(produced.get("totalRequests") or 0), int(produced.get("non2xx") or 0)
    push_failures = {k: int(produced.get(k) or 0) for k in FAILURES}
    pop_failures = {k: int(consumed.get(k) or 0) for k in FAILURES}
    return {
        "msg_per_s": float(produced.get("msgPerSec") or 0),
        "latency_ms": {k: latency.get(k) for k in ("p50", "p90", "p99", "max")},
        "answered": max(0, requests - failed) * shape.msgs_per_push,
        "errors": push_failures["errors"] + push_failures["non2xx"],
        "push_failures": push_failures,
        "pops_per_s": float(consumed.get("reqPerSec") or 0),
        "pop_latency_ms": {k: (consumed.get("latency") or {}).get(k) for k in ("p50", "p99")},
        "pop_errors": pop_failures["errors"] + pop_failures["non2xx"],
        "pop_failures": pop_failures,
    }


def run(
    base_url: str, shape: RunnerShape, *, seconds: float, workdir: Path, meter: Meter
) -> dict[str, Any]:
    """One step against ``base_url``: both scripts from their start to their end, measured."""
    where = home()
    out = Path(tempfile.mkdtemp(prefix="runner-", dir=workdir))
    keep = ("PATH", "HOME", "LANG", "TZ")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(shape.environment(base_url, seconds))
    env["NODE_OPTIONS"] = f"--require {Path(__file__).with_name('reap_workers.cjs')}"
    meter.start()
    procs = [spawn(["node", name], env, out / f"{name}.log", cwd=where) for name in FILES]
    try:
        for proc in procs:
            proc.wait(timeout=seconds + LIMIT_S)
    finally:
        stop_all(procs, 10.0)
    window = meter.stop()
    logs = [(out / f"{name}.log").read_text(errors="replace") for name in FILES]
    produced, consumed = last_object(logs[0], "producer"), last_object(logs[1], "consumer")
    return {**figures(shape, produced, consumed), **window}

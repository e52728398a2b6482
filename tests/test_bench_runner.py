"""The original's own runner as a peer shape (bench.original_runner): its scripts' results read
from their logs, the figures of a step, what no pop took (on both schemas), the report's rows,
and the preload that keeps the scripts' cluster workers' CPU time counted."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench import original_runner, peer_report
from bench.original_runner import QUEUE, SHAPES, figures, last_object, unconsumed
from queen import open_broker
from queen.settings import Settings
from tests.conftest import scratch_database
from tests.original_db import DDL

PRODUCED = {
    "role": "producer",
    "event": "result",
    "totalRequests": 1200,
    "totalMessages": 12000,
    "reqPerSec": 40,
    "msgPerSec": 400,
    "latency": {"p50": 20, "p90": 30, "p99": 45, "avg": 21.5, "max": 90},
    "errors": 1,
    "non2xx": 2,
    "timeouts": 0,
    "durationSec": 30,
}
CONSUMED = {
    "role": "consumer",
    "event": "result",
    "reqPerSec": 7,
    "latency": {"p50": 100, "p99": 900},
    "errors": 3,  # autocannon counts its timeouts among its errors
    "non2xx": 1,
    "timeouts": 3,
}


def _log(result: dict[str, Any]) -> str:
    """A script's log as it writes it: its start record on one line, other lines, the result
    indented over several."""
    start = json.dumps({"role": result["role"], "event": "start", "conns": 50})
    return f"{start}\nsome warning {{not json}}\n{json.dumps(result, indent=2)}\n"


def test_a_scripts_result_is_read_from_among_its_log_lines() -> None:
    assert last_object(_log(PRODUCED), "producer") == PRODUCED
    assert last_object(_log(CONSUMED), "consumer") == CONSUMED


def test_a_log_without_the_roles_result_is_an_error() -> None:
    with pytest.raises(ValueError, match="no result of the consumer"):
        last_object(_log(PRODUCED), "consumer")
    start_only = json.dumps({"role": "producer", "event": "start"}) + "\n"
    with pytest.raises(ValueError, match="no result of the producer"):
        last_object(start_only, "producer")


def test_the_scripts_results_become_the_steps_figures() -> None:
    got = figures(SHAPES["BP10"], PRODUCED, CONSUMED)
    assert got["msg_per_s"] == 400.0
    assert got["latency_ms"] == {"p50": 20, "p90": 30, "p99": 45, "max": 90}
    assert got["answered"] == (1200 - 2) * 10  # answers that were not 2xx stored nothing
    assert got["errors"] == 3 and got["push_failures"] == {"errors": 1, "non2xx": 2, "timeouts": 0}
    assert got["pops_per_s"] == 7.0 and got["pop_errors"] == 4  # 3 errors (timeouts) + 1 non-2xx


def test_each_shape_sets_the_scripts_knobs_as_its_bp_test() -> None:
    env = SHAPES["BP100"].environment("http://127.0.0.1:9", 15.4)
    assert env["MSGS_PER_PUSH"] == "100" and env["MAX_PARTITION"] == "1000"
    assert env["DURATION"] == "15" and env["NUM_WORKERS"] == "1"
    assert env["CONSUMER_BATCH"] == "100" and env["QUEUE_NAME"] == QUEUE
    assert [s.msgs_per_push for s in SHAPES.values()] == [1, 10, 100]


class _Db:
    def __init__(self, url: str) -> None:
        self.url = url

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)


@pytest.fixture
def scratch(pg_url: str) -> Iterator[str]:
    with scratch_database(pg_url, "runner") as url:
        yield url


async def test_unconsumed_counts_what_no_pop_took_on_ours(scratch: str, tmp_path: Path) -> None:
    settings = Settings(database_url=scratch, file_buffer_dir=str(tmp_path / "spool"))
    async with open_broker(settings) as broker:
        items = [{"queue": QUEUE, "partition": str(i % 2), "payload": {"i": i}} for i in range(7)]
        await broker.push(items)
        popped = await broker.pop(QUEUE, "0", batch=3, auto_ack=True)
        assert len(popped.delivered) == 3
    assert unconsumed(_Db(scratch), original=False) == 4


def test_unconsumed_counts_what_no_pop_took_on_the_originals_schema(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        conn.execute(DDL)
        queue = conn.execute(
            "INSERT INTO queen.queues (name) VALUES (%s) RETURNING id", (QUEUE,)
        ).fetchone()
        other = conn.execute("INSERT INTO queen.queues (name) VALUES ('x') RETURNING id").fetchone()
        assert queue is not None and other is not None
        parts = []
        for queue_id in (queue[0], queue[0], other[0]):
            row = conn.execute(
                "INSERT INTO queen.partitions (queue_id, name) VALUES (%s, %s) RETURNING id",
                (queue_id, f"p{len(parts)}"),
            ).fetchone()
            assert row is not None
            parts.append(row[0])
        ids = {}
        for n, part in enumerate([parts[0]] * 3 + [parts[1]] * 2 + [parts[2]] * 5):
            ids[n] = f"00000000-0000-7000-8000-{n:012d}"
            conn.execute(
                "INSERT INTO queen.messages (id, transaction_id, partition_id, payload, created_at)"
                " VALUES (%s, %s, %s, '{}', '2026-01-01'::timestamptz + %s * interval '1 ms')",
                (ids[n], f"t{n}", part, n),
            )
        # the queue mode's cursor of the first partition is past its first two messages
        conn.execute(
            "INSERT INTO queen.partition_consumers (partition_id, last_consumed_id,"
            " last_consumed_created_at) VALUES (%s, %s, '2026-01-01'::timestamptz + interval"
            " '1 ms')",
            (parts[0], ids[1]),
        )
    assert unconsumed(_Db(scratch), original=True) == 1 + 2  # another queue's do not count


def _doc() -> dict[str, Any]:
    def step(rate: float, left: int, pop_errors: int) -> dict[str, Any]:
        return {
            "msg_per_s": rate,
            "latency_ms": {"p50": 20, "p99": 60},
            "pops_per_s": 300.0,
            "pop_latency_ms": {"p50": 30, "p99": 2000},
            "answered": 100_000,
            "stored": 100_000,
            "errors": 0,
            "pop_errors": pop_errors,
            "unconsumed": left,
            "wall_s": 10.0,
            "server_cpu_s": 5.0,
            "db_cpu_s": 4.0,
            "client_cpu_s": 1.0,
            "other_cores": 0.1,
        }

    steps = {"original": [step(15_000, 900, 0)], "ours": [step(18_000, 0, 2)]}
    options = {"rounds": 1, "warmup_s": 1.0, "duration_s": 10.0, "pipeline_warmup_s": 15.0}
    return {"options": options, "shapes": {"BP10": {"description": "d", "steps": steps}}}


def test_the_report_shows_each_runner_step_and_what_no_pop_took() -> None:
    doc = _doc()
    rows = peer_report.runner_rows(doc)
    assert [r[0] for r in rows] == ["BP10 original 1", "BP10 ours 1"]
    assert [r[5] for r in rows] == ["900", "0"]
    # (5 + 4 + 1 + 0.1 x 10) s of CPU for 100k messages
    assert rows[0][-1] == "110.0"
    assert peer_report.notes("BP10", doc["shapes"]["BP10"]["steps"]["ours"]) == (
        "pop errors 2, unconsumed 0"
    )
    assert "The original's own runner, step by step:" in peer_report.markdown(doc)


_FORKS = """
import cluster from 'cluster';
if (cluster.isPrimary) {
  const worker = cluster.fork();
  worker.on('message', () => process.exit(0));  // as the runner's scripts do on the results
} else {
  const end = Date.now() + 400;  // the worker's work
  while (Date.now() < end) {}
  process.send('done');
  setInterval(() => {}, 1000);  // and it lingers, as autocannon's sockets do
  process.on('disconnect', () => process.exit(0));
}
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_primary_waits_for_its_workers_so_their_cpu_time_is_counted(tmp_path: Path) -> None:
    script = tmp_path / "forks.mjs"
    script.write_text(_FORKS)
    preload = Path(original_runner.__file__).with_name("reap_workers.cjs")

    def children_cpu_s(preloaded: bool) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        env = {"PATH": "/usr/bin:/bin"}
        if preloaded:
            env["NODE_OPTIONS"] = f"--require {preload}"
        subprocess.run(["node", str(script)], env=env, check=True, timeout=60)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

    assert children_cpu_s(preloaded=True) >= 0.3  # the worker's 0.4 s of work are the primary's
    assert children_cpu_s(preloaded=False) < 0.3  # without it, the orphan's are no one's


def test_runner_shapes_are_skipped_with_the_reason_they_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench.peer_run import PeerOptions, PeerRun

    monkeypatch.setattr(original_runner, "missing", lambda: "node is not installed")
    run = PeerRun(PeerOptions(shapes=["C1", "BP1", "BP10"]), log=lambda line: None)
    assert run._usable() == ["C1"]
    assert run.skipped == {"BP1": "node is not installed", "BP10": "node is not installed"}

    def failing(log: Any) -> Path:
        raise OSError("npm install failed")

    monkeypatch.setattr(original_runner, "missing", lambda: None)
    monkeypatch.setattr(original_runner, "prepare", failing)
    run = PeerRun(PeerOptions(shapes=["BP100", "C2"]), log=lambda line: None)
    assert run._usable() == ["C2"]
    assert run.skipped == {"BP100": "the runner could not be prepared: npm install failed"}

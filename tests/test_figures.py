"""The broker's figures: one process read directly, and the workers of ``--workers N`` summed
through their multiprocess files (written and read by real processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from queen.admin.history import History
from queen.metrics import (
    FAMILIES,
    ORIGINAL_NAMES,
    LocalFigures,
    Metrics,
    Reading,
    create_shared_dir,
    forget_process,
    remove_shared_dir,
)

# One worker's life in a process of its own: publish twice (counters up, gauges set), then
# exit, or (READ) answer the service's reading and exposition as JSON.
_WORKER = """
import json, sys
from pathlib import Path
from queen.metrics import Metrics, SharedFigures

directory, worker, pushes, actors = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
metrics = Metrics()
figures = SharedFigures(metrics, Path(directory), worker)
gauges = {"process_id": 1.0, "database_up": 1.0, "maintenance_mode": 0.0}
metrics.push_requests += pushes - 1
metrics.actors_active = actors
figures.publish(gauges, {"background_errors": ("loop", {"retention": 1.0})})
metrics.push_requests += 1
metrics.max_partitions_per_transaction = actors * 10
figures.publish(gauges, {"background_errors": ("loop", {"retention": 2.0})})
if worker == "reader":
    reading = figures.read()
    text = figures.exposition(gauges, {})
    print(json.dumps({"counters": reading.counters, "processes": reading.processes,
                      "text": text}))
"""


def _worker(
    directory: Path, worker: str, pushes: int, actors: int
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WORKER, str(directory), worker, str(pushes), str(actors)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_every_family_of_one_process_has_help_and_type() -> None:
    metrics = Metrics()
    metrics.push_items += 3
    text = LocalFigures(metrics).exposition(
        {"database_up": 1.0, "process_id": 42.0, "spool_files": 0.0},
        {"background_errors": ("loop", {"retention": 2.0})},
    )
    samples = _samples(text)
    assert samples["queen_push_items_total"] == 3.0
    assert samples["queen_process_id"] == 42.0
    assert samples['queen_background_errors_total{loop="retention"}'] == 2.0
    helped = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    for sample in samples:
        family = sample.split("{")[0]
        assert family in helped and family in typed, family
    assert "# TYPE queen_push_items_total counter" in text
    assert "# TYPE queen_actors_active gauge" in text


def test_every_family_is_described() -> None:
    assert all(f.help and f.kind in ("counter", "gauge") for f in FAMILIES.values())
    assert {"actors_active", "database_up", "process_id"} <= set(FAMILIES)
    assert set(Metrics().snapshot()) <= set(FAMILIES)


def test_workers_are_summed_and_a_gone_worker_keeps_its_counts(tmp_path: Path) -> None:
    directory = create_shared_dir()
    try:
        first = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(directory), "0", "5", "2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        first.communicate(timeout=60)
        assert first.returncode == 0
        # the first worker has exited; the parent forgets it: its live gauges leave the sums
        forget_process(directory, first.pid)
        answer = json.loads(_worker(directory, "reader", 7, 3).stdout)
        counters = answer["counters"]
        assert counters["push_requests"] == 12.0  # 5 from the gone worker, 7 from the reader
        samples = _samples(answer["text"])
        assert samples["queen_push_requests_total"] == 12.0
        assert samples['queen_background_errors_total{loop="retention"}'] == 4.0
        assert samples["queen_actors_active"] == 3.0  # livesum: the gone worker's 2 left
        assert samples["queen_max_partitions_per_transaction"] == 30.0  # max over all
        # per-process gauges: one sample per live worker, labelled with its pid and worker id
        process_samples = [s for s in samples if s.startswith("queen_process_id{")]
        assert len(process_samples) == 1 and 'worker="reader"' in process_samples[0]
        assert answer["processes"] == 1
        text = answer["text"]
        for sample in samples:
            family = sample.split("{")[0]
            assert f"# HELP {family} " in text and f"# TYPE {family} " in text, family
    finally:
        remove_shared_dir(directory)
    assert not directory.exists()


def test_a_restarted_worker_never_takes_a_counter_back() -> None:
    """Readings taken as workers come and go never decrease."""
    directory = create_shared_dir()
    try:
        seen: list[float] = []
        for round_ in range(3):
            done = _worker(directory, str(round_), 4, 1)
            assert done.returncode == 0
            answer = json.loads(_worker(directory, "reader", 1, 1).stdout)
            seen.append(answer["counters"]["push_requests"])
        # each round adds a worker's 4 and a reader's 1, and nothing is ever lost
        assert seen == [5.0, 10.0, 15.0]
    finally:
        remove_shared_dir(directory)


class _Growing:
    """A reading that grows by ``step`` pushes per call (figures of several workers)."""

    metrics = Metrics()
    shared = True

    def __init__(self, step: float) -> None:
        self.total = 0.0
        self.step = step

    def publish(self, gauges: object, labelled: object) -> None:
        return None

    def read(self) -> Reading:
        self.total += self.step
        return Reading({"push_items_queued": self.total, "acks": 0.0}, 1.0, 10, 2)

    def exposition(self, gauges: object, labelled: object) -> str:
        return ""


def test_history_rates_come_from_the_service_reading() -> None:
    now = [1000.0]
    history = History(_Growing(100.0), step_s=10, span_s=60, clock=lambda: now[0])  # type: ignore[arg-type]
    history.sample()
    now[0] += 10
    history.sample()
    assert history.latest_rates().ingested_per_s == 10.0


def test_the_original_names_are_served_from_ours() -> None:
    metrics = Metrics()
    metrics.push_requests, metrics.push_items_queued, metrics.acks, metrics.acks_refused = (
        4,
        9,
        5,
        1,
    )
    text = LocalFigures(metrics).exposition(
        {"spool_pending_items": 3.0, "database_up": 1.0, "maintenance_mode": 1.0}, {}
    )
    samples = _samples(text)
    for name in ORIGINAL_NAMES:
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text, name
    assert samples['queen_cluster_push_requests_total{scope="cluster"}'] == 4.0
    assert samples['queen_cluster_push_messages_total{scope="cluster"}'] == 9.0
    assert samples['queen_cluster_ack_total{result="success",scope="cluster"}'] == 4.0
    assert samples['queen_cluster_ack_total{result="failed",scope="cluster"}'] == 1.0
    assert samples["queen_file_buffer_pending"] == 3.0
    assert samples["queen_maintenance_mode_enabled"] == 1.0
    assert samples["queen_cpu_user_microseconds_total"] > 0


def test_history_says_how_long_popped_messages_waited() -> None:
    metrics = Metrics()
    now = [1000.0]
    history = History(metrics, step_s=10, span_s=600, clock=lambda: now[0])
    history.sample()
    assert history.average_lag_s() == 0.0  # one point: nothing to tell
    metrics.pop_messages += 4
    metrics.pop_lag_seconds += 2.0  # four messages that had waited half a second each
    now[0] += 10
    history.sample()
    now[0] += 10
    history.sample()  # an interval without pops
    first, quiet = history.series()
    assert (first.popped, first.average_lag_ms) == (4, 500.0)
    assert (quiet.popped, quiet.average_lag_ms) == (0, None)
    assert history.average_lag_s() == 0.5
    assert history.average_lag_s(span_s=5) == 0.0  # the last five seconds popped nothing


# A worker whose loops fail as given (FAILING, comma-separated), publishing once; or (READ) a
# worker answering which loops another worker has published as failing.
_LOOPS_WORKER = """
import json, os, sys
from pathlib import Path
from queen.metrics import Metrics, SharedFigures

directory, worker, failing = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
figures = SharedFigures(Metrics(), Path(directory), worker)
states = {name: float(name in failing) for name in ("retention", "push-listener")}
figures.publish({}, {"background_loop_failing": ("loop", states)})
print(json.dumps({"pid": os.getpid(), "elsewhere": sorted(figures.failing_elsewhere())}))
"""


def _loops_worker(directory: Path, worker: str, failing: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _LOOPS_WORKER, str(directory), worker, failing],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_loop_failing_in_one_worker_is_seen_failing_by_the_others() -> None:
    directory = create_shared_dir()
    try:
        failing = _loops_worker(directory, "0", "retention")
        assert failing["elsewhere"] == []  # its own state is not "elsewhere"
        # a worker whose own loops are all fine sees the first one's failing loop
        assert _loops_worker(directory, "1", "")["elsewhere"] == ["retention"]
        # a worker that has exited leaves the live gauges: nothing fails elsewhere any more
        forget_process(directory, int(failing["pid"]))  # type: ignore[call-overload]
        assert _loops_worker(directory, "1", "")["elsewhere"] == []
        # a lone process has no other worker
        assert LocalFigures(Metrics()).failing_elsewhere() == set()
    finally:
        remove_shared_dir(directory)


def test_a_starting_workers_empty_file_does_not_fail_the_reading() -> None:
    directory = create_shared_dir()
    try:
        _worker(directory, "0", 3, 1)
        # another worker has just created its file and not sized it yet
        (directory / "counter_999999.db").touch()
        (directory / "gauge_livemax_999999.db").touch()
        done = _worker(directory, "reader", 2, 1)
        assert json.loads(done.stdout)["counters"]["push_requests"] == 5
    finally:
        remove_shared_dir(directory)

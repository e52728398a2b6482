"""The broker's figures: counters kept as plain integers by the one Trio thread, and how
``/metrics`` reads them, for one process or for every worker of ``queen serve --workers N``.

Counters only go up. Ratios such as requests per transaction are derived by the reader
(``push_requests_committed / push_transactions``).

An increment on the push path stays a plain attribute update (``metrics.push_items += n``,
~50 ns). A :class:`Figures` object turns them into Prometheus families:

- :class:`LocalFigures` (one process: ``queen serve`` alone, or a program embedding the
  broker) reads this process's values when asked; nothing to set up.
- :class:`SharedFigures` (a worker of ``queen serve --workers N``) publishes this process's
  values into ``prometheus_client``'s multiprocess files (one directory, created and removed
  by the parent) every :data:`PUBLISH_INTERVAL_S` and before every answer it gives, and reads
  every worker's files through ``MultiProcessCollector``: counters are summed over every
  process the service has run (a worker gone keeps its file, so no total goes back), gauges
  are combined per family (:attr:`Family.mode`), and per-process gauges carry the worker's
  ``pid`` and ``worker`` labels. Writing the files on every increment instead costs ~2.5 µs
  (a lock and an mmap write, measured by ``bench/metric_increment.py``), fifty times the
  plain update, on a path that makes about ten of them per push.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

PUBLISH_INTERVAL_S = 1.0
"""How often a worker publishes its values for the other workers' answers."""


@dataclass(slots=True)
class Metrics:
    push_requests: int = 0  # push calls accepted (HTTP or embedded)
    push_items: int = 0
    push_items_queued: int = 0
    push_items_duplicate: int = 0
    push_items_buffered: int = 0
    push_items_failed: int = 0
    push_transactions: int = 0  # committed push transactions
    push_transaction_failures: int = 0
    push_transaction_seconds: float = 0.0  # time spent in committed push transactions
    push_segments: int = 0  # segment writes committed (one per partition per transaction)
    push_requests_committed: int = 0  # partition requests those segments carried
    push_frames_committed: int = 0  # frames sent in committed transactions
    max_partitions_per_transaction: int = 0
    actors_started: int = 0
    actors_stopped_idle: int = 0
    actor_crashes: int = 0
    actors_active: int = 0
    spool_appended_items: int = 0  # frames made durable in the spool
    spool_fsyncs: int = 0
    spool_write_failures: int = 0
    spool_replayed_items: int = 0  # frames committed by replay (duplicates included)
    spool_replay_duplicates: int = 0
    spool_damaged_ranges: int = 0  # torn or corrupt ranges skipped in spool files
    spool_dropped_deleted_queue_items: int = 0  # spooled before their queue was deleted
    retention_passes: int = 0  # retention passes this process ran
    retention_segments_removed: int = 0
    retention_messages_removed: int = 0
    retention_traces_removed: int = 0  # traces whose messages were gone
    dedup_rows_pruned: int = 0  # sidecar rows outside their window, removed
    eviction_segments_removed: int = 0  # segments removed past maxWaitTimeSeconds
    eviction_messages_removed: int = 0
    pop_requests: int = 0  # pops answered (HTTP or embedded)
    pop_empty: int = 0  # of which nothing to deliver (204)
    pop_messages: int = 0  # messages delivered
    pop_lag_seconds: float = 0.0  # summed over delivered messages: pop time less creation
    pop_undecryptable: int = 0  # messages withheld: encrypted, and the key cannot open them
    pop_rechecks_shared: int = 0  # re-checks of waiting pops answered by a like pop's look
    pop_busy: int = 0  # pops answered 503: no room for their answer in the byte budget
    ack_requests: int = 0  # ack and ack/batch calls
    acks: int = 0  # acknowledgments judged by ack and ack/batch
    acks_refused: int = 0  # of which refused (stale lease, unknown message)
    acks_dlq: int = 0  # of which moved a message to the dead letter queue
    transactions: int = 0
    transactions_failed: int = 0  # rolled back
    transactions_refused: int = 0  # a pushed partition could not be written now (503)
    streams_cycles: int = 0  # streaming cycles judged
    streams_cycles_failed: int = 0  # of which nothing applied (stale lease, unknown message)
    http_connections_open: int = 0
    http_connections_accepted: int = 0
    http_connections_shed: int = 0  # idle connections closed to make room for a new one
    http_connections_refused: int = 0  # new connections answered 503: every one was busy

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Family:
    """One Prometheus family: ``queen_<name>`` (counters end in ``_total``)."""

    kind: str  # "counter" or "gauge"
    help: str
    mode: str = "livesum"  # gauges: how the workers' values combine (prometheus_client's mode)
    label: str | None = None  # a labelled family's one label


def _c(help_text: str, label: str | None = None) -> Family:
    return Family("counter", help_text, label=label)


def _g(help_text: str, mode: str = "livesum", label: str | None = None) -> Family:
    return Family("gauge", help_text, mode, label)


FAMILIES: dict[str, Family] = {
    "push_requests": _c("Push calls accepted (HTTP or embedded)."),
    "push_items": _c("Items in accepted pushes."),
    "push_items_queued": _c("Pushed items stored (answered queued)."),
    "push_items_duplicate": _c("Pushed items answered duplicate (transactionId seen before)."),
    "push_items_buffered": _c("Pushed items written to the spool (database away)."),
    "push_items_failed": _c("Pushed items answered failed."),
    "push_transactions": _c("Push transactions committed."),
    "push_transaction_failures": _c("Push transactions that failed."),
    "push_transaction_seconds": _c("Seconds spent in committed push transactions."),
    "push_segments": _c("Segment writes committed (one per partition per transaction)."),
    "push_requests_committed": _c("Partition requests carried by committed segments."),
    "push_frames_committed": _c("Frames sent in committed push transactions."),
    "max_partitions_per_transaction": _g("Most partitions one push transaction wrote.", "max"),
    "actors_started": _c("Partition actors started."),
    "actors_stopped_idle": _c("Partition actors stopped after idling."),
    "actor_crashes": _c("Partition actors that crashed."),
    "actors_active": _g("Partition actors running now."),
    "spool_appended_items": _c("Frames made durable in the spool."),
    "spool_fsyncs": _c("Spool fsync calls."),
    "spool_write_failures": _c("Spool writes that failed."),
    "spool_replayed_items": _c("Spooled frames committed by replay (duplicates included)."),
    "spool_replay_duplicates": _c("Replayed frames that were duplicates."),
    "spool_damaged_ranges": _c("Torn or corrupt ranges skipped in spool files."),
    "spool_dropped_deleted_queue_items": _c("Spooled frames dropped: their queue was deleted."),
    "retention_passes": _c("Retention passes run."),
    "retention_segments_removed": _c("Segments removed by retention."),
    "retention_messages_removed": _c("Messages removed by retention."),
    "retention_traces_removed": _c("Traces removed: their messages were gone."),
    "dedup_rows_pruned": _c("Dedup sidecar rows removed outside their window."),
    "eviction_segments_removed": _c("Segments removed past maxWaitTimeSeconds."),
    "eviction_messages_removed": _c("Messages removed past maxWaitTimeSeconds."),
    "pop_requests": _c("Pops answered (HTTP or embedded)."),
    "pop_empty": _c("Pops answered with nothing to deliver."),
    "pop_messages": _c("Messages delivered by pops."),
    "pop_lag_seconds": _c(
        "Seconds delivered messages waited (pop time less creation), summed; "
        "divide its rate by pop_messages' for the average lag."
    ),
    "pop_undecryptable": _c("Messages withheld: encrypted and the key cannot open them."),
    "pop_rechecks_shared": _c("Re-checks of waiting pops answered by a like pop's look."),
    "pop_busy": _c("Pops answered 503 without looking: no room for an answer in the byte budget."),
    "ack_requests": _c("Ack calls (ack and ack/batch)."),
    "acks": _c("Acknowledgments judged (ack and ack/batch)."),
    "acks_refused": _c("Acknowledgments refused (stale lease, unknown message)."),
    "acks_dlq": _c("Acknowledgments that moved a message to the dead letter queue."),
    "transactions": _c("Transactions judged."),
    "transactions_failed": _c("Transactions rolled back."),
    "transactions_refused": _c("Transactions refused: a pushed partition could not be written."),
    "streams_cycles": _c("Streaming cycles judged."),
    "streams_cycles_failed": _c("Streaming cycles of which nothing applied."),
    "http_connections_open": _g("HTTP connections open now."),
    "http_connections_accepted": _c("HTTP connections accepted."),
    "http_connections_shed": _c("Idle HTTP connections closed to make room for a new one."),
    "http_connections_refused": _c("New HTTP connections answered 503: every one was busy."),
    # read from the process, not kept in Metrics (the last five are the original's names)
    "cpu_seconds": _c("CPU seconds (user and system) of the broker processes."),
    "cpu_user_microseconds": _c("Cumulative user CPU time of the broker, in microseconds."),
    "cpu_system_microseconds": _c("Cumulative system CPU time of the broker, in microseconds."),
    "process_resident_memory_bytes": _g("Resident set size of the broker, in bytes."),
    "process_virtual_memory_bytes": _g("Virtual memory size of the broker, in bytes."),
    "uptime_seconds": _g("Seconds since the broker started (its oldest process).", "livemax"),
    # the operations room's gauges
    "process_id": _g("The broker process (with --workers: one sample per worker).", "liveall"),
    "database_up": _g("1 while the database answers (with --workers: every worker).", "livemin"),
    "maintenance_mode": _g("1 while push maintenance mode is on.", "livemax"),
    "spool_pending_items": _g("Frames in the spool not yet replayed.", "livemax"),
    "spool_files": _g("Files in the spool directory.", "livemax"),
    "spool_oldest_age_seconds": _g("Age of the oldest spooled frame, in seconds.", "livemax"),
    "spool_replay_rate": _g("Frames replayed per second by the last replay."),
    "spool_quarantined_ranges": _g("Damaged spool ranges set aside.", "livemax"),
    "spool_quarantined_bytes": _g("Bytes of damaged spool ranges set aside.", "livemax"),
    "db_pool_size": _g("Connections the PostgreSQL pools may hold (every process)."),
    "db_pool_idle": _g("Pool connections free for a call now (every process)."),
    "db_pool_active": _g("Pool connections in use by a call now (every process)."),
    "background_errors": _c("Errors raised by each background loop.", label="loop"),
    "background_loop_failing": _g(
        "1 while a background loop keeps failing (with --workers: any worker).",
        "livemax",
        label="loop",
    ),
}

_COUNTERS = tuple(f.name for f in dataclasses.fields(Metrics) if FAMILIES[f.name].kind == "counter")
_GAUGES = tuple(f.name for f in dataclasses.fields(Metrics) if FAMILIES[f.name].kind == "gauge")

Gauges = Mapping[str, float]
Labelled = Mapping[str, tuple[str, Mapping[str, float]]]
"""Labelled families: name -> (label, value by label value)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """What the system says of this process."""

    user_s: float
    system_s: float
    rss_bytes: int
    vms_bytes: int

    def families(self, started_at: float) -> dict[str, float]:
        return {
            "cpu_seconds": self.user_s + self.system_s,
            "cpu_user_microseconds": round(self.user_s * 1e6),
            "cpu_system_microseconds": round(self.system_s * 1e6),
            "process_resident_memory_bytes": float(self.rss_bytes),
            "process_virtual_memory_bytes": float(self.vms_bytes),
            "uptime_seconds": round(time.time() - started_at, 3),
        }


def process_usage() -> Usage:
    """This process's CPU seconds and memory."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open("/proc/self/statm", "rb") as statm:
            fields = statm.read().split()
        page = resource.getpagesize()
        vms, rss = int(fields[0]) * page, int(fields[1]) * page
    except (OSError, ValueError, IndexError):
        vms, rss = 0, usage.ru_maxrss * 1024
    return Usage(usage.ru_utime, usage.ru_stime, rss, vms)


@dataclass(frozen=True, slots=True)
class Reading:
    """Counter totals of the whole service (every process), for rates and ``/metrics`` JSON."""

    counters: dict[str, float]
    cpu_s: float
    rss_bytes: int
    processes: int  # broker processes live now


class Figures(Protocol):
    metrics: Metrics
    shared: bool

    def publish(self, gauges: Gauges, labelled: Labelled) -> None:
        """Make this process's values visible to every process answering ``/metrics``."""

    def read(self) -> Reading:
        """The service's counter totals now."""

    def exposition(self, gauges: Gauges, labelled: Labelled) -> str:
        """Every family in Prometheus' text format, ``# HELP`` and ``# TYPE`` included."""

    def failing_elsewhere(self) -> set[str]:
        """The background loops another process of the service last published as failing."""


class _Families:
    """A collector over ready-made families."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _text(*collectors: object) -> str:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry).decode()


class LocalFigures:
    """One process's figures, read from its values when asked."""

    shared = False

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.started_at = time.time()

    def publish(self, gauges: Gauges, labelled: Labelled) -> None:
        return None

    def failing_elsewhere(self) -> set[str]:
        return set()  # no other process

    def read(self) -> Reading:
        usage = process_usage()
        counters: dict[str, float] = {**self.metrics.snapshot(), **usage.families(0.0)}
        return Reading(counters, usage.user_s + usage.system_s, usage.rss_bytes, 1)

    def families(self, gauges: Gauges, labelled: Labelled) -> list[Metric]:
        values: dict[str, float] = {
            **self.metrics.snapshot(),
            **process_usage().families(self.started_at),
            **gauges,
        }
        out: list[Metric] = []
        for name, value in values.items():
            family = FAMILIES[name]
            metric: Metric
            if family.kind == "counter":
                metric = CounterMetricFamily(f"queen_{name}", family.help, value=value)
            else:
                metric = GaugeMetricFamily(f"queen_{name}", family.help, value=value)
            out.append(metric)
        for name, (label, by_value) in labelled.items():
            family = FAMILIES[name]
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = kind(f"queen_{name}", family.help, labels=[label])
            for key, value in by_value.items():
                metric.add_metric([key], value)
            out.append(metric)
        return out

    def exposition(self, gauges: Gauges, labelled: Labelled) -> str:
        return _text(_Families(with_original_names(self.families(gauges, labelled))))


class SharedFigures:
    """A worker's figures: published into the service's multiprocess directory and read from
    every worker's files there.

    One per process: ``prometheus_client`` keeps one set of files per process id, opened in
    the directory named by ``PROMETHEUS_MULTIPROC_DIR`` (the parent sets it for its workers).
    """

    shared = True

    def __init__(self, metrics: Metrics, directory: Path, worker: str) -> None:
        from prometheus_client import values

        self.metrics = metrics
        self.directory = directory
        self.worker = worker
        self.started_at = time.time()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
        if not getattr(values.ValueClass, "_multiprocess", False):
            values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        for name, family in FAMILIES.items():
            labels = [family.label] if family.label else []
            if family.kind == "counter":
                self._counters[name] = Counter(f"queen_{name}", family.help, labels, registry=None)
            else:
                if family.mode in ("all", "liveall"):
                    labels.append("worker")
                self._gauges[name] = Gauge(
                    f"queen_{name}",
                    family.help,
                    labels,
                    registry=None,
                    multiprocess_mode=family.mode,  # type: ignore[arg-type]
                )
        self._published: dict[tuple[str, str], float] = {}

    def _add(self, name: str, value: float, label: str = "") -> None:
        """Raise the published total of counter ``name`` to ``value`` (never lower it)."""
        key = (name, label)
        step = value - self._published.get(key, 0.0)
        if step <= 0:
            return
        counter = self._counters[name]
        (counter.labels(label) if label else counter).inc(step)
        self._published[key] = value

    def _set(self, name: str, value: float, label: str = "") -> None:
        gauge = self._gauges[name]
        if FAMILIES[name].mode in ("all", "liveall"):
            gauge.labels(*([label] if label else []), self.worker).set(value)
        elif label:
            gauge.labels(label).set(value)
        else:
            gauge.set(value)

    def publish(self, gauges: Gauges, labelled: Labelled) -> None:
        snapshot = self.metrics.snapshot()
        for name in _COUNTERS:
            self._add(name, snapshot[name])
        for name in _GAUGES:
            self._set(name, snapshot[name])
        for name, value in process_usage().families(self.started_at).items():
            if FAMILIES[name].kind == "counter":
                self._add(name, value)
            else:
                self._set(name, value)
        for name, value in gauges.items():
            self._set(name, value)
        for name, (_label, by_value) in labelled.items():
            for key, value in by_value.items():
                if FAMILIES[name].kind == "counter":
                    self._add(name, value, key)
                else:
                    self._set(name, value, key)

    def _collect(self) -> list[Metric]:
        # A worker that is starting creates its files empty, then sizes them: an empty one
        # holds nothing yet (read, it would fail the whole reading).
        while True:
            files = [str(p) for p in self.directory.glob("*.db") if _sized(p)]
            try:
                return list(MultiProcessCollector.merge(files, accumulate=True))  # type: ignore[no-untyped-call]
            except FileNotFoundError:
                continue  # a dead worker's live gauges removed meanwhile: read again

    def read(self) -> Reading:
        counters: dict[str, float] = {}
        rss = 0.0
        processes = 0
        for metric in self._collect():
            short = metric.name.removeprefix("queen_")
            for sample in metric.samples:
                if metric.type == "counter" and not sample.labels:
                    counters[short] = sample.value
                elif short == "process_resident_memory_bytes":
                    rss = sample.value
                elif short == "process_id":
                    processes += 1
        for name in _COUNTERS:
            counters.setdefault(name, 0.0)
        return Reading(counters, counters.get("cpu_seconds", 0.0), int(rss), processes)

    def exposition(self, gauges: Gauges, labelled: Labelled) -> str:
        self.publish(gauges, labelled)
        return _text(_Families(with_original_names(self._collect())))

    def failing_elsewhere(self) -> set[str]:
        """Read from the other workers' files alone (this process's own state is live)."""
        from prometheus_client.mmap_dict import MmapedDict

        mine = f"_{os.getpid()}.db"
        failing: set[str] = set()
        # (a live gauge: a worker's file goes when the worker dies)
        mode = FAMILIES["background_loop_failing"].mode
        for path in self.directory.glob(f"gauge_{mode}_*.db"):
            if path.name.endswith(mine) or not _sized(path):
                continue
            try:
                entries = list(MmapedDict.read_all_values_from_file(str(path)))  # type: ignore[no-untyped-call]
            except (OSError, RuntimeError, ValueError):
                continue  # a file being removed or grown: the next reading tells
            for key, value, _timestamp, _pos in entries:
                name, _sample, labels, *_rest = json.loads(key)
                if name == "queen_background_loop_failing" and value:
                    failing.add(str(labels.get("loop", "")))
        return failing


def _sized(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False  # removed meanwhile (a worker that died)


# The original broker's gauges served from ours: name -> (help, our sample).
_ORIGINAL_SAME: dict[str, tuple[str, str]] = {
    "queen_file_buffer_pending": (
        "Push events currently buffered to disk awaiting database flush.",
        "queen_spool_pending_items",
    ),
    "queen_file_buffer_db_healthy": (
        "1 if the broker believes the database is healthy, 0 otherwise.",
        "queen_database_up",
    ),
    "queen_maintenance_mode_enabled": (
        "1 when push maintenance mode is active (pushes are buffered to disk), 0 otherwise.",
        "queen_maintenance_mode",
    ),
}

# The original's cluster-wide totals (label scope="cluster"): name -> (help, our counter).
_ORIGINAL_CLUSTER: dict[str, tuple[str, str]] = {
    "queen_cluster_push_requests": ("Push requests handled.", "push_requests"),
    "queen_cluster_pop_requests": ("Pop requests handled.", "pop_requests"),
    "queen_cluster_ack_requests": ("Ack requests handled.", "ack_requests"),
    "queen_cluster_transactions": ("Transaction calls handled.", "transactions"),
    "queen_cluster_push_messages": ("Messages pushed and stored.", "push_items_queued"),
    "queen_cluster_pop_messages": (
        "Messages popped (may exceed push_messages: consumer-group fan-out).",
        "pop_messages",
    ),
    "queen_cluster_ack_messages": ("Ack attempts (one per message).", "acks"),
    "queen_cluster_dlq": ("Messages routed to the dead letter queue.", "acks_dlq"),
    "queen_cluster_db_errors": (
        "Database errors observed (push transactions that failed).",
        "push_transaction_failures",
    ),
}

ORIGINAL_NAMES = (
    *_ORIGINAL_SAME,
    *(f"{name}_total" for name in _ORIGINAL_CLUSTER),
    "queen_cluster_ack_total",
    "queen_shared_state_enabled",
)
"""The original broker's families served beside ours (see docs/operating.md)."""


def with_original_names(families: list[Metric]) -> list[Metric]:
    """``families`` and, computed from them, the original broker's names for the same figures
    (the cluster totals are this service's: every process summed)."""
    values: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            if not sample.labels:
                values[sample.name] = sample.value
    out = list(families)
    for name, (help_text, ours) in _ORIGINAL_SAME.items():
        metric = GaugeMetricFamily(name, help_text, value=values.get(ours, 0.0))
        out.append(metric)
    for name, (help_text, counter) in _ORIGINAL_CLUSTER.items():
        total = CounterMetricFamily(name, f"{help_text} Every process.", labels=["scope"])
        total.add_metric(["cluster"], values.get(f"queen_{counter}_total", 0.0))
        out.append(total)
    acks = values.get("queen_acks_total", 0.0)
    refused = values.get("queen_acks_refused_total", 0.0)
    by_result = CounterMetricFamily(
        "queen_cluster_ack",
        "Acks by result (failed: refused). Every process.",
        labels=["scope", "result"],
    )
    by_result.add_metric(["cluster", "success"], acks - refused)
    by_result.add_metric(["cluster", "failed"], refused)
    out.append(by_result)
    out.append(
        GaugeMetricFamily(
            "queen_shared_state_enabled",
            "1 if cross-replica UDP shared-state sync is enabled (never here).",
            value=0.0,
        )
    )
    return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_labelled_gauges(
    families: dict[str, dict[tuple[tuple[str, str], ...], float]],
    helps: Mapping[str, str] | None = None,
) -> str:
    """Gauges with labels in the Prometheus text format: ``{name: {((label, value), ...): v}}``
    becomes ``queen_<name>{label="value",...} v`` under one ``# HELP`` (from ``helps``, else
    the name) and one ``# TYPE`` line per name."""
    lines: list[str] = []
    for name, samples in families.items():
        text = (helps or {}).get(name, name.replace("_", " "))
        lines.append(f"# HELP queen_{name} {text}")
        lines.append(f"# TYPE queen_{name} gauge")
        for labels, value in samples.items():
            inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
            lines.append(f"queen_{name}{{{inner}}} {value}")
    return "\n".join(lines) + "\n" if lines else ""


METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Names the service's multiprocess directory in a worker's environment."""


def create_shared_dir() -> Path:
    """A new, empty multiprocess directory for the workers of one service (the parent's)."""
    return Path(tempfile.mkdtemp(prefix="queen-metrics-"))


def forget_process(directory: Path, pid: int) -> None:
    """A worker has exited: its live gauges leave the sums (its counters stay in them)."""
    mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


def remove_shared_dir(directory: Path) -> None:
    """The service has stopped: its figures go with it."""
    shutil.rmtree(directory, ignore_errors=True)

"""How ``/metrics`` reads the broker's figures, for one process or for every worker of
``queen serve --workers N``, and writes them in Prometheus' text format
(``prometheus_client``'s families and ``generate_latest``).

A :class:`Figures` object turns the counters of :class:`~queen.metrics.counters.Metrics`
into Prometheus families:

- :class:`LocalFigures` (one process: ``queen serve`` alone, or a program embedding the
  broker) reads this process's values when asked; nothing to set up.
- :class:`SharedFigures` (a worker of ``queen serve --workers N``) publishes this process's
  values into ``prometheus_client``'s multiprocess files (one directory, created and removed
  by the parent) every :data:`PUBLISH_INTERVAL_S` and before every answer it gives, and reads
  every worker's files through ``MultiProcessCollector``: counters are summed over every
  process the service has run (a worker gone keeps its file, so no total goes back), gauges
  are combined per family (:attr:`~queen.metrics.counters.Family.mode`), and per-process
  gauges carry the worker's ``pid`` and ``worker`` labels. Writing the files on every
  increment instead costs ~2.5 µs (a lock and an mmap write, timed in process;
  ``docs/operating.md``), fifty times the plain update, on a path that makes about ten of them
  per push.

Both serve the original broker's names beside ours (:mod:`queen.metrics.original`). The
per-queue gauges, read from the database for each scrape, are written by
:func:`render_labelled_gauges`.
"""

from __future__ import annotations

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

from queen.metrics.counters import COUNTERS, FAMILIES, GAUGES, Metrics
from queen.metrics.original import with_original_names

PUBLISH_INTERVAL_S = 1.0
"""How often a worker publishes its values for the other workers' answers."""


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
        for name in COUNTERS:
            self._add(name, snapshot[name])
        for name in GAUGES:
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
        for name in COUNTERS:
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


LabelledGauges = Mapping[str, Mapping[tuple[tuple[str, str], ...], float]]
"""Gauges with labels: ``{name: {((label, value), ...): value}}``."""


def labelled_gauge_families(
    families: LabelledGauges, helps: Mapping[str, str] | None = None
) -> list[Metric]:
    """``queen_<name>`` gauge families with these samples, each helped by ``helps`` (else by
    its name)."""
    out: list[Metric] = []
    for name, samples in families.items():
        family = GaugeMetricFamily(f"queen_{name}", (helps or {}).get(name, name.replace("_", " ")))
        for labels, value in samples.items():
            family.add_sample(family.name, dict(labels), value)
        out.append(family)
    return out


def render_labelled_gauges(families: LabelledGauges, helps: Mapping[str, str] | None = None) -> str:
    """:func:`labelled_gauge_families` in Prometheus' text format."""
    return _text(_Families(labelled_gauge_families(families, helps)))


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

"""What the benchmark runs (docs/benchmark.md), the ceilings it is compared with, and the
targets it is judged by."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class Load:
    """``items`` per request spread round-robin over ``partitions``, from ``connections``
    clients in a closed loop (wrk's connections, or tasks in process)."""

    items: int
    connections: int
    partitions: int
    duplicates: bool = False  # every request is sent twice: half of the items are duplicates

    def describe(self) -> str:
        items, partitions = _count(self.items, "item"), _count(self.partitions, "partition")
        text = f"{items}/request, {self.connections} connections, {partitions}"
        return text + (", every request twice" if self.duplicates else "")


@dataclass(frozen=True, slots=True)
class HttpCeiling:
    """The bare HTTP stack under ``load`` with ``workers`` processes."""

    name: str
    load: Load
    workers: int = 1

    def describe(self) -> str:
        items = _count(self.load.items, "item")
        text = f"{items}/request, {self.load.connections} connections"
        return text + (f", {self.workers} processes" if self.workers > 1 else "")


@dataclass(frozen=True, slots=True)
class PgShape:
    """A batch as the broker receives it: ``items`` frames over ``partitions`` round-robin."""

    name: str
    items: int
    partitions: int

    def describe(self) -> str:
        items = _count(self.items, "item")
        segments = _count(min(self.items, self.partitions), "segment")
        return f"{items}/batch in {segments} (of {self.partitions} partitions)"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    load: Load
    http: str  # name of the HTTP ceiling it is compared with
    pg: str  # name of the PostgreSQL shape it is compared with
    workers: int = 1
    note: str = ""

    def describe(self) -> str:
        text = self.load.describe()
        return text + (f", {self.workers} broker processes" if self.workers > 1 else "")


@dataclass(frozen=True, slots=True)
class Embedded:
    """``load`` pushed in process by ``load.connections`` tasks calling ``broker.push()``."""

    name: str
    load: Load
    pg: str  # name of the PostgreSQL shape it is compared with
    note: str = ""

    def describe(self) -> str:
        load = self.load
        items, partitions = _count(load.items, "item"), _count(load.partitions, "partition")
        return f"broker.push(): {items}/call, {load.connections} tasks, {partitions}"


@dataclass(frozen=True, slots=True)
class ConsumeLoad:
    """``messages`` in ``partitions``, drained by ``consumers`` tasks popping ``batch`` in queue
    mode (autopilot) and acking each batch with one call."""

    name: str
    messages: int
    partitions: int
    consumers: int
    batch: int
    fan_out: bool = False  # a first group drains the queue before the measured one reads it
    single_pops: bool = False  # time single pops (batch=1) on the full queue first
    note: str = ""

    def describe(self) -> str:
        text = f"{_count(self.messages, 'message')} in {_count(self.partitions, 'partition')}, "
        text += f"{self.consumers} consumers, batch={self.batch}"
        return text + (", a second group after a first drained it" if self.fan_out else "")


def _by_name(*items: Any) -> dict[str, Any]:
    return {item.name: item for item in items}


HTTP_CEILINGS: dict[str, HttpCeiling] = _by_name(
    HttpCeiling("H1", Load(1, 64, 100)),
    HttpCeiling("H2", Load(10, 32, 100)),
    HttpCeiling("H3", Load(100, 32, 10)),
    HttpCeiling("H3x2", Load(100, 32, 10), workers=2),
)
PG_SHAPES: dict[str, PgShape] = _by_name(
    PgShape("P1", 1, 100), PgShape("P2", 10, 100), PgShape("P3", 100, 10)
)
SCENARIOS: dict[str, Scenario] = _by_name(
    Scenario("S1", Load(1, 64, 100), "H1", "P1", note="coalescing of small pushes"),
    Scenario("S2", Load(10, 32, 100), "H2", "P2"),
    Scenario("S3", Load(100, 32, 10), "H3", "P3", note="large batches"),
    Scenario("S4", Load(1, 64, 10_000), "H1", "P1", note="actor churn, broker RSS"),
    Scenario("S5", Load(1, 64, 100, duplicates=True), "H1", "P1", note="half duplicates"),
    Scenario("S6", Load(100, 32, 10), "H3x2", "P3", workers=2, note="S3 on 2 processes"),
)
EMBEDDED: dict[str, Embedded] = _by_name(
    Embedded("E1", Load(1, 64, 100), "P1", note="embedding API, small pushes"),
    Embedded("E2", Load(10, 32, 100), "P2", note="embedding API"),
    Embedded("E3", Load(100, 16, 10), "P3", note="embedding API, large batches"),
)
CONSUME: dict[str, ConsumeLoad] = _by_name(
    ConsumeLoad("C1", 100_000, 100, 8, 100, note="queue mode"),
    ConsumeLoad("C2", 10_000, 10_000, 8, 10, single_pops=True, note="one message each"),
    ConsumeLoad("C3", 100_000, 100, 8, 100, fan_out=True, note="consumer-group fan-out"),
)

AnyScenario = Scenario | Embedded | ConsumeLoad
ALL: dict[str, AnyScenario] = {**SCENARIOS, **EMBEDDED, **CONSUME}


def pick(names: str, known: Sequence[str], what: str = "scenario") -> list[str]:
    """Names from a list such as ``"S1,E2,C1"`` (``"all"``: every one), in ``known``'s order."""
    if names.strip().lower() == "all":
        return list(known)
    chosen = {name.strip().upper() for name in names.split(",") if name.strip()}
    if unknown := chosen.difference(known):
        raise ValueError(f"unknown {what} {', '.join(sorted(unknown))} (known: {', '.join(known)})")
    if not chosen:
        raise ValueError(f"no {what} selected")
    return [name for name in known if name in chosen]


def select(names: str) -> list[AnyScenario]:
    """Scenarios by name: HTTP first, then the embedding API, then the consume side."""
    return [ALL[name] for name in pick(names, list(ALL))]


# Targets, judged from a run's scenario records; one whose figure is missing is n/a.

Record = Mapping[str, Any]
_OPS = {">=": ("≥", operator.ge), "<=": ("≤", operator.le), "<": ("<", operator.lt)}


@dataclass(frozen=True, slots=True)
class Target:
    scenario: str
    what: str
    op: str  # ">=", "<=" or "<"
    limit: float
    figure: str  # a field of the record ("latency_ms.p99": nested), or "/S1": msg/s ÷ S1's

    def describe(self) -> str:
        return f"{self.what} {_OPS[self.op][0]} {self.limit:g}"

    def measure(self, record: Record, records: Mapping[str, Record]) -> float | None:
        if self.figure.startswith("/"):
            base = _number((records.get(self.figure[1:]) or {}).get("msg_per_s"))
            mine = _number(record.get("msg_per_s"))
            return mine / base if mine is not None and base else None
        return _number(get(record, *self.figure.split(".")))


def get(record: Any, *keys: str) -> Any:
    """``record[keys[0]][keys[1]]...``, or None where a level is missing."""
    for key in keys:
        record = record.get(key) if isinstance(record, Mapping) else None
    return record


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: str
    target: str
    measured: float | None
    status: str  # "pass", "miss" or "n/a"


TARGETS: tuple[Target, ...] = (
    Target("S1", "msg/s ÷ HTTP ceiling", ">=", 0.7, "vs_http"),
    Target("S1", "requests/transaction", ">=", 8, "requests_per_tx"),
    Target("S1", "p99 latency ms", "<=", 50, "latency_ms.p99"),
    Target("S3", "msg/s ÷ HTTP ceiling", ">=", 0.6, "vs_http"),
    Target("S3", "msg/s", ">=", 60_000, "msg_per_s"),
    Target("S4", "msg/s ÷ S1 msg/s", ">=", 0.75, "/S1"),
    Target("S4", "broker RSS MB", "<", 500, "rss_mb"),
    Target("S5", "msg/s ÷ S1 msg/s", ">=", 0.8, "/S1"),
    Target("E1", "msg/s ÷ P1 fn-merged", ">=", 0.7, "vs_pg.fn-merged"),
    Target("E2", "msg/s ÷ P2 fn-merged", ">=", 0.7, "vs_pg.fn-merged"),
    Target("E3", "msg/s ÷ P3 fn-merged", ">=", 0.7, "vs_pg.fn-merged"),
    Target("C1", "msg/s ÷ S3 msg/s", ">=", 0.5, "/S3"),
    Target("C2", "msg/s", ">=", 2_000, "msg_per_s"),
    Target("C2", "single pop p50 ms", "<=", 5, "single_pop_ms.p50"),
    Target("C3", "msg/s ÷ S3 msg/s", ">=", 0.5, "/S3"),
)


def evaluate(records: Mapping[str, Record]) -> list[Outcome]:
    """One outcome per target, in the order of :data:`TARGETS`."""
    outcomes = []
    for target in TARGETS:
        record = records.get(target.scenario)
        value = None if record is None else target.measure(record, records)
        met = value is not None and _OPS[target.op][1](value, target.limit)
        status = "n/a" if value is None else "pass" if met else "miss"
        outcomes.append(Outcome(target.scenario, target.describe(), value, status))
    return outcomes

"""What the benchmark runs: the broker scenarios and the ceilings they are compared with.

A scenario is a load (what wrk sends) against a broker of ``workers`` processes. Each scenario
names its HTTP ceiling (the same load against a bare Quart-Trio route, same process count) and
its PostgreSQL ceiling (the same rows per batch written by a plain psycopg loop).
"""

from __future__ import annotations

from dataclasses import dataclass


def _count(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


@dataclass(frozen=True, slots=True)
class Load:
    """One wrk load: ``items`` per request spread round-robin over ``partitions``."""

    items: int
    connections: int
    partitions: int
    duplicates: bool = False  # every request is sent twice: half of the items are duplicates

    def describe(self) -> str:
        text = (
            f"{_count(self.items, 'item', 'items')}/request, {self.connections} connections, "
            f"{_count(self.partitions, 'partition', 'partitions')}"
        )
        return text + (", every request twice" if self.duplicates else "")


@dataclass(frozen=True, slots=True)
class HttpCeiling:
    """The bare HTTP stack under ``load`` with ``workers`` processes."""

    name: str
    load: Load
    workers: int = 1

    def describe(self) -> str:
        items = _count(self.load.items, "item", "items")
        text = f"{items}/request, {self.load.connections} connections"
        return text + (f", {self.workers} processes" if self.workers > 1 else "")


@dataclass(frozen=True, slots=True)
class PgShape:
    """A batch as the broker receives it: ``items`` frames over ``partitions`` round-robin."""

    name: str
    items: int
    partitions: int

    @property
    def partitions_per_batch(self) -> int:
        return min(self.items, self.partitions)

    def describe(self) -> str:
        items = _count(self.items, "item", "items")
        segments = _count(self.partitions_per_batch, "segment", "segments")
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
        if self.workers > 1:
            text += f", {self.workers} broker processes"
        return text


HTTP_CEILINGS: dict[str, HttpCeiling] = {
    c.name: c
    for c in (
        HttpCeiling("H1", Load(1, 64, 100)),
        HttpCeiling("H2", Load(10, 32, 100)),
        HttpCeiling("H3", Load(100, 32, 10)),
        HttpCeiling("H3x2", Load(100, 32, 10), workers=2),
    )
}

PG_SHAPES: dict[str, PgShape] = {
    s.name: s
    for s in (
        PgShape("P1", 1, 100),
        PgShape("P2", 10, 100),
        PgShape("P3", 100, 10),
    )
}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("S1", Load(1, 64, 100), "H1", "P1", note="coalescing of small pushes"),
        Scenario("S2", Load(10, 32, 100), "H2", "P2"),
        Scenario("S3", Load(100, 32, 10), "H3", "P3", note="large batches"),
        Scenario("S4", Load(1, 64, 10_000), "H1", "P1", note="actor churn, broker RSS"),
        Scenario("S5", Load(1, 64, 100, duplicates=True), "H1", "P1", note="half duplicates"),
        Scenario("S6", Load(100, 32, 10), "H3x2", "P3", workers=2, note="S3 on 2 processes"),
    )
}


@dataclass(frozen=True, slots=True)
class Embedded:
    """``load`` pushed in process through ``broker.push()``: ``load.connections`` is the
    number of tasks, each calling it in a closed loop."""

    name: str
    load: Load
    pg: str  # name of the PostgreSQL shape it is compared with
    note: str = ""

    def describe(self) -> str:
        return (
            f"broker.push(): {_count(self.load.items, 'item', 'items')}/call, "
            f"{self.load.connections} tasks, "
            f"{_count(self.load.partitions, 'partition', 'partitions')}"
        )


@dataclass(frozen=True, slots=True)
class ConsumeLoad:
    """``messages`` in ``partitions`` partitions, drained by ``consumers`` tasks popping
    ``batch`` in queue mode (with autopilot, as the official client's ``consume()`` with
    ``.batch(n)``: the broker chooses the partitions per pop) and acking each batch with one
    call."""

    name: str
    messages: int
    partitions: int
    consumers: int
    batch: int
    fan_out: bool = False  # a first group drains the queue before the measured one reads it
    single_pops: bool = False  # time single pops (batch=1) on the full queue first
    note: str = ""

    def describe(self) -> str:
        text = (
            f"{_count(self.messages, 'message', 'messages')} in "
            f"{_count(self.partitions, 'partition', 'partitions')}, "
            f"{self.consumers} consumers, batch={self.batch}"
        )
        return text + (", a second group after a first drained it" if self.fan_out else "")


EMBEDDED: dict[str, Embedded] = {
    e.name: e
    for e in (
        Embedded("E1", Load(1, 64, 100), "P1", note="embedding API, small pushes"),
        Embedded("E2", Load(10, 32, 100), "P2", note="embedding API"),
        Embedded("E3", Load(100, 16, 10), "P3", note="embedding API, large batches"),
    )
}

CONSUME: dict[str, ConsumeLoad] = {
    c.name: c
    for c in (
        ConsumeLoad("C1", 100_000, 100, 8, 100, note="queue mode"),
        ConsumeLoad("C2", 10_000, 10_000, 8, 10, single_pops=True, note="one message each"),
        ConsumeLoad("C3", 100_000, 100, 8, 100, fan_out=True, note="consumer-group fan-out"),
    )
}

AnyScenario = Scenario | Embedded | ConsumeLoad
ALL: dict[str, AnyScenario] = {**SCENARIOS, **EMBEDDED, **CONSUME}


def select(names: str) -> list[AnyScenario]:
    """Scenarios from a comma-separated list such as ``"S1,E2,C1"`` (``"all"``: every one),
    HTTP scenarios first, then the embedding API, then the consume side."""
    if names.strip().lower() == "all":
        return list(ALL.values())
    chosen: list[AnyScenario] = []
    for raw in names.split(","):
        name = raw.strip().upper()
        if not name:
            continue
        if name not in ALL:
            known = ", ".join(ALL)
            raise ValueError(f"unknown scenario {raw.strip()!r} (known: {known})")
        if ALL[name] not in chosen:
            chosen.append(ALL[name])
    if not chosen:
        raise ValueError("no scenario selected")
    order = list(ALL)
    return sorted(chosen, key=lambda s: order.index(s.name))

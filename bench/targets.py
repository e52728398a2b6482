"""The push path's targets on the reference machine, judged from a run's scenario records.

A scenario record is the JSON object the harness writes per scenario (HTTP, embedding API or
consume: the names never collide); the fields read here are ``msg_per_s``, ``vs_http`` (msg/s
as a fraction of its HTTP ceiling), ``vs_pg`` (per PostgreSQL ceiling variant),
``requests_per_tx``, ``latency_ms["p99"]``, ``single_pop_ms["p50"]`` and ``rss_mb``. A
target whose figure is missing (scenario or ceiling not run) is ``n/a``, never a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Record = Mapping[str, Any]
Records = Mapping[str, Record]


@dataclass(frozen=True, slots=True)
class Target:
    scenario: str
    what: str
    op: str  # ">=" or "<"/"<="
    limit: float
    figure: Callable[[Record, Records], float | None]

    def describe(self) -> str:
        sign = {">=": "≥", "<=": "≤", "<": "<"}[self.op]
        return f"{self.what} {sign} {self.limit:g}"


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: str
    target: str
    measured: float | None
    status: str  # "pass", "miss" or "n/a"


def _field(name: str) -> Callable[[Record, Records], float | None]:
    def get(record: Record, _all: Records) -> float | None:
        value = record.get(name)
        return float(value) if isinstance(value, int | float) else None

    return get


def _p99(record: Record, _all: Records) -> float | None:
    value = (record.get("latency_ms") or {}).get("p99")
    return float(value) if isinstance(value, int | float) else None


def _vs(other: str) -> Callable[[Record, Records], float | None]:
    def get(record: Record, records: Records) -> float | None:
        mine, base = record.get("msg_per_s"), (records.get(other) or {}).get("msg_per_s")
        if not isinstance(mine, int | float) or not isinstance(base, int | float) or base <= 0:
            return None
        return float(mine) / float(base)

    return get


_vs_s1 = _vs("S1")


def _vs_pg(variant: str) -> Callable[[Record, Records], float | None]:
    def get(record: Record, _all: Records) -> float | None:
        value = (record.get("vs_pg") or {}).get(variant)
        return float(value) if isinstance(value, int | float) else None

    return get


def _p50(name: str) -> Callable[[Record, Records], float | None]:
    def get(record: Record, _all: Records) -> float | None:
        value = (record.get(name) or {}).get("p50")
        return float(value) if isinstance(value, int | float) else None

    return get


TARGETS: tuple[Target, ...] = (
    Target("S1", "msg/s ÷ HTTP ceiling", ">=", 0.7, _field("vs_http")),
    Target("S1", "requests/transaction", ">=", 8, _field("requests_per_tx")),
    Target("S1", "p99 latency ms", "<=", 50, _p99),
    Target("S3", "msg/s ÷ HTTP ceiling", ">=", 0.6, _field("vs_http")),
    Target("S3", "msg/s", ">=", 60_000, _field("msg_per_s")),
    Target("S4", "msg/s ÷ S1 msg/s", ">=", 0.75, _vs_s1),
    Target("S4", "broker RSS MB", "<", 500, _field("rss_mb")),
    Target("S5", "msg/s ÷ S1 msg/s", ">=", 0.8, _vs_s1),
    Target("E1", "msg/s ÷ P1 fn-merged", ">=", 0.7, _vs_pg("fn-merged")),
    Target("E2", "msg/s ÷ P2 fn-merged", ">=", 0.7, _vs_pg("fn-merged")),
    Target("E3", "msg/s ÷ P3 fn-merged", ">=", 0.7, _vs_pg("fn-merged")),
    Target("C1", "msg/s ÷ S3 msg/s", ">=", 0.5, _vs("S3")),
    Target("C2", "msg/s", ">=", 2_000, _field("msg_per_s")),
    Target("C2", "single pop p50 ms", "<=", 5, _p50("single_pop_ms")),
    Target("C3", "msg/s ÷ S3 msg/s", ">=", 0.5, _vs("S3")),
)


def _meets(value: float, op: str, limit: float) -> bool:
    if op == ">=":
        return value >= limit
    if op == "<=":
        return value <= limit
    if op == "<":
        return value < limit
    raise ValueError(f"unknown comparison {op!r}")


def evaluate(records: Records, targets: tuple[Target, ...] = TARGETS) -> list[Outcome]:
    """One outcome per target, in the order of ``targets``."""
    outcomes: list[Outcome] = []
    for target in targets:
        record = records.get(target.scenario)
        value = None if record is None else target.figure(record, records)
        if value is None:
            status = "n/a"
        else:
            status = "pass" if _meets(value, target.op, target.limit) else "miss"
        outcomes.append(Outcome(target.scenario, target.describe(), value, status))
    return outcomes

"""The broker's /metrics counters: read them from every worker and take window deltas.

Counters are per process. Behind one port with several workers, each fresh connection reaches
one of them; ``queen_process_id`` says which, so the harness asks until every worker has
answered, then sums.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

Snapshot = dict[int, dict[str, float]]  # process id -> metric -> value

PUSH_COUNTERS = (
    "queen_push_requests_total",
    "queen_push_items_total",
    "queen_push_items_queued_total",
    "queen_push_items_duplicate_total",
    "queen_push_items_buffered_total",
    "queen_push_items_failed_total",
    "queen_push_transactions_total",
    "queen_push_transaction_failures_total",
    "queen_push_segments_total",
    "queen_push_requests_committed_total",
    "queen_push_frames_committed_total",
    "queen_actors_started_total",
)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format, unlabelled samples only (all the broker writes)."""
    values: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "{" in line:
            continue
        parts = line.split()
        if len(parts) >= 2:
            try:
                values[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return values


def fetch_metrics(base_url: str, processes: int = 1, timeout_s: float = 30.0) -> Snapshot:
    """One reading of every process behind ``base_url`` (``processes`` of them)."""
    deadline = time.monotonic() + timeout_s
    seen: Snapshot = {}
    while True:
        request = urllib.request.Request(f"{base_url}/metrics", headers={"Connection": "close"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            values = parse_metrics(answer.read().decode())
        seen[int(values.get("queen_process_id", 0))] = values
        if len(seen) >= processes:
            return seen
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {len(seen)} of {processes} broker processes answered /metrics"
            )


def delta(
    before: Mapping[int, Mapping[str, float]],
    after: Mapping[int, Mapping[str, float]],
    names: tuple[str, ...] = PUSH_COUNTERS,
) -> dict[str, float]:
    """Per counter, the increase summed over processes (a process absent before counts
    from zero)."""
    totals = dict.fromkeys(names, 0.0)
    for pid, values in after.items():
        earlier = before.get(pid, {})
        for name in names:
            totals[name] += values.get(name, 0.0) - earlier.get(name, 0.0)
    return totals


@dataclass(frozen=True, slots=True)
class PushFigures:
    """What the counters say about a measured window."""

    requests: float
    items: float
    queued: float
    duplicates: float
    failed: float  # failed + buffered: not stored by this run
    transactions: float
    segments: float
    requests_per_tx: float | None
    partitions_per_tx: float | None
    frames_per_tx: float | None
    actors_started: float


def push_figures(d: Mapping[str, float]) -> PushFigures:
    tx = d.get("queen_push_transactions_total", 0.0)

    def per_tx(name: str) -> float | None:
        return d.get(name, 0.0) / tx if tx > 0 else None

    return PushFigures(
        requests=d.get("queen_push_requests_total", 0.0),
        items=d.get("queen_push_items_total", 0.0),
        queued=d.get("queen_push_items_queued_total", 0.0),
        duplicates=d.get("queen_push_items_duplicate_total", 0.0),
        failed=d.get("queen_push_items_failed_total", 0.0)
        + d.get("queen_push_items_buffered_total", 0.0),
        transactions=tx,
        segments=d.get("queen_push_segments_total", 0.0),
        requests_per_tx=per_tx("queen_push_requests_committed_total"),
        partitions_per_tx=per_tx("queen_push_segments_total"),
        frames_per_tx=per_tx("queen_push_frames_committed_total"),
        actors_started=d.get("queen_actors_started_total", 0.0),
    )

"""The broker's /metrics counters: read them and take window deltas.

Counters are the whole service's: with several workers behind one port, whichever answers sums
every worker's (``queen_process_id`` has one sample per worker, labelled ``pid`` and
``worker``), so one reading suffices once every worker has published its figures.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

Snapshot = dict[int, dict[str, float]]  # reading -> metric -> value (one reading: key 0)

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


def process_count(text: str) -> int:
    """How many broker processes a /metrics answer covers (samples of ``queen_process_id``)."""
    return sum(
        1
        for line in text.splitlines()
        if line.startswith("queen_process_id ") or line.startswith("queen_process_id{")
    )


SETTLE_S = 1.2
"""A worker publishes its figures every second: after this long, a reading has every
worker's counts up to the moment the reading began."""


def fetch_metrics(base_url: str, processes: int = 1, timeout_s: float = 30.0) -> Snapshot:
    """One reading of the service behind ``base_url``, once it covers ``processes`` broker
    processes (with several, ``SETTLE_S`` after being asked)."""
    deadline = time.monotonic() + timeout_s
    if processes > 1:
        time.sleep(SETTLE_S)
    while True:
        request = urllib.request.Request(f"{base_url}/metrics", headers={"Connection": "close"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read().decode()
        covered = process_count(text)
        if covered >= processes:
            return {0: parse_metrics(text)}
        if time.monotonic() > deadline:
            raise RuntimeError(f"/metrics covers {covered} of {processes} broker processes")
        time.sleep(0.2)


def delta(
    before: Mapping[int, Mapping[str, float]],
    after: Mapping[int, Mapping[str, float]],
    names: tuple[str, ...] = PUSH_COUNTERS,
) -> dict[str, float]:
    """Per counter, the increase summed over readings (one absent before counts from
    zero)."""
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

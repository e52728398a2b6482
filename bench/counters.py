"""The broker's /metrics counters: read them and take window deltas. Whichever worker answers
sums every worker's (``queen_process_id`` has a sample per worker), so one reading suffices
once every worker has published its figures."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Mapping
from typing import Any

COUNTERS = (  # queen_<name>_total: the ones the report reads
    "push_items",
    "push_items_failed",
    "push_items_buffered",
    "push_transactions",
    "push_segments",
    "push_requests_committed",
)
SETTLE_S = 1.2
"""A worker publishes its figures every second: after this long, a reading has every
worker's counts up to the moment the reading began."""


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format, unlabelled samples only (all the broker writes)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("#") and "{" not in line:
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
        if line.startswith(("queen_process_id ", "queen_process_id{"))
    )


def fetch_metrics(base_url: str, processes: int = 1, timeout_s: float = 30.0) -> dict[str, float]:
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
            return parse_metrics(text)
        if time.monotonic() > deadline:
            raise RuntimeError(f"/metrics covers {covered} of {processes} broker processes")
        time.sleep(0.2)


def push_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """What the counters say about a window: each counter's increase (one absent before counts
    from zero), the items not stored by this run, and per transaction the requests and
    partitions (segments)."""
    d = {
        k: after.get(f"queen_{k}_total", 0.0) - before.get(f"queen_{k}_total", 0.0)
        for k in COUNTERS
    }
    tx = d["push_transactions"]

    def per_tx(name: str) -> float | None:
        return d[name] / tx if tx > 0 else None

    return {
        **d,
        "failed": d["push_items_failed"] + d["push_items_buffered"],
        "requests_per_tx": per_tx("push_requests_committed"),
        "partitions_per_tx": per_tx("push_segments"),
    }

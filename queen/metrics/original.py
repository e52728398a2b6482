"""The original broker's metric names, served beside ours where we have the figure.

:func:`with_original_names` computes them from our families, whichever process answers; the
names we cannot serve, and why, are listed in ``docs/operating.md``.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

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

"""The broker's counters: plain integers owned by the one Trio thread, read by /metrics.

Counters only go up. Ratios such as requests per transaction are derived by the reader
(``push_requests_committed / push_transactions``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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
    pop_undecryptable: int = 0  # messages withheld: encrypted, and the key cannot open them
    pop_rechecks_shared: int = 0  # re-checks of waiting pops answered by a like pop's look
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

    def render_prometheus(
        self,
        extra: dict[str, float] | None = None,
        labelled: dict[str, tuple[str, dict[str, float]]] | None = None,
    ) -> str:
        """The counters, ``extra`` values and ``labelled`` families (name: (label, values by
        label value)) in Prometheus' text format."""
        lines: list[str] = []
        values: dict[str, float] = {**self.snapshot(), **(extra or {})}
        for name, value in values.items():
            metric, kind = _metric(name)
            lines.append(f"# TYPE {metric} {kind}")
            lines.append(f"{metric} {value}")
        for name, (label, by_value) in (labelled or {}).items():
            metric, kind = _metric(name)
            lines.append(f"# TYPE {metric} {kind}")
            for key, value in by_value.items():
                lines.append(f'{metric}{{{label}="{_escape(key)}"}} {value}')
        return "\n".join(lines) + "\n"


def _metric(name: str) -> tuple[str, str]:
    kind = "gauge" if name in _GAUGES else "counter"
    return f"queen_{name}" + ("_total" if kind == "counter" else ""), kind


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_GAUGES = {
    "actors_active",
    "http_connections_open",
    "max_partitions_per_transaction",
    "spool_pending_items",
    "spool_files",
    "spool_oldest_age_seconds",
    "spool_replay_rate",
    "spool_quarantined_ranges",
    "spool_quarantined_bytes",
    "database_up",
    "maintenance_mode",
    "process_id",
    "background_loop_failing",
}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_labelled_gauges(families: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> str:
    """Gauges with labels in the Prometheus text format: ``{name: {((label, value), ...): v}}``
    becomes ``queen_<name>{label="value",...} v`` under one ``# TYPE`` line per name."""
    lines: list[str] = []
    for name, samples in families.items():
        lines.append(f"# TYPE queen_{name} gauge")
        for labels, value in samples.items():
            inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
            lines.append(f"queen_{name}{{{inner}}} {value}")
    return "\n".join(lines) + "\n" if lines else ""

"""What the broker counts, and the name, help and kind of every family ``/metrics`` serves.

Counters are plain attributes of one :class:`Metrics` per process, updated by the one Trio
thread (``metrics.push_items += n``, ~50 ns on the push path) and only ever raised. Ratios
such as requests per transaction are derived by the reader
(``push_requests_committed / push_transactions``). :data:`FAMILIES` names every family,
those read from the process and the operations room's gauges included.
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
    pop_lag_seconds: float = 0.0  # summed over delivered messages: pop time less creation
    pop_undecryptable: int = 0  # messages withheld: encrypted, and the key cannot open them
    pop_looks: int = 0  # queries of pops at the database
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
    "pop_looks": _c("Queries of pops at the database (a pop makes one or more, or none)."),
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

COUNTERS = tuple(f.name for f in dataclasses.fields(Metrics) if FAMILIES[f.name].kind == "counter")
"""The fields of :class:`Metrics` that are counters."""
GAUGES = tuple(f.name for f in dataclasses.fields(Metrics) if FAMILIES[f.name].kind == "gauge")
"""The fields of :class:`Metrics` that are gauges (``actors_active``, open connections...)."""

"""What the admin service answers: typed values, no wire names.

Times are aware datetimes, ids of queues and partitions are ints (message and trace ids are
text, as everywhere), figures are ints, and ages are seconds (floats, to the millisecond, never
negative). :mod:`queen.http.render_admin` turns these values into the admin API's JSON (the
original broker's camelCase shapes), which the dashboard's templates read as well.

Values of other rooms travel inside these unchanged: a queue's options are
:class:`queen.records.QueueOptions`, what it holds :class:`queen.storage.retention.QueueHoldings`,
a shown payload :class:`queen.admin.payloads.Shown`, a page :class:`queen.admin.params.Page`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from queen.admin.params import DeadLetterRequest, Page, RetryFilter
from queen.admin.payloads import Shown
from queen.records import QueueOptions
from queen.spool import SpoolState
from queen.storage.retention import QueueHoldings
from queen.supervision import LoopStatus

# --- shared parts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimeRange:
    """The window a list or a series covers: ``since`` up to ``until``."""

    since: datetime
    until: datetime


@dataclass(frozen=True, slots=True)
class MessageCounts:
    """Queue mode's figures of a partition, a queue or every queue: ``total`` held, of which
    ``completed`` (acked or dead-lettered), ``processing`` (inside a live lease) and
    ``pending`` (the rest); ``failed`` attempts and ``dead_letter`` copies in the DLQ."""

    total: int
    pending: int
    processing: int
    completed: int
    failed: int
    dead_letter: int

    @property
    def depth(self) -> int:
        """Messages not done yet: pending and processing."""
        return self.pending + self.processing


@dataclass(frozen=True, slots=True)
class Depth:
    """The figures of a namespace or a task: held, pending, processing."""

    total: int
    pending: int
    processing: int


@dataclass(frozen=True, slots=True)
class Rates:
    """Per-second rates of this process over one interval of its history."""

    ingested_per_s: float  # items pushed and queued
    pop_per_s: float  # messages popped
    processed_per_s: float  # acks


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One interval of the service's history, ending ``at``; ``average_lag_ms``: how long
    the messages popped in it had waited (None when none was)."""

    at: datetime
    span_s: float
    rates: Rates
    dead_letter_per_s: float
    push_requests_per_s: float
    ingested: int
    processed: int
    cpu_percent: float
    rss_bytes: int  # at the end of the interval
    popped: int = 0
    average_lag_ms: float | None = None
    # what each counter of the service went up by in the interval
    deltas: dict[str, int] = field(default_factory=dict)
    cpu_user_percent: float = 0.0
    cpu_system_percent: float = 0.0
    # this process's connection pool at the end of the interval (None when not known)
    pool_size: int | None = None
    pool_active: int | None = None
    virtual_bytes: int = 0


# --- queues ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """One queue of a list, with queue mode's totals over its partitions."""

    id: int
    name: str
    namespace: str
    task: str
    priority: int
    created_at: datetime
    partitions: int
    messages: MessageCounts
    oldest_pending_at: datetime | None
    oldest_pending_age_s: float
    last_message_at: datetime | None


@dataclass(frozen=True, slots=True)
class QueuePage:
    """One page of queues; ``total`` counts every queue matching the filters."""

    queues: list[QueueSummary]
    total: int
    page: Page


@dataclass(frozen=True, slots=True)
class PartitionFigures:
    """One partition of a queue: its offsets, queue mode's figures and lease."""

    id: int
    name: str
    created_at: datetime
    messages: MessageCounts  # dead_letter: this partition's DLQ entries
    low_offset: int  # the lowest offset still stored
    next_offset: int
    cursor_offset: int  # queue mode's cursor
    lease_expires_at: datetime | None  # queue mode's live lease
    oldest_pending_at: datetime | None
    oldest_pending_age_s: float
    newest_at: datetime | None  # when its newest stored message was written


@dataclass(frozen=True, slots=True)
class ConfiguredQueue:
    """A queue's row: its names and options."""

    id: int
    name: str
    namespace: str
    task: str
    created_at: datetime
    options: QueueOptions


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """A queue, one page of its partitions, and its totals (``summary`` None when the queue
    went away between the reads)."""

    queue: ConfiguredQueue
    summary: QueueSummary | None
    partitions: list[PartitionFigures]
    page: Page


@dataclass(frozen=True, slots=True)
class QueueResources:
    """``GET /api/v1/resources/queues/{q}``: the queue's figures and what it holds."""

    figures: QueueFigures
    holdings: QueueHoldings


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """``GET /api/v1/status/queues/{q}``: the queue's figures and every group reading it."""

    figures: QueueFigures
    consumer_groups: list[GroupStanding]


@dataclass(frozen=True, slots=True)
class Grouping:
    """The queues of one namespace or one task (``key``)."""

    key: str
    queues: int
    partitions: int
    messages: Depth


@dataclass(frozen=True, slots=True)
class Groupings:
    """Every namespace or every task (``by``), in name order."""

    by: Literal["namespace", "task"]
    items: list[Grouping]


# --- this process and the whole broker ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessState:
    """How this broker process stands. ``spool`` is None when the spool is off; ``counters``
    are the service's :class:`queen.metrics.Metrics` totals (every worker of ``--workers N``
    summed)."""

    process_id: int
    uptime_s: float
    active_partitions: int
    database_up: bool
    maintenance_mode: bool
    spool: SpoolState | None
    counters: dict[str, float]


@dataclass(frozen=True, slots=True)
class Standing:
    """What this process knows without asking the database, ``at``: shown by the dashboard
    while the database is away. ``database_down_since`` is None while it answers; ``rates``
    are the newest interval's; ``pop_maintenance`` is the switch as last read."""

    at: datetime
    database_down_since: datetime | None
    process: ProcessState
    push_maintenance: bool
    pop_maintenance: bool
    loops: dict[str, LoopStatus]
    rates: Rates


@dataclass(frozen=True, slots=True)
class Overview:
    """Every queue together (queue mode's figures), the service's latest rates and this
    process's state, measured ``at``; ``average_lag_s``: how long the messages popped over
    the last five minutes had waited, on average."""

    queues: int
    partitions: int
    namespaces: int
    tasks: int
    consumer_groups: int  # named groups
    messages: MessageCounts
    oldest_pending_at: datetime | None
    oldest_pending_age_s: float
    rates: Rates
    push_maintenance: bool
    pop_maintenance: bool
    process: ProcessState
    at: datetime
    average_lag_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Leases:
    """The leases live now (every group's): how many, on how many partitions, the messages
    they hand out and how many of those are acknowledged already."""

    active: int = 0
    partitions: int = 0
    messages: int = 0
    acked: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetterSummary:
    """The dead letters of a window: the partitions they came from and the most frequent
    error messages (message, count), most first."""

    partitions: int = 0
    top_errors: list[tuple[str, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Status:
    """``GET /api/v1/status``: the service's history over the window, the overview, the
    queues holding messages, the history's step and the service's counter totals."""

    window: TimeRange
    throughput: list[RatePoint]
    overview: Overview
    queues: list[QueueSummary]
    step_s: float
    counters: dict[str, float]
    leases: Leases = field(default_factory=Leases)
    hostname: str = ""
    dead_letters: DeadLetterSummary = field(default_factory=DeadLetterSummary)


@dataclass(frozen=True, slots=True)
class ProcessSeries:
    """This process's history over a window (the points it kept: every 10 s for an hour);
    ``interval`` is the one the client asked for, echoed."""

    window: TimeRange
    interval: str
    process_id: int
    points: list[RatePoint]
    step_s: float = 10.0
    counters: dict[str, float] = field(default_factory=dict)
    hostname: str = ""


@dataclass(frozen=True, slots=True)
class ProcessMetrics:
    """``GET /metrics`` as JSON: the service's counters (every worker summed), this
    process's id and uptime."""

    uptime_s: float
    requests: int  # pushes, pops and acks
    items_queued: int
    ingested_per_s: float
    pool_size: int
    pool_idle: int | None  # this process's pool (None without PostgreSQL)
    rss_bytes: int
    cpu_s: float
    cpu_user_us: int
    cpu_system_us: int
    process_id: int
    processes: int  # broker processes live now (1, or the workers of --workers N)
    counters: dict[str, float]


@dataclass(frozen=True, slots=True)
class RetentionFigures:
    """What retention and dedup pruning removed: every process together (the database's
    totals, empty without PostgreSQL) and this process (its counters)."""

    all_processes: dict[str, int]
    this_process: dict[str, int]
    interval_s: float
    # the service's history over the asked window: what each interval removed
    window: TimeRange | None = None
    points: list[RatePoint] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TableSize:
    name: str
    bytes: int
    rows: int  # the planner's estimate


@dataclass(frozen=True, slots=True)
class PostgresStats:
    """The database server as the broker sees it (``database``: what the start-up line calls
    it; ``pool_size``: connections per broker process)."""

    version: str
    database: str
    database_bytes: int
    connections: int
    active_connections: int
    max_connections: int
    pool_size: int
    committed: int
    rolled_back: int
    cache_hit_ratio: float  # to four places; 1.0 before any block was read
    deadlocks: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    tables: list[TableSize]
    detail: DatabaseDetail | None = None


@dataclass(frozen=True, slots=True)
class TableStats:
    """One table of the broker's schema: blocks read from disk (``heap_read``) and found in
    the cache, rows, updates, vacuums and sizes (bytes, and as PostgreSQL writes them)."""

    schema: str
    name: str
    heap_read: int
    heap_hit: int
    live: int
    dead: int
    updates: int
    hot_updates: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    autovacuum_count: int
    autoanalyze_count: int
    total_bytes: int
    table_bytes: int
    index_bytes: int
    total_size: str
    table_size: str
    index_size: str


@dataclass(frozen=True, slots=True)
class IndexStats:
    schema: str
    table: str
    name: str
    read: int
    hit: int


@dataclass(frozen=True, slots=True)
class RunningQuery:
    """A statement running for over a second."""

    pid: int
    duration_s: float
    state: str | None
    query: str
    wait_event_type: str | None
    wait_event: str | None


@dataclass(frozen=True, slots=True)
class DatabaseDetail:
    """The cache, vacuum and size figures of the broker's tables and indexes (each list
    chosen and ordered as the original's dashboard shows it), the statements running for
    over a second and ``shared_buffers``."""

    name: str
    disk_reads: int
    cache_hits: int
    table_cache: list[TableStats]  # most disk reads first
    index_cache: list[IndexStats]  # most disk reads first, 20 at most
    dead_tuples: list[TableStats]  # with dead rows, most first, 15 at most
    hot_updates: list[TableStats]  # updated, most updates first, 15 at most
    autovacuum_due: list[TableStats]  # over 1,000 dead rows, most first, 10 at most
    table_sizes: list[TableStats]  # largest first, 20 at most
    running: list[RunningQuery]
    shared_buffers_pages: str
    shared_buffers_size: str
    tables_read: int
    tables_hit: int
    indexes_read: int
    indexes_hit: int


@dataclass(frozen=True, slots=True)
class QueueGauges:
    """The per-queue and per-group figures Prometheus reads (at most 1,000 queues)."""

    queues: list[QueueSummary]
    groups: list[GroupStanding]


# --- messages ----------------------------------------------------------------------------------

MessageStatus = Literal["pending", "processing", "completed", "dead_letter"]
DeletionOutcome = Literal["deleted", "leased", "missing"]


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A stored message without its payload, with queue mode's status of it; in a list, of
    the named groups with a cursor on its partition (``total_groups``), how many have it
    behind their cursor (``consumed_by``)."""

    partition_id: int
    queue: str
    partition: str
    namespace: str
    task: str
    offset: int
    message_id: str
    transaction_id: str
    status: MessageStatus
    trace_id: str | None
    producer_sub: str | None
    created_at: datetime
    lease_expires_at: datetime | None
    consumed_by: int | None = None
    total_groups: int | None = None


@dataclass(frozen=True, slots=True)
class MessagePage:
    """Stored messages, newest first: one page of those stored inside the window."""

    messages: list[StoredMessage]
    page: Page
    window: TimeRange


@dataclass(frozen=True, slots=True)
class GroupView:
    """How one consumer group stands on one message. ``leased`` is None when the group holds
    no lease at all, False when its live lease does not cover the message."""

    name: str
    consumed: bool
    leased: bool | None
    lease_expires_at: datetime | None  # the group's live lease on the partition


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """One DLQ copy of a message."""

    consumer_group: str
    error_message: str | None
    retry_count: int
    failed_at: datetime


@dataclass(frozen=True, slots=True)
class MessageDetail:
    """One stored message with its payload, every group's view of it and its DLQ copies
    (newest first). ``message.lease_expires_at`` is queue mode's live lease on the partition;
    the queue's delivery options follow."""

    message: StoredMessage
    payload: Shown
    consumer_groups: list[GroupView]
    dead_letters: list[DeadLetterRecord]
    lease_time_s: int
    retry_limit: int
    retry_delay_ms: int
    ttl_s: int
    priority: int


@dataclass(frozen=True, slots=True)
class MessageDeletion:
    """The outcome of deleting one message: ``leased`` ones are left alone."""

    partition_id: int
    transaction_id: str
    outcome: DeletionOutcome


# --- actions on messages and dead letters ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetriedCopy:
    """A dead letter delivered again: its copy at ``offset`` of its partition, for ``group``."""

    partition_id: int
    transaction_id: str
    consumer_group: str
    offset: int


@dataclass(frozen=True, slots=True)
class MessageRetry:
    """Retrying one message's dead letters: ``copies`` is empty when none was left (retried
    already, or never dead-lettered)."""

    partition_id: int
    transaction_id: str
    copies: list[RetriedCopy]

    @property
    def retried(self) -> bool:
        return bool(self.copies)


@dataclass(frozen=True, slots=True)
class BulkRetry:
    scope: RetryFilter
    retried: int


DeadLetterOutcome = Literal["moved", "already", "consumed", "leased", "no_group", "missing"]


@dataclass(frozen=True, slots=True)
class MessageDeadLettered:
    partition_id: int
    transaction_id: str
    request: DeadLetterRequest
    outcome: DeadLetterOutcome


@dataclass(frozen=True, slots=True)
class QueueCleared:
    """Clearing a queue (or a partition): ``cleared`` messages removed, ``kept`` left because
    they share a write with a message inside a live lease."""

    queue: str
    partition: str | None
    cleared: int
    kept: int


# --- consumer groups ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupStanding:
    """A consumer group on one queue: ``lag`` messages behind over its ``partitions``,
    ``leased`` of them inside a live lease, the oldest unconsumed written at
    ``oldest_pending_at``. The subscription fields are None for queue mode and for groups
    that never subscribed."""

    name: str
    queue: str
    partitions: int
    leased: int
    lag: int
    max_time_lag_s: float
    oldest_pending_at: datetime | None
    last_consumed_at: datetime | None
    subscription_mode: str | None
    subscribed_at: datetime | None
    subscription_created_at: datetime | None
    lagging: int = 0  # partitions where it has messages to receive


@dataclass(frozen=True, slots=True)
class GroupPage:
    """One page of (group, queue) standings."""

    groups: list[GroupStanding]
    page: Page


@dataclass(frozen=True, slots=True)
class GroupPartition:
    """Where a group stands in one partition holding messages: ``cursor_offset`` is its
    cursor, or, before its first pop there, the offset its subscription starts at."""

    partition: str
    partition_id: int
    cursor_offset: int
    next_offset: int
    lag: int
    time_lag_s: float
    lease_expires_at: datetime | None  # its live lease, if any
    last_consumed_at: datetime | None
    oldest_at: datetime | None = None  # when its oldest unconsumed message was written
    lease_expired_at: datetime | None = None  # a lease ran out here with messages in it
    stuck: str | None = None  # why this partition looks stuck, if it does


@dataclass(frozen=True, slots=True)
class LaggingPartition:
    """A partition where a group lags: the group's standing on the queue, and the partition."""

    standing: GroupStanding
    partition: GroupPartition


@dataclass(frozen=True, slots=True)
class GroupOnQueue:
    """A group on one queue, with one page of its partitions."""

    standing: GroupStanding
    partitions: list[GroupPartition]


def age_s(moment: datetime | None, now: datetime) -> float:
    """Seconds from ``moment`` to ``now``, to the millisecond; 0 for none (or the future)."""
    return 0.0 if moment is None else round(max(0.0, (now - moment).total_seconds()), 3)


@dataclass(frozen=True, slots=True)
class QueueLagPoint:
    """One minute of one queue in this process: the messages popped from it and how long
    they had waited (milliseconds); messages stored, pops that found nothing, acks taken and
    refused."""

    minute: datetime
    queue: str
    pops: int
    average_lag_ms: float
    max_lag_ms: float
    pushes: int = 0
    empty_pops: int = 0
    acks: int = 0
    acks_refused: int = 0


@dataclass(frozen=True, slots=True)
class QueueFlowSeries:
    """``GET /api/v1/analytics/queue-lag`` and ``/queue-ops``: per queue and minute over the
    window."""

    window: TimeRange
    points: list[QueueLagPoint]

"""Plain values of the consume side, shared by storage and the consume service.

Validated requests (pop, ack, transaction, dead letter page, seek, trace), a delivered message
and a queue's options. No I/O and no rules: :mod:`queen.consume` builds and checks these
values, :mod:`queen.storage` reads and writes them, and neither imports the other for them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Literal

from queen.intake import PreparedPush
from queen.model import PartitionKey

INT32_MAX = 2_147_483_647


QUEUE_MODE = "__QUEUE_MODE__"
"""The consumer group of queue mode: one shared cursor per partition (competing consumers)."""


class SubscriptionStart(enum.StrEnum):
    """Where a named consumer group starts the first time it pops on a queue."""

    ALL = "all"  # from the oldest stored message
    NOW = "now"  # only messages stored from now on
    AT = "at"  # messages stored at or after a timestamp


@dataclass(frozen=True, slots=True)
class Subscription:
    start: SubscriptionStart = SubscriptionStart.ALL
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Sizing:
    """What one pop may take: ``batch`` messages from ``partitions`` partitions at most; more
    than one partition only when at least ``spread`` are claimable (1: whatever are)."""

    batch: int
    partitions: int
    spread: int = 1


AckStatus = Literal["completed", "failed", "dlq", "retry"]


@dataclass(frozen=True, slots=True)
class PopRequest:
    """One pop, validated. ``queue`` None means every queue matching namespace/task."""

    queue: str | None
    partition: str | None = None
    namespace: str = ""
    task: str = ""
    consumer_group: str = QUEUE_MODE
    batch: int | None = None  # None: the broker chooses
    partitions: int | None = None  # None: the broker chooses
    wait: bool = False
    timeout_ms: int = 30_000
    auto_ack: bool = False
    subscription: Subscription = field(default_factory=Subscription)
    autopilot: bool = False


@dataclass(frozen=True, slots=True)
class AckItem:
    """One acknowledgment. ``partition_id`` None: the id names no partition of this broker."""

    transaction_id: str
    partition_id: int | None
    status: AckStatus
    consumer_group: str = QUEUE_MODE
    error: str | None = None
    lease_id: str | None = None  # None: not fenced


@dataclass(frozen=True, slots=True)
class AckResult:
    """The verdict on one acknowledgment; ``success`` False means refused (``error`` says
    why), never applied in part."""

    index: int
    transaction_id: str
    success: bool
    error: str | None
    queue: str | None
    partition: str | None
    lease_released: bool
    dlq: bool


@dataclass(frozen=True, slots=True)
class TxAck:
    index: int  # position in the flat results
    item: AckItem


@dataclass(frozen=True, slots=True)
class TxPush:
    index: int  # position of the first pushed item in the flat results
    prepared: PreparedPush


@dataclass(frozen=True, slots=True)
class TransactionRequest:
    acks: list[TxAck]
    pushes: list[TxPush]
    required_leases: list[str]
    size: int  # number of flat results

    def push_keys(self) -> list[PartitionKey]:
        """The partitions its pushes write."""
        return [batch.key for push in self.pushes for batch in push.prepared.batches]


@dataclass(frozen=True, slots=True)
class DlqQuery:
    queue: str | None
    consumer_group: str | None
    partition: str | None
    since: datetime | None
    until: datetime | None
    limit: int
    offset: int


@dataclass(frozen=True, slots=True)
class SeekTarget:
    """Where a seek moves a consumer group: to the end, or to the messages stored at or after
    ``at``."""

    to_end: bool
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Delivered:
    """One delivered message. ``payload`` is the stored JSON text."""

    partition_id: int
    queue: str
    partition: str
    offset: int
    message_id: str
    transaction_id: str
    payload: str
    producer_sub: str | None
    trace_id: str | None
    retry_count: int


DEFAULT_EVENT_TYPE = "info"


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One trace, validated. ``partition_id`` None: the id names no partition of this broker."""

    transaction_id: str
    partition_id: int | None
    data: str  # JSON text
    consumer_group: str = QUEUE_MODE
    event_type: str = DEFAULT_EVENT_TYPE
    names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """One dead letter as stored."""

    message_id: str
    transaction_id: str
    partition_id: int
    queue: str
    partition: str
    consumer_group: str
    error_message: str | None
    retry_count: int
    payload: str
    producer_sub: str | None
    trace_id: str | None
    failed_at: datetime
    offset: int


@dataclass(frozen=True, slots=True)
class StoredTrace:
    """One recorded trace as stored; the message fields are set when read by name."""

    id: int
    event_type: str
    data: str  # JSON text
    consumer_group: str
    worker_id: str | None
    created_at: datetime
    names: list[str]
    transaction_id: str | None = None
    partition_id: int | None = None
    queue: str | None = None
    partition: str | None = None


@dataclass(frozen=True, slots=True)
class TraceName:
    name: str
    trace_count: int
    message_count: int
    last_seen: datetime


@dataclass(frozen=True, slots=True)
class QueueOptions:
    lease_time_s: int = 300
    retry_limit: int = 3
    retry_delay_ms: int = 1000
    max_size: int = 0
    ttl_s: int = 3600
    dead_letter_queue: bool = False
    dlq_after_max_retries: bool = False
    priority: int = 0
    delayed_processing_s: int = 0
    window_buffer_s: int = 0
    retention_s: int = 0
    completed_retention_s: int = 0
    retention_enabled: bool = False
    max_wait_time_s: int = 0
    encryption_enabled: bool = False
    dedup_window_s: int = 3600


# wire key, field, lowest accepted value (None for booleans)
OPTION_FIELDS: tuple[tuple[str, str, int | None], ...] = (
    ("priority", "priority", -INT32_MAX),
    ("leaseTime", "lease_time_s", 1),
    ("retryLimit", "retry_limit", 0),
    ("retryDelay", "retry_delay_ms", 0),
    ("maxSize", "max_size", 0),
    ("ttl", "ttl_s", 0),
    ("deadLetterQueue", "dead_letter_queue", None),
    ("dlqAfterMaxRetries", "dlq_after_max_retries", None),
    ("delayedProcessing", "delayed_processing_s", 0),
    ("windowBuffer", "window_buffer_s", 0),
    ("retentionSeconds", "retention_s", 0),
    ("completedRetentionSeconds", "completed_retention_s", 0),
    ("retentionEnabled", "retention_enabled", None),
    ("encryptionEnabled", "encryption_enabled", None),
    ("maxWaitTimeSeconds", "max_wait_time_s", 0),
    ("dedupWindowSeconds", "dedup_window_s", 0),
)


# --- streaming queries (``/streams/v1/*``) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    name: str
    source_queue: str
    sink_queue: str | None
    config_hash: str
    reset: bool


@dataclass(frozen=True, slots=True)
class CycleAck:
    """The source ack of a cycle: every message of the batch up to and including the one
    ``transaction_id`` names is done; with ``dlq`` (status ``failed`` or ``dlq``) that message
    goes to the group's dead letter queue with ``error``. ``lease_id`` None: not fenced."""

    transaction_id: str
    lease_id: str | None
    dlq: bool = False
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CycleRequest:
    query_id: str
    partition_id: int
    consumer_group: str
    state_keys: list[str]  # one entry per key touched, in key order
    state_values: list[str | None]  # the JSON text to store, or None to delete
    state_ops: int  # operations in the body (the answer's state_ops_applied)
    ack: CycleAck | None
    release_lease: bool
    push: PreparedPush | None

    def push_keys(self) -> list[PartitionKey]:
        """The partitions its sink pushes write."""
        return [] if self.push is None else [batch.key for batch in self.push.batches]


@dataclass(frozen=True, slots=True)
class StateQuery:
    query_id: str
    partition_id: int
    keys: list[str]
    key_prefix: str | None
    ripe_at_or_before: Decimal | None


@dataclass(frozen=True, slots=True)
class StateEntry:
    """One key of a streaming query's state for one source partition."""

    key: str
    value: str  # JSON text
    updated_at: datetime

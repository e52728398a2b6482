"""The values of ``queen import`` (storage's own): what is read of an original Queen
database (:mod:`queen.storage.original`), what the import has brought over already, and what
it writes here (:mod:`queen.storage.importer`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from queen.errors import QueenError

QUEUE_MODE = "__QUEUE_MODE__"


@dataclass(frozen=True, slots=True)
class DatabaseIdentity:
    """Enough to tell whether two connections reach the same database."""

    system_id: int | None  # pg_control_system(), when the role may read it
    server: str  # address and port the server answered on ("local" over a Unix socket)
    database: str
    database_oid: int

    def same_as(self, other: DatabaseIdentity) -> bool:
        if (self.database, self.database_oid) != (other.database, other.database_oid):
            return False
        if self.system_id is not None and other.system_id is not None:
            return self.system_id == other.system_id
        return self.server == other.server


@dataclass(frozen=True, slots=True)
class OriginalQueue:
    """A queue of the original with its options, in this broker's terms and units."""

    source_id: str
    name: str
    namespace: str
    task: str
    priority: int
    lease_time_s: int
    retry_limit: int
    retry_delay_ms: int
    ttl_s: int
    dead_letter_queue: bool
    dlq_after_max_retries: bool
    delayed_processing_s: int
    window_buffer_s: int
    retention_s: int
    completed_retention_s: int
    retention_enabled: bool
    encryption_enabled: bool
    max_wait_time_s: int
    max_size: int
    created_at: datetime | None


@dataclass(frozen=True, slots=True)
class OriginalPartition:
    source_id: str
    source_queue: str
    name: str
    created_at: datetime | None
    messages: int
    encrypted: int  # messages stored encrypted by the original


@dataclass(frozen=True, slots=True)
class OriginalMessage:
    id: str
    transaction_id: str
    trace_id: str | None
    payload: str  # JSON text
    created_at: datetime
    encrypted: bool
    producer_sub: str | None


@dataclass(frozen=True, slots=True)
class OriginalPosition:
    """One ``partition_consumers`` row: ``done`` messages of the partition (in its order) are
    behind the cursor, None when it never moved; ``retries`` failed deliveries of the batch
    at the cursor."""

    source_partition: str
    consumer_group: str
    done: int | None
    retries: int


@dataclass(frozen=True, slots=True)
class OriginalSubscription:
    """Where a named group starts on a queue (or one partition of it) that it has not
    consumed yet: after every message created up to ``since``."""

    consumer_group: str
    queue: str
    partition: str  # "" for the whole queue
    mode: str
    since: datetime


@dataclass(frozen=True, slots=True)
class OriginalDeadLetter:
    source_id: str
    source_partition: str
    consumer_group: str
    before: int  # messages of the partition ahead of this one: its place in the order
    message: OriginalMessage
    error: str | None
    retry_count: int
    failed_at: datetime | None


@dataclass(frozen=True, slots=True)
class ImportedPartition:
    """What the target holds of one source partition."""

    partition_id: int
    messages: int
    last_created_at: datetime | None
    last_id: str | None


@dataclass(frozen=True, slots=True)
class ImportState:
    """What earlier imports brought over: source queue id -> queue id (present queues only),
    source partition id -> progress, dead letters copied."""

    queues: dict[str, int]
    deleted_queues: frozenset[str]  # imported, then deleted here: left alone
    partitions: dict[str, ImportedPartition]
    deleted_partitions: frozenset[str]  # imported, then deleted here: left alone
    dead_letters: frozenset[str]
    # Partitions that hold messages pushed here since the import began: source partition ids
    # of imported ones, (source queue id, name) of ones not imported yet.
    served: frozenset[str] = frozenset()
    served_new: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class CursorWrite:
    partition_id: int
    queue_id: int
    consumer_group: str
    next_offset: int
    attempts: int  # failed deliveries of the message at next_offset (0: none)


@dataclass(frozen=True, slots=True)
class GroupWrite:
    queue_id: int
    consumer_group: str
    subscription_mode: str  # 'all', 'now' or 'at' (this broker's)
    subscribed_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeadLetterWrite:
    source_id: str
    queue_id: int
    partition_id: int
    consumer_group: str
    msg_offset: int
    message_id: str
    transaction_id: str
    payload: str
    producer_sub: str | None
    trace_id: str | None
    error: str | None
    retry_count: int
    failed_at: datetime | None


@dataclass(frozen=True, slots=True)
class PositionsWritten:
    cursors_written: int  # created or moved
    cursors_kept: int  # moved here since an earlier import: left as they are
    groups: int
    dead_letters: int


class PartitionMoved(QueenError):
    """A partition being imported received messages from somewhere else since the import
    began: its remaining messages can no longer be put after the imported ones in order."""

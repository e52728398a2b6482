"""What the consume side answers: typed values (HTTP renders them in :mod:`queen.http.render`).

:class:`PopResult` also keeps the shape of its messages for the embedding API, where popped
messages are dicts that :meth:`queen.broker.Broker.ack` takes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from queen.budget import Charge
from queen.consume.policy import iso_of_uuid7
from queen.intake import decode_json
from queen.records import (
    AckItem,
    AckResult,
    AckStatus,
    Delivered,
    DlqEntry,
    QueueOptions,
    Sizing,
    StoredTrace,
    TraceName,
)
from queen.storage.consume import PushedFrame

__all__ = ["AckResult"]  # the verdict on one ack is a record: storage builds it


@dataclass(slots=True)
class PopResult:
    """The answer of one pop. Empty ``delivered`` means "nothing to deliver" (HTTP 204).

    ``lease_id`` is shared by every claimed partition; it is ``""`` with ``autoAck``, and
    ``lease_expires_at`` is then None. ``sizing`` is set when the request left its sizing to
    the broker (``autopilot``). ``charge`` holds the answer's bytes in the process's byte
    budget: whoever sends the answer releases it once it is sent.
    """

    consumer_group: str
    lease_id: str = ""
    lease_expires_at: datetime | None = None
    delivered: list[Delivered] = field(default_factory=list)
    sizing: Sizing | None = None
    charge: Charge = field(default_factory=Charge.nothing)

    def __bool__(self) -> bool:
        return bool(self.delivered)

    @property
    def partitions_claimed(self) -> int:
        return len({d.partition_id for d in self.delivered})

    @property
    def messages(self) -> list[Message]:
        """The messages for an embedding program, ``data`` decoded; each can be acked
        (:meth:`queen.broker.Broker.ack`, :meth:`Message.ack`)."""
        return [
            Message(
                id=d.message_id,
                transaction_id=d.transaction_id,
                partition_id=d.partition_id,
                lease_id=self.lease_id,
                data=decode_json(d.payload.encode()),
                created_at=iso_of_uuid7(d.message_id),
                producer_sub=d.producer_sub,
                trace_id=d.trace_id,
                partition=d.partition,
                queue=d.queue,
                consumer_group=self.consumer_group,
                retry_count=d.retry_count,
                offset=d.offset,
            )
            for d in self.delivered
        ]


@dataclass(frozen=True, slots=True)
class Message:
    """One popped message. ``lease_id`` is ``""`` when popped with ``autoAck``."""

    id: str
    transaction_id: str
    partition_id: int
    lease_id: str
    data: Any
    created_at: str  # ISO-8601 UTC, from the message id
    producer_sub: str | None
    trace_id: str | None
    partition: str
    queue: str
    consumer_group: str
    retry_count: int
    offset: int

    def ack(self, status: AckStatus = "completed", error: str | None = None) -> AckItem:
        """The acknowledgment of this message (fenced by its lease, for its group)."""
        return AckItem(
            transaction_id=self.transaction_id,
            partition_id=self.partition_id,
            status=status,
            consumer_group=self.consumer_group,
            error=error,
            lease_id=self.lease_id or None,
        )


# --- the other answers of the consume side (rendered for HTTP by queen.http.render) ----------


@dataclass(frozen=True, slots=True)
class QueueConfigured:
    queue_id: int
    partition_id: int  # the queue's default partition
    queue: str
    namespace: str
    task: str
    options: QueueOptions
    warning: str | None = None  # set when the options ask for what this broker cannot do


@dataclass(frozen=True, slots=True)
class QueueDeleted:
    queue: str
    existed: bool


@dataclass(frozen=True, slots=True)
class LeaseExtension:
    lease_id: str
    state: str  # renewed, expired, missing, or not active
    renewed: int  # partitions whose lease was extended
    expires_at: datetime | None

    @property
    def success(self) -> bool:
        return self.state == "renewed"

    @property
    def error(self) -> str | None:
        return {
            "renewed": None,
            "expired": "Lease already expired",
            "missing": "Lease not found",
        }.get(self.state, "Lease not active")


@dataclass(frozen=True, slots=True)
class TxAckResult:
    """An ack of a transaction. ``verdict`` None: not judged, the transaction failed first."""

    index: int
    transaction_id: str
    verdict: AckResult | None


@dataclass(frozen=True, slots=True)
class TxPushResult:
    index: int
    transaction_id: str
    message_id: str  # the stored message, or the one this push duplicates
    duplicate: bool
    partition_id: int | None
    queue: str
    partition: str

    @classmethod
    def of(cls, frame: PushedFrame) -> TxPushResult:
        """What became of one frame a transaction (or a streaming cycle) pushed."""
        return cls(
            index=frame.index,
            transaction_id=frame.transaction_id,
            message_id=frame.duplicate_of or frame.message_id,
            duplicate=frame.duplicate_of is not None,
            partition_id=frame.partition_id or None,
            queue=frame.key.queue,
            partition=frame.key.partition,
        )


@dataclass(frozen=True, slots=True)
class TransactionResult:
    """One result per operation, in request order. When ``success`` is False nothing was
    applied: every operation that would have succeeded reports so with ``ROLLED_BACK``."""

    transaction_id: str
    success: bool
    error: str | None
    results: list[TxAckResult | TxPushResult]


ROLLED_BACK = "not applied: the transaction was rolled back"


@dataclass(frozen=True, slots=True)
class DlqMessage:
    """A dead letter with its payload decoded (``data``); ``decryption_error`` is set, and
    ``data`` None, when its payload could not be decrypted."""

    entry: DlqEntry
    data: Any
    decryption_error: str | None = None


@dataclass(frozen=True, slots=True)
class DlqPage:
    messages: list[DlqMessage]
    total: int
    limit: int
    offset: int


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    consumer_group: str
    deleted_partitions: int
    metadata_deleted: bool


@dataclass(frozen=True, slots=True)
class GroupDeletedOnQueue:
    consumer_group: str
    queue: str
    deleted_partitions: int
    metadata_deleted: bool


@dataclass(frozen=True, slots=True)
class SeekResult:
    """Where a group was moved. ``partition`` None: every partition of the queue."""

    consumer_group: str
    queue: str
    to_end: bool
    at: datetime | None
    partition: str | None
    updated: int  # cursors moved
    moved_to: datetime | None


@dataclass(frozen=True, slots=True)
class SubscriptionMoved:
    consumer_group: str
    at: datetime
    rows: int


@dataclass(frozen=True, slots=True)
class PopMaintenance:
    enabled: bool


@dataclass(frozen=True, slots=True)
class TraceRecorded:
    trace_id: int


@dataclass(frozen=True, slots=True)
class TracePage:
    """Traces, oldest first. ``total``, ``limit`` and ``offset`` are None for the traces of
    one message (never paged)."""

    traces: list[StoredTrace]
    total: int | None = None
    limit: int | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class TraceNamePage:
    names: list[TraceName]
    total: int
    limit: int
    offset: int

"""The narrow interface between the broker and its database.

Actors, the batcher and the supervisor only speak :class:`Store`. The PostgreSQL store
(:mod:`queen.storage.postgres`) is the product; tests drive the actors with an in-memory fake
that keeps the same contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from queen.errors import StoreError, StoreUnavailable
from queen.model import PartitionKey, first_wins

__all__ = [
    "STORED",
    "SegmentWrite",
    "StateStore",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "WriteResult",
]


@dataclass(slots=True)
class SegmentWrite:
    """One write of one partition: frames stored at consecutive offsets as one segment.

    ``payloads`` are encoded JSON texts. ``leaders[i]`` is the position of the first frame of
    this write with the same transaction id as frame ``i`` (``i`` itself for a first
    occurrence): first wins inside a write; ``None`` (the push path's writes) leaves them to
    be worked out from ``transaction_ids`` (:meth:`first_wins`), which a store needs only
    when a transaction id repeats. ``producer_subs`` and ``trace_ids`` are ``None`` when every
    frame has none (the common case), else one entry per frame.
    """

    partition_id: int
    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    leaders: list[int] | None = None
    key: PartitionKey | None = None  # which partition this is, for listeners and logs
    producer_subs: list[str | None] | None = None
    trace_ids: list[str | None] | None = None
    request_count: int = 1

    def __len__(self) -> int:
        return len(self.message_ids)

    @property
    def payload_bytes(self) -> int:
        return sum(map(len, self.payloads))

    def first_wins(self) -> list[int]:
        """``leaders``, or (``None``) the first-wins positions of ``transaction_ids``."""
        if self.leaders is not None:
            return self.leaders
        return first_wins(self.transaction_ids)


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What the database did with one :class:`SegmentWrite`.

    Every frame not listed in ``duplicates`` was stored under its own message id.
    ``duplicates`` maps a frame position to the message id it duplicates: the original's id
    read from its segment, the all-zero UUID if retention removed that segment, or the id of an
    earlier frame of the same write (first wins). ``partition_missing`` means the partition row
    no longer exists (its queue was deleted); nothing was written. Results are read, never
    changed: :data:`STORED` (every frame stored) is shared.
    """

    duplicates: dict[int, str] = field(default_factory=dict)
    partition_missing: bool = False


STORED = WriteResult()


class Store(Protocol):
    """What the push path needs from a database. Every method is safe to call concurrently."""

    async def ensure_partition(self, key: PartitionKey) -> int:
        """Create the queue and partition if needed; return the partition id."""
        ...

    async def ensure_partitions(self, keys: Sequence[PartitionKey]) -> list[int]:
        """The same for many partitions at once (one round trip), ids in ``keys`` order."""
        ...

    async def write_segments(self, writes: Sequence[SegmentWrite]) -> list[WriteResult]:
        """Store ``writes`` (distinct partitions) in one transaction; one result per write.

        Raises :class:`StoreUnavailable` or :class:`StoreError`; then nothing is known to have
        been written.
        """
        ...

    async def ping(self) -> None:
        """Raise :class:`StoreUnavailable` unless the database answers now."""
        ...


@runtime_checkable
class StateStore(Protocol):
    """Broker-wide switches (``queen.system_state``): JSON values under a key."""

    async def get_state(self, key: str) -> Any: ...

    async def set_state(self, key: str, value: Any) -> None: ...

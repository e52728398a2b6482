"""What the streams side answers: typed values (HTTP renders them in :mod:`queen.http.render`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from queen.consume.results import TxPushResult


@dataclass(frozen=True, slots=True)
class QueryRegistered:
    query_id: str
    name: str
    config_hash: str
    fresh: bool  # registered now
    reset: bool  # its state was wiped (``reset: true`` with another config hash)


@dataclass(frozen=True, slots=True)
class SourceAcked:
    """The source ack of a committed cycle: ``count`` messages done."""

    count: int
    lease_released: bool
    dlq: bool


@dataclass(frozen=True, slots=True)
class CycleResult:
    """One cycle's verdict. ``success`` False: nothing applied, ``error`` says why."""

    success: bool
    query_id: str
    partition_id: int
    queue: str | None
    state_ops_applied: int
    pushed: list[TxPushResult] = field(default_factory=list)  # as a transaction's pushes
    acked: SourceAcked | None = None
    error: str | None = None

"""Messages exchanged with the partition actors, and the one-shot reply they travel with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import trio

from queen.model import Status

T = TypeVar("T")


class Reply(Generic[T]):
    """A one-shot answer: set once by the task that did the work, awaited by the requester.

    If nobody awaits (the requester was cancelled), the answer is simply dropped.
    """

    __slots__ = ("_error", "_event", "_value")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def set(self, value: T) -> None:
        if not self._event.is_set():
            self._value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            self._error = error
            self._event.set()

    async def wait(self) -> T:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


@dataclass(slots=True)
class PushOutcome:
    """What happened to the items of one :class:`PushRequest`.

    Every item not in ``duplicates`` has ``status``; ``duplicates`` maps an item's position in
    the request to the message id it duplicates.
    """

    status: Status
    duplicates: dict[int, str] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class PushRequest:
    """Frames for one partition, in order: the items of one push body for that partition, or
    (``replay=True``) frames read back from the spool, which go to the database only.

    ``producer_subs`` and ``trace_ids`` are ``None`` when no frame has one, else one entry per
    frame.
    """

    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    producer_subs: list[str | None] | None = None
    trace_ids: list[str | None] | None = None
    replay: bool = False
    reply: Reply[PushOutcome] = field(default_factory=Reply)

    def __len__(self) -> int:
        return len(self.message_ids)


class FrameColumns(Protocol):
    """Parallel per-frame columns: a push request, a spool record, a segment."""

    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    producer_subs: list[str | None] | None
    trace_ids: list[str | None] | None

    def __len__(self) -> int: ...


@dataclass(slots=True)
class Frames:
    """The columns of several :class:`FrameColumns` put end to end."""

    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    producer_subs: list[str | None] | None
    trace_ids: list[str | None] | None


def concat(parts: Sequence[FrameColumns]) -> Frames:
    """Concatenate frames in order; an optional column stays None unless some part has it."""
    if len(parts) == 1:
        only = parts[0]
        return Frames(
            only.message_ids,
            only.transaction_ids,
            only.payloads,
            only.producer_subs,
            only.trace_ids,
        )
    message_ids: list[str] = []
    transaction_ids: list[str] = []
    payloads: list[bytes] = []
    for part in parts:
        message_ids.extend(part.message_ids)
        transaction_ids.extend(part.transaction_ids)
        payloads.extend(part.payloads)
    return Frames(
        message_ids,
        transaction_ids,
        payloads,
        _optional([p.producer_subs for p in parts], parts),
        _optional([p.trace_ids for p in parts], parts),
    )


def _optional(
    columns: list[list[str | None] | None], parts: Sequence[FrameColumns]
) -> list[str | None] | None:
    if all(c is None for c in columns):
        return None
    out: list[str | None] = []
    for part, column in zip(parts, columns, strict=True):
        out.extend(column if column is not None else [None] * len(part))
    return out

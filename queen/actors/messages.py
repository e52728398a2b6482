"""Messages exchanged with the partition actors, and the one-shot reply they travel with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

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

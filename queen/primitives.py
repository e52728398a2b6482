"""Primitives the push path, the spool and the transactions share to hand work between tasks.

:class:`Parking` is where an actor (or the batcher) waits for work, woken without a checkpoint by
whoever hands it some; a :class:`Reply` (optionally in a :class:`ReplyGroup`) carries the one
answer back. A :class:`Fence` asks a
partition's actor to stand still while another writer of this process writes the partition;
:class:`Route` is where a partition's pushes go now. Everything here runs in the Trio thread.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

from queen.errors import QueenError
from queen.model import PartitionKey

T = TypeVar("T")


class Route(enum.Enum):
    """Where a partition's live pushes go now (asked of the router before every write)."""

    DATABASE = "database"
    SPOOL = "spool"
    HOLD = "hold"


class Parking:
    """Where one task waits for another to wake it: the cheapest hand-off Trio allows.

    :meth:`park` suspends the calling task until some task calls :meth:`wake`; a wake with
    nobody parked does nothing, so the parked side checks its condition again after every
    wake-up (and before parking). Waking is synchronous and takes no checkpoint. A parked task
    that is cancelled leaves at once.
    """

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None  # the task parked here now, if any

    def park(self) -> Awaitable[None]:
        """Park the calling task: ``await parking.park()``. (A plain function returning the
        wait itself, so that a wake-up resumes one frame fewer.)"""
        self.task = trio.lowlevel.current_task()
        return trio.lowlevel.wait_task_rescheduled(self._abort)  # noqa: ASYNC105 (awaited by the caller)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED

    def wake(self) -> None:
        task = self.task
        if task is not None:
            self.task = None
            trio.lowlevel.reschedule(task)


class ReplyGroup:
    """Wakes one waiter once every reply of a group is set.

    A push body spread over several partitions sends one request per partition; the producer
    then waits once for the group instead of once per request. One task waits on a group.
    """

    __slots__ = ("_parking", "_pending")

    def __init__(self, size: int) -> None:
        self._pending = size
        self._parking = Parking()

    def _one_done(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._parking.wake()

    def wait(self) -> Awaitable[None]:
        """Return once every reply of the group is set: ``await group.wait()``."""
        if self._pending <= 0:
            return trio.lowlevel.checkpoint()  # noqa: ASYNC105 (awaited by the caller)
        return self._parking.park()


class Reply(Generic[T]):
    """A one-shot answer: set once by the task that did the work, read by the requester.

    The requester either awaits :meth:`wait`, or (when the reply belongs to a
    :class:`ReplyGroup`) awaits the group and then reads :meth:`result`. If nobody awaits (the
    requester was cancelled), the answer is simply dropped. The event behind :meth:`wait` is
    made only if somebody waits before the answer is in.
    """

    __slots__ = ("_done", "_error", "_event", "_group", "_value")

    def __init__(self, group: ReplyGroup | None = None) -> None:
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None
        self._event: trio.Event | None = None
        self._group = group

    def set(self, value: T) -> None:
        if not self._done:
            self._value = value
            self._done = True
            if self._event is not None:
                self._event.set()
            if self._group is not None:
                self._group._one_done()

    def fail(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self.set(None)  # type: ignore[arg-type]

    async def wait(self) -> T:
        if self._done:
            await trio.lowlevel.checkpoint()
        else:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()
        return self.result()

    def result(self) -> T:
        """The answer (or its error raised); only once it is set."""
        if not self._done:
            raise RuntimeError("reply read before it was set")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


@dataclass(slots=True, eq=False)
class Fence:
    """Asks a partition's actor to stand still while another writer of this process (an
    ack-and-push transaction) writes the partition, so that the partition keeps one writer.

    The actor takes the fence in inbox order: every request queued before it is answered
    first. It then answers :attr:`granted` with the route a live push would take now. Only on
    :attr:`Route.DATABASE` does it stand still, until :attr:`released` is set; any other route
    means "not now" (the database is away, maintenance mode, or spooled frames of the partition
    wait for replay) and the actor goes on at once. The requester sets :attr:`released` when it
    is done, whatever happened (also when it gave up before the grant: the actor then skips the
    fence).
    """

    granted: Reply[Route] = field(default_factory=Reply)
    released: trio.Event = field(default_factory=trio.Event)


class NoTurn(QueenError, RuntimeError):
    """A store method that writes partitions around their actors was called without a live
    :class:`Turn` covering them (a programming error: the write is refused before it starts)."""


_GRANT = object()  # what a turn is made with
_UNCLAIMED = [_GRANT]  # :meth:`Turn.granter` takes it, once


class Turn:
    """Proof that this process's actors of :attr:`keys` stand still for a write: the push
    service's hold (:meth:`queen.push.PushService.hold`) yields one, and the store methods that
    write partitions around the actors (a transaction's pushes, a streaming cycle's sink
    pushes, a dead letter retry's copies) take one and refuse a write without it
    (:func:`require_turn`). The type makes mypy ask for it; the runtime check refuses one
    made elsewhere, one whose hold is over, and one that does not cover the partitions.

    Only the push service makes turns: it takes the one grant (:meth:`granter`) when it is
    imported; constructing a turn without that grant raises :class:`TypeError`.
    """

    __slots__ = ("_live", "keys")

    def __init__(self, keys: Iterable[PartitionKey], grant: object) -> None:
        if grant is not _GRANT:
            raise TypeError("a Turn is granted by the push service's hold only")
        self.keys = frozenset(keys)
        self._live = True

    @staticmethod
    def granter() -> Callable[[Iterable[PartitionKey]], Turn]:
        """Make turns from here on: for the push service, once per process."""
        if not _UNCLAIMED:
            raise RuntimeError("turns are granted by the push service alone")
        key = _UNCLAIMED.pop()

        def grant(keys: Iterable[PartitionKey]) -> Turn:
            return Turn(keys, key)

        return grant

    @property
    def live(self) -> bool:
        """True until the hold that granted it is over."""
        return self._live

    def end(self) -> None:
        """The hold is over: the turn proves nothing any more."""
        self._live = False


def require_turn(turn: object, keys: Iterable[PartitionKey], what: str) -> None:
    """Raise :class:`NoTurn` unless ``turn`` is a live :class:`Turn` covering ``keys`` (the
    partitions ``what`` writes)."""
    if type(turn) is not Turn:
        raise NoTurn(
            f"{what} writes partitions around their actors: it needs the push service's hold "
            f"(a Turn), not {type(turn).__name__}"
        )
    if not turn.live:
        raise NoTurn(f"{what}: the hold that granted this turn is over")
    missing = set(keys) - turn.keys
    if missing:
        named = ", ".join(f"{k.queue}/{k.partition}" for k in sorted(missing))
        raise NoTurn(f"{what} writes partitions its turn does not hold: {named}")


async def acquire_free(lock: trio.Semaphore | trio.CapacityLimiter) -> None:
    """Take a slot of ``lock``: at once, with no checkpoint, when one is free (trio's
    ``acquire`` passes through the scheduler even then), else wait for one. A released slot
    goes straight to a waiting task, so a free slot means that none waits: nobody is
    overtaken."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()

"""Queries shared by waiting pops of the same kind.

On a queue of many partitions a pop that finds nothing has read every cursor of its group, so
idle consumers re-checking one by one cost one such read each. Pops of the same kind (the
same :class:`PopKey`) share them instead:

- a pop about to re-check (its timer came, or its ticket was set) first waits for a like pop's
  query in flight that started after its own last one, if there is one (only that one: then
  it takes its turn, :mod:`queen.consume.turns`);
- if a like query that started after its own last one found nothing, still holds (its
  ``holds_until`` has not passed: a re-check after it, or when it said the earliest pending
  partition ripens, or never when nothing was pending), and no fire of the queue came since
  its ticket (:meth:`Wakeups.epoch`), the re-check would read the same: the pop waits again
  without querying, until that query's ``holds_until``, on a ticket taken now, which is as
  good as one taken before that query since nothing fired in between;
- a like query that delivered something answers for nobody: the next pop to look is the
  oldest to ask for its turn. A pop's first query is never shared.

Queries are numbered, so "started after" holds even when the clock did not move.

A look that must run need not read the whole queue either. The latest look of a queue pop's
kind that found nothing is its kind's *baseline*: where the wake-ups stood when it was planned
(:meth:`Wakeups.position`), and until when its answer holds. While the baseline holds and the
queue as a whole has not fired since, only partitions fired since can hold something new: the
look reads those only (its *hint*, at most :data:`HINTED_AT_MOST`; more, or forgotten, and it
reads the whole queue). A hinted look that finds nothing is the next baseline, holding until
the earlier of its own answer and its base's; one that delivers leaves the baseline as it is,
so the next look reads the same partitions again (some may have had more than it took). Pops
of one partition, and pops across queues, always read their whole scope.

Everything here runs in the Trio thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import trio

from queen.consume.wakeups import Wakeups

_EMPTY_KEPT = 1024  # records of empty queries kept before the stale ones are dropped
HINTED_AT_MOST = 64  # partitions a hinted look reads; more, and it reads the whole queue


class PopKey(NamedTuple):
    """What decides what a pop can find (its batch size does not)."""

    queue: str | None
    partition: str | None
    namespace: str
    task: str
    consumer_group: str


@dataclass(frozen=True, slots=True)
class Baseline:
    """A look of a queue pop's kind that found nothing: the wake-up position and the queue's
    wide epoch when it was planned, and until when its answer holds if nothing fires."""

    position: int
    wide: int
    holds_until: float


@dataclass(slots=True)
class Look:
    """One query of a pop: its number, when it started, the wake-up epoch of the ticket taken
    before it, an event set once it has answered and, once it found nothing, until when that
    answer holds if nothing fires (Trio time; ``inf``: until a fire). ``hint``: the partitions
    it reads (None: its whole scope), fired since ``base``; ``position`` and ``wide``: where
    the wake-ups stood when it was planned."""

    key: PopKey
    number: int
    started: float
    epoch: int
    position: int = 0
    wide: int = 0
    hint: list[str] | None = None
    base: Baseline | None = None
    baselined: bool = False  # a waiting queue pop's look: it may set its kind's baseline
    answered: trio.Event = field(default_factory=trio.Event)
    holds_until: float = 0.0


class SharedLooks:
    def __init__(self, wakeups: Wakeups) -> None:
        self._wakeups = wakeups
        self._count = 0
        self._empty: dict[PopKey, Look] = {}  # the latest like query that found nothing
        self._running: dict[PopKey, Look] = {}  # a like query in flight
        self._baselines: dict[PopKey, Baseline] = {}

    async def wait_for_like(self, key: PopKey, looked: int) -> None:
        """If a like pop's query that started after query ``looked`` is in flight, wait for
        its answer. Only that one: if it delivered, who looks next is decided by turns
        (:mod:`queen.consume.turns`), and a pop waiting here is not asking for one."""
        if not looked:
            return
        running = self._running.get(key)
        if running is not None and running.number > looked:
            await running.answered.wait()

    def answered(self, key: PopKey, looked: int) -> Look | None:
        """The like query that started after query ``looked`` (0: none yet, never answered),
        found nothing and still holds, with no wake-up of the queue since; None if none."""
        latest = self._empty.get(key)
        if (
            looked
            and latest is not None
            and latest.number > looked
            and latest.holds_until > trio.current_time()
            and latest.epoch == self._wakeups.epoch(key.queue, key.partition)
        ):
            return latest
        return None

    def unchanged(self, key: PopKey) -> float | None:
        """Until when the baseline of ``key`` holds, if it does and nothing fired since it
        (a look now would read nothing); None otherwise."""
        base = self._baselines.get(key)
        if (
            base is None
            or key.queue is None
            or base.holds_until <= trio.current_time()
            or base.wide != self._wakeups.wide_epoch(key.queue)
            or self._wakeups.fired_since(key.queue, base.position, 0) != []
        ):
            return None
        return base.holds_until

    def start(self, key: PopKey, *, waiting: bool = False) -> Look:
        """A query of ``key`` starts now (its ticket already taken). A ``waiting`` pop's look
        (one that says what is pending when it finds nothing) takes part in the baselines:
        what it reads (its hint) is fixed here, where the wake-ups stand now."""
        self._count += 1
        now = trio.current_time()
        wakeups = self._wakeups
        look = Look(key, self._count, now, wakeups.epoch(key.queue, key.partition))
        if waiting and key.queue is not None and key.partition is None:
            look.baselined = True
            look.position, look.wide = wakeups.position(), wakeups.wide_epoch(key.queue)
            base = self._baselines.get(key)
            if base is not None and base.holds_until > now and base.wide == look.wide:
                look.hint = wakeups.fired_since(key.queue, base.position, HINTED_AT_MOST)
                if look.hint is not None:
                    look.base = base
        self._running.setdefault(key, look)
        return look

    def finish(self, look: Look, *, found_nothing: bool, holds_until: float = 0.0) -> float:
        """``look`` has answered (``found_nothing``: it delivered nothing, an answer that holds
        until ``holds_until`` if nothing fires). Returns until when the answer holds, with
        what its base says (a hinted look read only part of its scope)."""
        if self._running.get(look.key) is look:
            del self._running[look.key]
        if look.base is not None:
            holds_until = min(holds_until, look.base.holds_until)
        look.holds_until = holds_until
        look.answered.set()
        if not found_nothing:
            return holds_until
        self._settle(look)
        latest = self._empty.get(look.key)
        if latest is None or look.number > latest.number:
            self._empty[look.key] = look
        if len(self._empty) > _EMPTY_KEPT:
            now = trio.current_time()
            self._empty = {
                k: v
                for k, v in self._empty.items()
                if v.holds_until > now and v.epoch == self._wakeups.epoch(k.queue, k.partition)
            }
        return holds_until

    def _settle(self, look: Look) -> None:
        """``look`` found nothing: it is its kind's baseline if it read the whole scope and was
        planned after the baseline, or extended the baseline that still stands."""
        key = look.key
        if not look.baselined:
            return
        current = self._baselines.get(key)
        if look.base is None:
            if current is not None and current.position > look.position:
                return
        elif current is not look.base:
            return
        self._baselines[key] = Baseline(look.position, look.wide, look.holds_until)
        if len(self._baselines) > _EMPTY_KEPT:
            now = trio.current_time()
            self._baselines = {
                k: v
                for k, v in self._baselines.items()
                if v.holds_until > now
                and k.queue is not None
                and v.wide == self._wakeups.wide_epoch(k.queue)
            }

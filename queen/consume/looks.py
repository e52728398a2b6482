"""Queries shared by waiting pops of the same kind.

On a queue of many partitions a pop that finds nothing has read every cursor of its group, so
idle consumers re-checking one by one cost one such read each. Pops of the same kind (the
same :class:`PopKey`) share them instead:

- a pop about to re-check (its timer came, or its ticket was set) first waits for a like pop's
  query that started after its own last one;
- if a like query that started after its own last one found nothing, still holds (its
  ``holds_until`` has not passed: a re-check after it, or when it said the earliest pending
  partition ripens, or never when nothing was pending), and no fire of the queue came since
  its ticket (:meth:`Wakeups.epoch`), the re-check would read the same: the pop waits again
  without querying, until that query's ``holds_until``, on a ticket taken now, which is as
  good as one taken before that query since nothing fired in between;
- a like query that delivered something answers for nobody: the next pop to run looks, and
  the rest wait for that one. A pop's first query is never shared.

Queries are numbered, so "started after" holds even when the clock did not move. Everything
here runs in the Trio thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import trio

from queen.consume.wakeups import Wakeups

_EMPTY_KEPT = 1024  # records of empty queries kept before the stale ones are dropped


class PopKey(NamedTuple):
    """What decides what a pop can find (its batch size does not)."""

    queue: str | None
    partition: str | None
    namespace: str
    task: str
    consumer_group: str


@dataclass(slots=True)
class Look:
    """One query of a pop: its number, when it started, the wake-up epoch of the ticket taken
    before it, an event set once it has answered and, once it found nothing, until when that
    answer holds if nothing fires (Trio time; ``inf``: until a fire)."""

    key: PopKey
    number: int
    started: float
    epoch: int
    answered: trio.Event = field(default_factory=trio.Event)
    holds_until: float = 0.0


class SharedLooks:
    def __init__(self, wakeups: Wakeups) -> None:
        self._wakeups = wakeups
        self._count = 0
        self._empty: dict[PopKey, Look] = {}  # the latest like query that found nothing
        self._running: dict[PopKey, Look] = {}  # a like query in flight

    async def wait_for_like(self, key: PopKey, looked: int) -> None:
        """While a like pop's query that started after query ``looked`` is in flight, wait
        for its answer (if it delivered, another like pop may look next: wait for that one)."""
        if not looked:
            return
        while (running := self._running.get(key)) is not None and running.number > looked:
            await running.answered.wait()
            if self.answered(key, looked) is not None:
                return

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

    def start(self, key: PopKey) -> Look:
        """A query of ``key`` starts now (its ticket already taken)."""
        self._count += 1
        look = Look(
            key, self._count, trio.current_time(), self._wakeups.epoch(key.queue, key.partition)
        )
        self._running.setdefault(key, look)
        return look

    def finish(self, look: Look, *, found_nothing: bool, holds_until: float = 0.0) -> None:
        """``look`` has answered (``found_nothing``: it delivered nothing, an answer that holds
        until ``holds_until`` if nothing fires)."""
        if self._running.get(look.key) is look:
            del self._running[look.key]
        look.holds_until = holds_until
        look.answered.set()
        if not found_nothing:
            return
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

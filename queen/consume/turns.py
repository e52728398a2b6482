"""First come, first served looks among the waiting pops of one kind.

Where consumers outnumber what arrives, every push brings one partition's worth and one pop
gets it: the first to look after the wake-up. Left to the scheduler, that pop is anyone's,
and a pop that happens to lose again and again waits out its whole timeout while newer pops
are served. So the pops of one kind (:class:`queen.consume.looks.PopKey`) that wait take
turns to look, oldest first:

- a pop that has looked and found nothing is *waiting* (:meth:`Turns.waiting`) until it
  answers; every later look of it (a re-check, a wake-up) is made in its turn;
- a new pop looks at once while no pop of its kind waits (where there is plenty, nobody
  waits and pops look side by side); while some do, its first look is made in its turn too,
  behind the older ones;
- turns go to the oldest pops asking (the order of arrival of the pops, not of their asks),
  one at a time to begin with: where one look takes all it could (more may be left), one
  more pop may look at once, up to the connections the process has; where one finds
  nothing, one fewer. A crowd of pops woken by one message thus costs about two looks, and
  a stream of messages is taken by as many looks at once as it keeps busy.

A turn covers the database call only, and a pop that gives up waiting for one (its
deadline, its client gone) passes on a turn granted meanwhile. Everything here runs in the
Trio thread.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass, field

import trio


@dataclass(slots=True, eq=False)
class _Ask:
    granted: bool = False
    gone: bool = False
    event: trio.Event = field(default_factory=trio.Event)


@dataclass(slots=True)
class _Line:
    waiting: int = 0  # pops of the kind between looks
    held: int = 0  # turns held
    limit: int = 1  # turns that may be held at once
    deciding: bool = False  # an ask waits a moment for the others before turns are given
    asks: list[tuple[int, _Ask]] = field(default_factory=list)  # a heap, oldest pop first


class Turn:
    """A granted turn; :meth:`end` passes it on (once, however often it is called)."""

    __slots__ = ("_key", "_turns")

    def __init__(self, turns: Turns | None, key: Hashable) -> None:
        self._turns = turns
        self._key = key

    def end(self, more: bool | None = None) -> None:
        """The turn is over. ``more``: True when its look took all it could (more may be
        left), False when it found nothing, None otherwise (it took less, made no look, or
        failed)."""
        turns, self._turns = self._turns, None
        if turns is not None:
            turns._end(self._key, more)


NO_TURN = Turn(None, None)  # a look that needs none


class Turns:
    def __init__(self, at_most: int) -> None:
        """``at_most``: turns of one kind held at once, at most."""
        self._at_most = max(1, at_most)
        self._lines: dict[Hashable, _Line] = {}
        self._arrivals = 0

    def arrival(self) -> int:
        """A new pop's place in the order of arrival."""
        self._arrivals += 1
        return self._arrivals

    def waiting(self, key: Hashable, delta: int) -> None:
        """A pop of ``key`` begins (+1) or ends (-1) waiting between looks."""
        line = self._line(key)
        line.waiting += delta
        self._forget_if_idle(key, line)

    def others_wait(self, key: Hashable) -> bool:
        """Whether some pop of ``key`` waits between looks (or holds or asks for a turn)."""
        line = self._lines.get(key)
        return line is not None and (line.waiting > 0 or line.held > 0 or bool(line.asks))

    def limit(self, key: Hashable) -> int:
        """How many turns of ``key`` may be held at once now."""
        line = self._lines.get(key)
        return 1 if line is None else line.limit

    async def take(self, key: Hashable, arrival: int) -> Turn:
        """Wait for the turn of the pop that arrived ``arrival``: once the older pops asking
        have had theirs (pops woken together all ask before the first turn is given). End it
        with :meth:`Turn.end`."""
        line = self._line(key)
        ask = _Ask()
        heapq.heappush(line.asks, (arrival, ask))
        try:
            if line.held < line.limit and not line.deciding:
                line.deciding = True
                try:
                    await trio.lowlevel.checkpoint()  # the pops woken with this one ask too
                finally:
                    line.deciding = False
                    self._give(line)  # (to this pop, or older ones)
            if not ask.granted:
                await ask.event.wait()
        except BaseException:
            ask.gone = True
            if ask.granted:  # granted as it was cancelled: someone else's now
                self._end(key, None)
            raise
        return Turn(self, key)

    def _line(self, key: Hashable) -> _Line:
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line()
        return line

    def _end(self, key: Hashable, more: bool | None) -> None:
        """A turn is over. One that says more may be left lets one more pop look at once; one
        whose look found nothing, one fewer (down to one)."""
        line = self._lines[key]
        line.held -= 1
        if more is not None:
            line.limit = min(self._at_most, line.limit + 1) if more else max(1, line.limit - 1)
        self._give(line)
        self._forget_if_idle(key, line)

    def _give(self, line: _Line) -> None:
        """Turns to the oldest pops asking, as many as the limit allows."""
        while line.held < line.limit and line.asks:
            _, ask = heapq.heappop(line.asks)
            if not ask.gone:
                ask.granted = True
                line.held += 1
                ask.event.set()

    def _forget_if_idle(self, key: Hashable, line: _Line) -> None:
        if line.waiting <= 0 and not line.held and not line.asks:
            del self._lines[key]

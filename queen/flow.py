"""Per queue and per minute of the last hour, what this process stored, delivered and had
acknowledged (:class:`QueueFlow`): the series of the original dashboard's queue pages
(``/analytics/queue-lag``, ``/analytics/queue-ops``). The push and consume services of a
process share one; with ``--workers N`` each worker keeps its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FLOW_SPAN_S = 3600
"""How long :class:`QueueFlow` keeps its minutes."""

FLOW_MAX_ENTRIES = 100_000
"""The most (minute, queue) entries :class:`QueueFlow` holds (about 20 MB): past it, the
oldest minute is dropped early (with thousands of busy queues, the series is shorter)."""


@dataclass(slots=True)
class Flow:
    """One queue in one minute: messages pushed (stored), popped (and how long they had
    waited), pops that found nothing, acknowledgments taken and refused."""

    pushes: int = 0
    pops: int = 0
    lag_sum_s: float = 0.0
    lag_max_s: float = 0.0
    empty_pops: int = 0
    acks: int = 0
    acks_refused: int = 0


class QueueFlow:
    """Per queue and per minute of the last hour, what this process stored, delivered and
    had acknowledged, and how long the delivered messages had waited (pop time less
    creation): the per-queue series. Kept in memory by the one Trio thread, as the counters
    are; the push and consume services of a process share one. Minutes are kept in order,
    so dropping the old ones costs nothing per update."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.minutes: dict[int, dict[str, Flow]] = {}  # minute start -> queue -> flow
        self.entries = 0

    def _flow(self, queue: str) -> Flow:
        minute = int(self.clock() // 60) * 60
        queues = self.minutes.get(minute)
        if queues is None:
            queues = self.minutes[minute] = {}
            self._drop(lambda oldest: oldest < minute - FLOW_SPAN_S)
        flow = queues.get(queue)
        if flow is None:
            flow = queues[queue] = Flow()
            self.entries += 1
            if self.entries > FLOW_MAX_ENTRIES:
                self._drop(lambda _oldest: self.entries > FLOW_MAX_ENTRIES)
        return flow

    def _drop(self, old: Callable[[int], bool]) -> None:
        """Drop the oldest minutes while ``old`` says so of them (never the current one)."""
        while len(self.minutes) > 1:
            oldest = next(iter(self.minutes))
            if not old(oldest):
                return
            self.entries -= len(self.minutes.pop(oldest))

    def pushed(self, queue: str, stored: int) -> None:
        if stored:
            self._flow(queue).pushes += stored

    def popped(self, queue: str, lags_s: Sequence[float]) -> None:
        """Messages of ``queue`` delivered, each having waited ``lags_s[i]`` seconds."""
        if not lags_s:
            return
        flow = self._flow(queue)
        flow.pops += len(lags_s)
        flow.lag_sum_s += sum(lags_s)
        flow.lag_max_s = max(flow.lag_max_s, *lags_s)

    def found_nothing(self, queue: str) -> None:
        self._flow(queue).empty_pops += 1

    def acked(self, queue: str, acks: int = 1, refused: int = 0) -> None:
        """``acks`` acknowledgments of ``queue`` taken, ``refused`` of them refused."""
        flow = self._flow(queue)
        flow.acks += acks
        flow.acks_refused += refused

    def rows(
        self, since: float, until: float, queue: str | None = None
    ) -> list[tuple[int, str, Flow]]:
        """(minute start, queue, flow) of the minutes starting from ``since`` to ``until``,
        oldest first."""
        return [
            (minute, name, queues[name])
            for minute, queues in sorted(self.minutes.items())
            if since - 60 < minute <= until
            for name in sorted(queues)
            if queue is None or name == queue
        ]

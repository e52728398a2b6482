"""Per queue and per minute of the last hour, what this process stored, delivered and had
acknowledged (:class:`QueueFlow`), and the same of every broker process on the database
(:class:`SharedFlow`): the series of the original dashboard's queue pages
(``/analytics/queue-lag``, ``/analytics/queue-ops``).

The push and consume services of a process share one :class:`QueueFlow`, kept in memory: an
update is a dict lookup and a few additions, never a database call. :class:`SharedFlow`'s
supervised loop (``flow-flush``) writes the (minute, queue) entries changed since its last
turn to the database every ``QUEEN_FLOW_FLUSH_S``, each process under its own identity and
with absolute values (a turn that failed is simply made again), and deletes the minutes past
the span; a read sums the processes' rows, this process's own figures taken from its memory
(so they are never late). A turn the database does not answer keeps the entries changed, for
the next one; a read it does not answer is this process's memory alone, and says so.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from queen.errors import StoreError
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.flow")

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
    # changed since the last flush (and listed in QueueFlow.changed); not a figure
    changed: bool = field(default=False, compare=False, repr=False)

    def copy(self) -> Flow:
        """These figures, in a :class:`Flow` of their own."""
        return dataclasses.replace(self, changed=False)

    def add(self, other: Flow) -> None:
        """Add ``other``'s figures to these (the longest wait is the longer one)."""
        self.pushes += other.pushes
        self.pops += other.pops
        self.lag_sum_s += other.lag_sum_s
        self.lag_max_s = max(self.lag_max_s, other.lag_max_s)
        self.empty_pops += other.empty_pops
        self.acks += other.acks
        self.acks_refused += other.acks_refused


FlowRow = tuple[int, str, Flow]
"""(minute start, queue, its figures)."""


def process_identity() -> str:
    """This broker process among every one that shares the database, for as long as it
    runs: host, process id and a random part (a restarted process is another one)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


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
        # the entries changed since the last flush took them (each once: Flow.changed)
        self.changed: list[FlowRow] = []

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
        if not flow.changed:
            flow.changed = True
            self.changed.append((minute, queue, flow))
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

    def take_changed(self, oldest: int) -> tuple[list[FlowRow], list[FlowRow]]:
        """The entries changed since the last call, as (copies of their figures now, the
        entries themselves): no longer changed until they are updated again (or
        :meth:`changed_again`). Entries of minutes before ``oldest`` are left out."""
        changed, self.changed = self.changed, []
        copies: list[FlowRow] = []
        taken: list[FlowRow] = []
        for minute, queue, flow in changed:
            flow.changed = False
            if minute >= oldest:
                copies.append((minute, queue, flow.copy()))
                taken.append((minute, queue, flow))
        return copies, taken

    def changed_again(self, taken: Iterable[FlowRow]) -> None:
        """``taken`` (of :meth:`take_changed`) was not saved: changed again, for the next
        flush (those updated since are listed already)."""
        for minute, queue, flow in taken:
            if not flow.changed:
                flow.changed = True
                self.changed.append((minute, queue, flow))

    @property
    def oldest_minute(self) -> int | None:
        """The oldest minute in memory (None: none). Minutes leave memory whole and oldest
        first, so every entry of this process from this minute on is in memory."""
        return min(self.minutes, default=None)

    def combined(
        self, saved: Iterable[FlowRow], since: float, until: float, queue: str | None = None
    ) -> list[FlowRow]:
        """:meth:`rows` with ``saved`` added: per minute and queue, the saved figures of the
        other processes (and this one's of the minutes no longer in memory: see
        :attr:`oldest_minute`), each a :class:`Flow` of its own (the sums are made in them;
        as with :meth:`rows`, the others are the entries themselves, to be read at once)."""
        others = {(minute, name): f for minute, name, f in saved}
        rows: list[FlowRow] = []
        for minute, name, flow in self.rows(since, until, queue):
            other = others.pop((minute, name), None)
            if other is None:
                rows.append((minute, name, flow))
            else:
                other.add(flow)
                rows.append((minute, name, other))
        if others:
            rows.extend((minute, name, f) for (minute, name), f in others.items())
            rows.sort(key=lambda row: (row[0], row[1]))
        return rows


class FlowStore(Protocol):
    """Where the processes' flows meet (:class:`queen.storage.flow.PgFlowStore`)."""

    async def save_flow(self, process: str, rows: Sequence[FlowRow], oldest: int) -> int: ...

    async def saved_flow(
        self, process: str, own_before: int, since: float, until: float, queue: str | None
    ) -> list[FlowRow]: ...


@dataclass(frozen=True, slots=True)
class FlowRows:
    """Per queue and minute, the flow of ``every`` process, or (the database did not answer)
    of this one alone."""

    rows: list[FlowRow]
    every: bool


class SharedFlow:
    """:class:`QueueFlow` of this process, saved to ``store`` every ``flush_s`` under
    ``process`` (see the module), and read back summed over every process."""

    def __init__(
        self,
        flow: QueueFlow,
        store: FlowStore,
        *,
        flush_s: float,
        process: str | None = None,
    ) -> None:
        self.flow = flow
        self.store = store
        self.flush_s = flush_s
        self.process = process or process_identity()
        self.last_flush: tuple[int, float] = (0, 0.0)  # entries written, seconds taken

    async def flush(self) -> int:
        """Save the entries changed since the last flush and delete the minutes past the
        span; how many were saved. Raises what the store raises, the entries then changed
        again."""
        oldest = int(self.flow.clock() // 60) * 60 - FLOW_SPAN_S
        copies, taken = self.flow.take_changed(oldest)
        started = time.perf_counter()
        try:
            await self.store.save_flow(self.process, copies, oldest)
        except BaseException:  # a failure or a cancellation: nothing of them is lost
            self.flow.changed_again(taken)
            raise
        self.last_flush = (len(copies), time.perf_counter() - started)
        return len(copies)

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush every ``flush_s`` until cancelled; a flush the database does not answer is
        logged, reported to the loop's supervision and made again at the next turn."""
        task_status.started()
        while True:
            await trio.sleep(self.flush_s)
            try:
                await self.flush()
            except StoreError as exc:
                log.warning("per-queue flow not saved (kept for the next turn): %s", exc)
                report_failure(exc)
            else:
                report_ok()

    async def rows(self, since: float, until: float, queue: str | None = None) -> FlowRows:
        """Every process's flow per queue and minute from ``since`` to ``until``; this
        process's alone when the database does not answer."""
        oldest = self.flow.oldest_minute
        own_before = int(until) + 60 if oldest is None else oldest
        try:
            saved = await self.store.saved_flow(self.process, own_before, since, until, queue)
        except StoreError as exc:
            log.info("per-queue flow of this process only: %s", exc)
            return FlowRows(self.flow.rows(since, until, queue), every=False)
        return FlowRows(self.flow.combined(saved, since, until, queue), every=True)

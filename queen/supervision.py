"""Background loops under supervision: no error in one of them ends the broker.

Every loop started beside the routes (the embedded server's watch, the database health probe,
the maintenance switch and encrypted-queue refreshes, retention, the spool replay, the push
listener, the admin history, the group lag history, the per-queue flow's flush and the
publishing of this process's figures for the other workers) runs through :meth:`Loops.run`, in
the loops' own nursery (:meth:`Loops.host`).
An exception (``Exception``, never a cancellation or ``KeyboardInterrupt``) is:

- **logged**: with its traceback on the first failure of a streak, in one line after that;
- **counted**: ``background_errors{loop=...}`` in ``/metrics``;
- **retried**: the loop is started again after a pause that doubles with every failure of the
  streak, from ``retry_min_s`` up to ``retry_max_s``;
- **shown**: ``/health`` lists every loop as ``ok`` or ``failing`` (since when, how many errors,
  the last one). A restarted loop is ``ok`` again, and its streak over, once it has run for
  ``recover_s`` without failing.

Most loops also handle the errors they expect (a retention pass or a refresh the database does
not answer, a push listener that cannot connect): they log them and go on at their next turn,
and nothing escapes. Such a loop says how each turn went, :func:`report_failure` or
:func:`report_ok` (a context variable of the loop's task, and of the tasks it starts, finds its
state): a reported failure counts as an error and the loop is ``failing``, since its first
failure, until it reports a turn that went well. The loop logs its own failures; the reports
only keep the state ``/health``, the dashboard and ``/metrics`` read. Outside a supervised loop
(a retention pass an operator asked for) a report does nothing.

A loop is an ``async def run(*, task_status)`` that reports ready once. If it fails before that,
the broker does not wait for it: it is reported ready (and failing), and retried like any other.
A loop that returns has nothing (more) to do (e.g. a refresh with no database to read): it is
``done`` and not restarted.

:func:`stop_signals` is how a process (``queen serve``, each of its workers, ``queen import``)
hears that it is asked to stop: the first SIGINT or SIGTERM sets an event, and the later ones
are taken as already answered instead of raising ``KeyboardInterrupt`` in the middle of the
clean-up.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import trio

log = logging.getLogger("queen.supervisor")


class Loop(Protocol):
    def __call__(self, *, task_status: trio.TaskStatus[Any]) -> Awaitable[object]: ...


@dataclass(slots=True)
class LoopState:
    """What ``/health`` and ``/metrics`` say about one loop."""

    name: str
    errors: int = 0  # every failure since start
    streak: int = 0  # failures since the loop last ran ``recover_s`` without failing
    failing_since: float | None = None  # wall clock, first failure of the streak
    last_error: str | None = None
    started_at: float = 0.0  # trio clock, last (re)start; infinite while paused after a failure
    done: bool = False  # returned: nothing more to do
    reported: int = 0  # turns the loop reported failed in a row (report_failure)

    def failing(self, now: float, recover_s: float) -> bool:
        if self.done:
            return False
        return self.reported > 0 or (self.streak > 0 and now - self.started_at < recover_s)

    def reported_ok(self) -> None:
        """A turn without error: what the loop reported is over."""
        self.reported = 0

    def status(self, now: float, recover_s: float) -> LoopStatus:
        failing = self.failing(now, recover_s)
        return LoopStatus(
            state="done" if self.done else "failing" if failing else "ok",
            errors=self.errors,
            failing_since=(
                datetime.fromtimestamp(self.failing_since, UTC)
                if failing and self.failing_since is not None
                else None
            ),
            last_error=self.last_error,
        )


@dataclass(frozen=True, slots=True)
class LoopStatus:
    """One loop as ``/health`` shows it: ``ok``, ``failing`` (since when) or ``done``."""

    state: str
    errors: int
    failing_since: datetime | None = None
    last_error: str | None = None


class _Ready:
    """Passes ``started`` through to the caller's task status, once, and remembers it."""

    def __init__(self, status: trio.TaskStatus[Any]) -> None:
        self._status = status
        self.done = False

    def started(self, value: Any = None) -> None:
        if not self.done:
            self.done = True
            self._status.started(value)


_CURRENT: ContextVar[tuple[Loops, LoopState] | None] = ContextVar("queen_loop", default=None)


def report_failure(error: BaseException | str) -> None:
    """The supervised loop running this task handled an error: this turn failed (see the
    module). Nothing outside a supervised loop."""
    current = _CURRENT.get()
    if current is not None:
        loops, state = current
        loops.reported_failure(state, error)


def report_ok() -> None:
    """The supervised loop running this task had a turn without error: no longer failing
    from what it reported. Nothing outside a supervised loop."""
    current = _CURRENT.get()
    if current is not None:
        current[1].reported_ok()


class Loops:
    """The supervised loops of one broker and their states.

    :meth:`host` is the loops' own nursery (``await nursery.start(loops.host)``); :meth:`start`
    starts one loop in it. Cancelling the host stops every loop.
    """

    def __init__(
        self, *, retry_min_s: float = 0.1, retry_max_s: float = 30.0, recover_s: float = 5.0
    ) -> None:
        self._retry_min_s = retry_min_s
        self._retry_max_s = max(retry_max_s, retry_min_s)
        self.recover_s = recover_s
        self.states: dict[str, LoopState] = {}
        self._nursery: trio.Nursery | None = None

    async def host(self, *, task_status: trio.TaskStatus[Loops] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the loops until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started(self)
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def start(self, name: str, loop: Callable[..., Awaitable[object]]) -> None:
        """Start ``loop`` (``async def run(*, task_status)``) under supervision in the host's
        nursery; returns once it reports ready (or first failed)."""
        if self._nursery is None:
            raise RuntimeError("the loops are not hosted")
        await self._nursery.start(self.run, name, loop, name=f"loop:{name}")

    def statuses(self) -> dict[str, LoopStatus]:
        now = trio.current_time()
        return {n: s.status(now, self.recover_s) for n, s in self.states.items()}

    def failing(self) -> list[str]:
        now = trio.current_time()
        return [n for n, s in self.states.items() if s.failing(now, self.recover_s)]

    def errors(self) -> dict[str, float]:
        return {n: float(s.errors) for n, s in self.states.items()}

    async def run(
        self,
        name: str,
        loop: Callable[..., Awaitable[object]],
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run ``loop`` until cancelled, restarting it after every failure; see the module."""
        state = self.states.setdefault(name, LoopState(name))
        _CURRENT.set((self, state))  # this task's context, and that of the tasks it starts
        ready = _Ready(task_status)
        while True:
            state.started_at = trio.current_time()
            try:
                await loop(task_status=ready)
            except Exception as exc:
                pause = self._failed(state, f"{type(exc).__name__}: {exc}", exc)
            else:
                state.done = True
                ready.started()
                log.debug("background loop %s has nothing to do", name)
                return
            ready.started()  # start-up goes on without this loop
            await trio.sleep(pause)

    def reported_failure(self, state: LoopState, error: BaseException | str) -> None:
        """``state``'s loop handled an error (it logged it): an error, and failing until it
        reports a turn without one."""
        if not state.failing(trio.current_time(), self.recover_s):
            state.failing_since = time.time()
        state.reported += 1
        state.errors += 1
        state.last_error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"

    def _failed(self, state: LoopState, error: str, exc: Exception) -> float:
        now = trio.current_time()
        if state.streak and now - state.started_at >= self.recover_s:
            state.streak = 0  # it ran long enough since the last failure: a new streak
        was_failing = state.failing(now, self.recover_s)
        state.started_at = math.inf  # failing through the pause, and recover_s after it
        state.errors += 1
        state.streak += 1
        state.last_error = error
        if state.streak == 1:
            if not was_failing:  # (a loop may be failing already from what it reported)
                state.failing_since = time.time()
            log.error(
                "background loop %s failed: %s; restarting it", state.name, error, exc_info=exc
            )
        else:
            log.warning(
                "background loop %s failed again (%d in a row): %s",
                state.name,
                state.streak,
                error,
            )
        return float(min(self._retry_max_s, self._retry_min_s * 2 ** (state.streak - 1)))


@contextmanager
def stop_signals(on_stop: Callable[[], object] | None = None) -> Iterator[trio.Event]:
    """An event set at the first SIGINT or SIGTERM (``on_stop``, if given, is called then, in
    the run loop). Until the block ends, further ones are taken and dropped: a second Ctrl-C
    while the process stops does not interrupt its clean-up (Trio would raise
    ``KeyboardInterrupt`` wherever the process happened to be). The handlers only hand the
    signal to the run loop (``run_sync_soon`` is safe in a signal handler); Trio's wake-up
    descriptor wakes it. Call from Trio's main thread."""
    stop = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def noted(signum: int) -> None:
        if stop.is_set():
            log.info("%s: already stopping", signal.Signals(signum).name)
            return
        stop.set()
        if on_stop is not None:
            on_stop()

    def handler(signum: int, _frame: object) -> None:
        token.run_sync_soon(noted, signum)

    before = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)

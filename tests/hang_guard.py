"""Every test has a deadline (pytest-timeout's ``timeout``; ``@pytest.mark.timeout(s)`` for one
test; tests marked ``slow`` get :data:`SLOW_TIMEOUT_S` unless they say otherwise).

pytest-timeout's own ways of ending a test do not suit Trio: its signal raises inside whatever
runs, Trio's scheduler included (the run is corrupted and pytest itself fails), and its thread
ends the whole session. So for a Trio test the deadline is kept here, in real time (the test may
run on a virtual clock): when it passes, the stacks of every Trio task are written to the test's
captured stderr and the whole test (fixtures too) is cancelled; the test fails with a timeout.
A test that does not end within :data:`GRACE_S` of that cancellation (stuck in a thread or a
shielded scope) is ended the pytest-timeout way: stacks dumped, the session ends with status 1.
Synchronous tests keep pytest-timeout's signal method.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import pytest_timeout
import trio
import trio.lowlevel

SLOW_TIMEOUT_S = 300.0  # a real-process or real-database test marked `slow`
GRACE_S = 15.0  # after the cancellation, before the session is ended


class _Guard:
    """The deadline of one Trio test; the timer thread and the Trio thread share it."""

    def __init__(self, item: pytest.Item, settings: Any) -> None:
        self.item = item
        self.settings = settings
        self.fired = False
        self._lock = threading.Lock()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._timer = threading.Timer(settings.timeout, self._expire)
        self._timer.name = f"hang guard {item.nodeid}"
        self._timer.daemon = True
        self._grace: threading.Timer | None = None

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            if self._grace is not None:
                self._grace.cancel()

    def attach(self, scope: trio.CancelScope) -> None:
        with self._lock:
            self._token = trio.lowlevel.current_trio_token()
            self._scope = scope

    def detach(self) -> None:
        with self._lock:
            self._token = self._scope = None

    def _expire(self) -> None:
        with self._lock:
            token, scope = self._token, self._scope
            self.fired = True
            if token is not None and scope is not None:
                self._grace = threading.Timer(GRACE_S, self._end_session)
                self._grace.daemon = True
                self._grace.start()
        if token is None or scope is None:
            self._end_session()  # not in the Trio run (a synchronous fixture hangs)
            return
        try:
            token.run_sync_soon(partial(self._cancel, scope))
        except trio.RunFinishedError:
            pass

    def _cancel(self, scope: trio.CancelScope) -> None:
        print(
            f"\n+++ Timeout: {self.item.nodeid} ran past {self.settings.timeout} s; "
            "the stacks of its Trio tasks:\n" + _task_stacks(),
            file=sys.stderr,
        )
        scope.cancel()

    def _end_session(self) -> None:
        pytest_timeout.timeout_timer(self.item, self.settings)


def _task_stacks() -> str:
    lines: list[str] = []

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        indent = "  " * depth
        lines.append(f"{indent}task {task.name}")
        for frame, lineno in task.iter_await_frames():
            code = frame.f_code
            lines.append(f"{indent}  {code.co_filename}:{lineno} in {code.co_name}")
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child, depth + 1)

    walk(trio.lowlevel.current_root_task(), 0)
    return "\n".join(lines)


_GUARD = pytest.StashKey[_Guard]()


def _guarded_run(
    item: pytest.Item,
    fn: Callable[[], Awaitable[object]],
    *,
    clock: trio.abc.Clock | None = None,
    instruments: list[trio.abc.Instrument] | None = None,
) -> object:
    """pytest-trio's ``trio.run``, with the whole test inside a scope the guard can cancel."""
    guard = item.stash.get(_GUARD, None)

    async def main() -> object:
        if guard is None:
            return await fn()
        with trio.CancelScope() as scope:
            guard.attach(scope)
            try:
                return await fn()
            except BaseException as exc:
                if guard.fired:
                    raise _timed_out(guard) from exc
                raise
            finally:
                guard.detach()
        raise _timed_out(guard)  # cancelled while nothing raised

    return trio.run(main, clock=clock, instruments=instruments or ())


def _timed_out(guard: _Guard) -> BaseException:
    try:
        pytest.fail(f"Timeout: the test ran past {guard.settings.timeout} s", pytrace=False)
    except pytest.fail.Exception as failure:
        return failure
    raise AssertionError("unreachable")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
        if item.get_closest_marker("trio") is not None:
            # pytest-trio runs the test with the `run` of the first trio marker it finds.
            item.add_marker(pytest.mark.trio(run=partial(_guarded_run, item)), append=False)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if item.get_closest_marker("trio") is None:
        return None  # pytest-timeout's own signal
    guard = _Guard(item, settings)
    item.stash[_GUARD] = guard
    guard.start()
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    guard = item.stash.get(_GUARD, None)
    if guard is None:
        return None
    guard.cancel()
    del item.stash[_GUARD]
    return True

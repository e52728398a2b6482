"""Database health: one flag the whole broker trusts, and the probe that keeps it true.

Writers report an unreachable database the moment a call fails (:meth:`report_down`); from
then on pushes go straight to the spool without trying the database, so an outage costs no
connect timeout per push.

The probe loop (:meth:`run`) pings the database on a connection of its own:

- while it is **up**, every ``probe_max_s``: a ping without an answer within
  ``probe_timeout_s`` (a database that hangs without closing its connections) or failing marks
  it down;
- while it is **down**, with exponential back-off from ``probe_min_s`` up to ``probe_max_s``:
  the first answer (and, if the schema was never created because the broker started during an
  outage, a successful migration) marks it up again and wakes whoever waits for it (the spool
  replay).

A probe without an answer also calls ``on_hang``, which gives up the database calls in flight
(they would otherwise wait for their own deadline): their pushes go to the spool at once, a pop
answers 503.

:meth:`check` is what ``/health`` asks: it joins the probe in flight (or starts one) and waits
for its answer at most ``wait_s``, then answers from the flag, so it never waits on the database
longer than that whatever the database does. Only one probe runs at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import trio
from trio_util import RepeatedEvent

from queen.errors import StoreError

log = logging.getLogger("queen.health")


class DatabaseHealth:
    def __init__(
        self,
        ping: Callable[[], Awaitable[None]],
        *,
        probe_min_s: float,
        probe_max_s: float,
        changed: RepeatedEvent,
        probe_timeout_s: float = 2.0,
        up: bool = True,
        on_up: Callable[[], Awaitable[None]] | None = None,
        on_hang: Callable[[], int] | None = None,
    ) -> None:
        self._ping = ping
        self._probe_min_s = probe_min_s
        self._probe_max_s = max(probe_max_s, probe_min_s)
        self._probe_timeout_s = probe_timeout_s
        self._changed = changed
        self._on_up = on_up
        self._on_hang = on_hang
        self._up = up
        # Wall clock of the moment the database was last seen going away (None while up).
        self.down_since: float | None = None if up else time.time()
        self._probing: trio.Event | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def up(self) -> bool:
        return self._up

    def report_down(self, reason: object) -> None:
        """A database call failed because the database is unreachable (or did not answer)."""
        if self._up:
            self._up = False
            self.down_since = time.time()
            log.warning("database unreachable (%s); pushes go to the spool", reason)
            self._changed.set()

    async def wait_up(self) -> None:
        """Return once the database is seen reachable (at once when it is)."""
        while not self._up:
            await self._changed.wait()

    def _mark_up(self) -> None:
        if not self._up:
            self._up = True
            self.down_since = None
            log.warning("database reachable again; the spool will be replayed")
            self._changed.set()

    async def check(self, wait_s: float) -> bool:
        """Probe now (or join the probe in flight) and wait for it at most ``wait_s``; then
        the flag, fresh or as it was."""
        if self._nursery is not None:
            with trio.move_on_after(wait_s):
                await self._probe()
        return self._up

    def probe_soon(self) -> None:
        """Start a probe now (unless one is in flight), without waiting for it: the database
        is known to be back (an embedded server that was started again)."""
        if self._nursery is not None and self._probing is None:
            self._probing = trio.Event()
            self._nursery.start_soon(self._probe_once, self._probing)

    async def run(
        self, *, task_status: trio.TaskStatus[DatabaseHealth] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                task_status.started(self)
                delay = self._probe_min_s
                while True:
                    if self._up:
                        delay = self._probe_min_s
                        with trio.move_on_after(self._probe_max_s):
                            while self._up:  # until a writer reports it down
                                await self._changed.wait()
                        if self._up:
                            await self._probe()
                    else:
                        with trio.move_on_after(delay):
                            while not self._up:  # until it is seen up (a restarted server)
                                await self._changed.wait()
                        if not self._up:
                            await self._probe()
                            delay = min(self._probe_max_s, delay * 2)
            finally:
                self._nursery = None

    def _hung(self) -> None:
        if self._on_hang is not None:
            dropped = self._on_hang()
            if dropped:
                log.warning(
                    "database gave no answer to a probe within %g s: %d calls in flight given up",
                    self._probe_timeout_s,
                    dropped,
                )

    async def _probe(self) -> None:
        """Wait for the probe in flight, starting one if none is."""
        self.probe_soon()
        if self._probing is not None:
            await self._probing.wait()

    async def _probe_once(self, done: trio.Event) -> None:
        try:
            with trio.move_on_after(self._probe_timeout_s) as deadline:
                await self._ping()
            if deadline.cancelled_caught:
                self._hung()
                raise StoreError(f"no answer within {self._probe_timeout_s:g} s")
            if not self._up and self._on_up is not None:
                await self._on_up()
        except StoreError as exc:
            if self._up:
                self.report_down(exc)
            else:
                log.debug("database probe failed: %s", exc)
        else:
            self._mark_up()
        finally:
            self._probing = None
            done.set()

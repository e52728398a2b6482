"""Database health: one flag the whole broker trusts, and the probe that sets it back.

Writers report an unreachable database the moment a call fails (:meth:`report_down`); from
then on pushes go straight to the spool without trying the database, so an outage costs no
connect timeout per push. The probe loop pings with exponential back-off (``probe_min_s`` up to
``probe_max_s``) while the database is down; the first answer (and, if the schema was never
created because the broker started during an outage, a successful migration) marks it up
again and wakes whoever waits for it (the spool replay).

The monitor owns only the flag and its probe task; cancelling ``run`` stops probing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from queen.broadcast import Signal
from queen.storage.base import StoreError

log = logging.getLogger("queen.health")


class DatabaseHealth:
    def __init__(
        self,
        ping: Callable[[], Awaitable[None]],
        *,
        probe_min_s: float,
        probe_max_s: float,
        changed: Signal,
        up: bool = True,
        on_up: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._ping = ping
        self._probe_min_s = probe_min_s
        self._probe_max_s = probe_max_s
        self._changed = changed
        self._on_up = on_up
        self._up = up
        self._went_down = trio.Event()
        if not up:
            self._went_down.set()

    @property
    def up(self) -> bool:
        return self._up

    def report_down(self, reason: object) -> None:
        """A database call failed because the database is unreachable."""
        if self._up:
            self._up = False
            log.warning("database unreachable (%s); pushes go to the spool", reason)
            self._went_down.set()
            self._changed.fire()

    async def run(
        self, *, task_status: trio.TaskStatus[DatabaseHealth] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started(self)
        while True:
            await self._went_down.wait()
            await self._probe_until_up()
            self._went_down = trio.Event()
            self._up = True
            log.warning("database reachable again; the spool will be replayed")
            self._changed.fire()

    async def _probe_until_up(self) -> None:
        delay = self._probe_min_s
        while True:
            await trio.sleep(delay)
            try:
                with trio.fail_after(max(1.0, self._probe_max_s)):
                    await self._ping()
                    if self._on_up is not None:
                        await self._on_up()
                return
            except (StoreError, trio.TooSlowError) as exc:
                log.debug("database probe failed: %s", exc)
            delay = min(self._probe_max_s, delay * 2)

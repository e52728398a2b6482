"""The admin switches shared by every broker process through the database, in one cache.

**Maintenance mode** (``maintenance_mode``): while it is on, every push is spooled and answers
``buffered``, and the spool is not replayed, so an operator can take the database away without
producers failing. Turning it off lets the replay drain the spool.

**Pop maintenance** (``pop_maintenance_mode``): while it is on, every pop answers "nothing"
at once (HTTP 204) and waiting pops are woken to answer so.

Both live in ``queen.system_state`` (value ``{"enabled": bool}``). Every process keeps one
cached copy of both, loaded at start and refreshed every ``refresh_s`` while the database is
reachable, so reading a switch never needs the database (and keeps working during an outage;
a refresh that fails keeps the last known values). Setting a switch writes the database first,
then the cache; if the database cannot be written, the switch is unchanged and the caller gets
:class:`queen.errors.StoreError`.
"""

from __future__ import annotations

import logging

import trio
from trio_util import RepeatedEvent

from queen.errors import StoreError
from queen.storage.base import StateStore
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.maintenance")

KEY = "maintenance_mode"
POP_KEY = "pop_maintenance_mode"


class MaintenanceSwitch:
    """The two switches, cached. They are plain booleans, not ``trio_util.AsyncValue``s: no
    one waits for a value of one switch; a change is announced on the broker's shared
    ``changed`` event, with the spool's and the database's changes, and the replay waits on
    that. A push reads :attr:`enabled` without an extra call."""

    def __init__(
        self, store: StateStore | None, *, refresh_s: float, changed: RepeatedEvent
    ) -> None:
        self._store = store
        self._refresh_s = refresh_s
        self._changed = changed
        self._enabled = False
        self._pop_enabled = False

    @property
    def enabled(self) -> bool:
        """Whether maintenance mode (pushes to the spool) is on."""
        return self._enabled

    @property
    def pop_enabled(self) -> bool:
        """Whether pop maintenance (every pop answers nothing) is on."""
        return self._pop_enabled

    async def load(self) -> None:
        """Read the stored values (start-up, and every refresh)."""
        if self._store is None:
            return
        pushes = _enabled(await self._store.get_state(KEY))
        pops = _enabled(await self._store.get_state(POP_KEY))
        self._apply(pushes)
        self._apply_pop(pops)

    async def set(self, enabled: bool) -> None:
        if self._store is None:
            self._apply(enabled)
            return
        await self._store.set_state(KEY, {"enabled": enabled})
        self._apply(enabled)

    async def set_pop(self, enabled: bool) -> None:
        if self._store is not None:
            await self._store.set_state(POP_KEY, {"enabled": enabled})
        self._apply_pop(enabled)

    def _apply_pop(self, enabled: bool) -> None:
        if enabled != self._pop_enabled:
            self._pop_enabled = enabled
            log.warning("pop maintenance %s", "ON: pops answer nothing" if enabled else "OFF")

    def _apply(self, enabled: bool) -> None:
        if enabled != self._enabled:
            self._enabled = enabled
            log.warning("maintenance mode %s", "ON: pushes go to the spool" if enabled else "OFF")
            self._changed.set()

    async def run(
        self, *, task_status: trio.TaskStatus[MaintenanceSwitch] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Refresh the cached values until cancelled; failures keep the last known values
        (and are reported to the loop's supervision). The pause comes after each refresh, not
        at a fixed rate (``trio_util.periodic`` starts the next one at once after an overrun):
        a slow database is not asked again straight away."""
        task_status.started(self)
        while True:
            await trio.sleep(self._refresh_s)
            try:
                await self.load()
            except StoreError as exc:
                log.debug("maintenance switch not refreshed: %s", exc)
                report_failure(exc)
            else:
                report_ok()


def _enabled(value: object) -> bool:
    return isinstance(value, dict) and bool(value.get("enabled"))

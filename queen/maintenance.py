"""Maintenance mode: a switch shared by every broker process through the database.

While it is on, every push is spooled and answers ``buffered``, and the spool is not replayed,
so an operator can take the database away without producers failing. Turning it off lets the
replay drain the spool.

The value lives in ``queen.system_state`` under ``maintenance_mode``. Every process keeps a
cached copy, refreshed every ``refresh_s`` while the database is reachable, so reading the
switch never needs the database (and keeps working during an outage). Setting it writes the
database first, then the cache; if the database cannot be written, the switch is unchanged and
the caller gets :class:`queen.storage.base.StoreError`.
"""

from __future__ import annotations

import logging

import trio

from queen.broadcast import Signal
from queen.storage.base import StateStore, StoreError

log = logging.getLogger("queen.maintenance")

KEY = "maintenance_mode"


class MaintenanceSwitch:
    def __init__(self, store: StateStore | None, *, refresh_s: float, changed: Signal) -> None:
        self._store = store
        self._refresh_s = refresh_s
        self._changed = changed
        self._enabled = False

    @property
    def enabled(self) -> bool:
        return self._enabled

    async def load(self) -> None:
        """Read the stored value (start-up, and every refresh)."""
        if self._store is None:
            return
        value = await self._store.get_state(KEY)
        self._apply(bool(value.get("enabled")) if isinstance(value, dict) else False)

    async def set(self, enabled: bool) -> None:
        if self._store is None:
            self._apply(enabled)
            return
        await self._store.set_state(KEY, {"enabled": enabled})
        self._apply(enabled)

    def _apply(self, enabled: bool) -> None:
        if enabled != self._enabled:
            self._enabled = enabled
            log.warning("maintenance mode %s", "ON: pushes go to the spool" if enabled else "OFF")
            self._changed.fire()

    async def run(
        self, *, task_status: trio.TaskStatus[MaintenanceSwitch] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Refresh the cached value until cancelled; failures keep the last known value."""
        task_status.started(self)
        while True:
            await trio.sleep(self._refresh_s)
            try:
                await self.load()
            except StoreError as exc:
                log.debug("maintenance switch not refreshed: %s", exc)

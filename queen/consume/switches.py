"""Admin switches shared by every broker process, read through a short cache.

The value lives in ``queen.system_state`` (key ``pop_maintenance_mode``, value
``{"enabled": bool}``), so every process sharing the database sees it within the cache time
and it survives restarts. Setting it through this process updates the local cache at once.
If the database cannot be read, the last known value stands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from queen.storage.base import StateStore, StoreError

log = logging.getLogger("queen.consume")

POP_MAINTENANCE = "pop_maintenance_mode"


class Switches:
    def __init__(
        self,
        store: StateStore,
        *,
        cache_s: float,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self._store = store
        self._cache_s = cache_s
        self._clock = clock
        self._values: dict[str, tuple[bool, float]] = {}  # key -> (enabled, read at)
        self._lock = trio.Lock()

    async def enabled(self, key: str) -> bool:
        """Whether the switch ``key`` is on, at most ``cache_s`` old."""
        cached = self._values.get(key)
        if cached is not None and self._clock() - cached[1] < self._cache_s:
            return cached[0]
        async with self._lock:  # one reader refreshes; the others take its answer
            cached = self._values.get(key)
            if cached is not None and self._clock() - cached[1] < self._cache_s:
                return cached[0]
            try:
                value = await self._store.get_state(key)
            except StoreError as exc:
                log.warning("cannot read switch %s (%s); keeping the last value", key, exc)
                return cached[0] if cached else False
            enabled = isinstance(value, dict) and value.get("enabled") is True
            self._values[key] = (enabled, self._clock())
            return enabled

    async def set(self, key: str, enabled: bool) -> None:
        await self._store.set_state(key, {"enabled": enabled})
        self._values[key] = (enabled, self._clock())

"""How many request body bytes one process may hold at once."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

log = logging.getLogger("queen.http")

# Returning freed memory to the system after big bodies: glibc keeps the heap it grew for them
# otherwise (hundreds of MiB, measured). None where there is no glibc.
_MALLOC_TRIM: Callable[[int], int] | None = None
try:
    _MALLOC_TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):
    pass


def return_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``), if possible."""
    if _MALLOC_TRIM is not None:
        started = time.perf_counter()
        _MALLOC_TRIM(0)
        log.debug("malloc_trim took %.1f ms", (time.perf_counter() - started) * 1000)


class BodyBudget:
    """A counter of request body bytes in progress, bounded by ``limit_bytes``.

    A body is charged from the moment it starts arriving until its request has been answered:
    that covers the raw bytes, their decoded form and the work done with them, which is what
    makes a big body expensive. Charging is synchronous (no checkpoint), so a charge that
    succeeds is never overtaken by another one.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.in_use_bytes = 0
        self.refused = 0

    def try_charge(self, size: int) -> bool:
        """Charge ``size`` bytes if they fit under the limit; False (and nothing charged) if not."""
        if size <= 0:
            return True
        if self.in_use_bytes + size > self.limit_bytes:
            self.refused += 1
            return False
        self.in_use_bytes += size
        return True

    def release(self, size: int) -> None:
        self.in_use_bytes -= size

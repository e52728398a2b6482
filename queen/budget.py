"""How many bytes of request bodies and pop answers one process holds at once.

One :class:`ByteBudget` per broker process (``QUEEN_MAX_DECODING_BYTES``): the HTTP server
charges a request body to it from its first byte until its request is answered, and the
consume side charges a pop's answer while it is built and sent (:class:`Charge`). Charging is
synchronous (no checkpoint), so a charge that succeeds is never overtaken by another one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable

import trio
from trio_util import RepeatedEvent

log = logging.getLogger("queen.http")

# After a body or an answer at least this big has been released, once nothing is charged,
# freed memory goes back to the system.
TRIM_AFTER_BYTES = 8 * 1024 * 1024

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


class ByteBudget:
    """A counter of bytes in progress, bounded by ``limit_bytes``.

    A request body is charged from the moment it starts arriving until its request has been
    answered: that covers the raw bytes, their decoded form and the work done with them, which
    is what makes a big body expensive. A pop's answer is charged from the moment its messages
    are read until it has been sent. ``try_charge`` refuses what does not fit; ``charge``
    takes bytes already in memory (a pop's messages, leased and to be delivered) whether they
    fit or not.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.in_use_bytes = 0
        self.refused = 0
        self._freed = RepeatedEvent()  # set by a release while a task waits for room
        self._waiting = 0  # tasks in wait_for_room

    @property
    def room(self) -> int:
        """Bytes that may still be charged (0 or less: none)."""
        return self.limit_bytes - self.in_use_bytes

    def try_charge(self, size: int) -> bool:
        """Charge ``size`` bytes if they fit under the limit; False (and nothing charged) if not."""
        if size <= 0:
            return True
        if self.in_use_bytes + size > self.limit_bytes:
            self.refused += 1
            return False
        self.in_use_bytes += size
        return True

    def charge(self, size: int) -> Charge:
        """Charge ``size`` bytes whether they fit or not; the :class:`Charge` gives them back."""
        self.in_use_bytes += size
        return Charge(self, size)

    def release(self, size: int, *, trim: bool = False) -> None:
        """Give ``size`` bytes back. With ``trim`` (they were a body or an answer held in
        memory), a big release that leaves nothing charged returns freed memory to the
        system."""
        self.in_use_bytes -= size
        if size > 0 and self._waiting:
            self._freed.set()
        if trim and size >= TRIM_AFTER_BYTES and self.in_use_bytes == 0:
            return_free_memory()

    async def wait_for_room(self, deadline: float) -> bool:
        """Wait until there is room, or until ``deadline`` (Trio time); whether there is.
        With room now it returns at once, without a checkpoint."""
        if self.room > 0:
            return True
        self._waiting += 1
        try:
            with trio.move_on_at(deadline):
                while self.room <= 0:
                    await self._freed.wait()
        finally:
            self._waiting -= 1
        return self.room > 0


class Charge:
    """Bytes charged to a :class:`ByteBudget` until :meth:`release` (only the first call
    counts)."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: ByteBudget | None, size: int) -> None:
        self._budget = budget
        self.size = size

    @classmethod
    def nothing(cls) -> Charge:
        """A charge of nothing, to no budget."""
        return cls(None, 0)

    def resize(self, size: int) -> None:
        """Charge ``size`` bytes instead (whether they fit or not); nothing once released."""
        if self._budget is not None:
            grown, self.size = size - self.size, size
            if grown >= 0:
                self._budget.in_use_bytes += grown
            else:
                self._budget.release(-grown)

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget.release(self.size, trim=True)

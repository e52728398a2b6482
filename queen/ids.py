"""Message ids: UUIDv7 (RFC 9562), minted in batches, monotonic inside one process.

Layout: 48 bits of Unix milliseconds, the version nibble 7, then a 26-bit counter split over
``rand_a`` (12 bits) and the top of ``rand_b`` (14 bits, after the variant), then 48 random bits.
The counter restarts at zero each millisecond, so ids minted by one process sort in minting
order; if the wall clock steps back, the last millisecond is reused and the counter keeps going.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

NIL_UUID = "00000000-0000-0000-0000-000000000000"

_COUNTER_LIMIT = 1 << 26
_POOL_IDS = 4096  # ids' worth of random bits read from the system at once


class _Sequence:
    """The (millisecond, counter) position of the last id minted by this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_ms = 0
        self.next_counter = 0
        # Random bits as hex, read from the system for many ids at once (one system call per
        # id cost more than the rest of minting); a forked child starts a pool of its own.
        self.pool = ""
        self.pool_at = 0

    def reserve(self, n: int) -> tuple[int, int, str]:
        """Reserve ``n`` consecutive slots; return the first, and ``12 * n`` random hex
        digits never handed out before."""
        with self.lock:
            now_ms = time.time_ns() // 1_000_000
            if now_ms > self.last_ms:
                self.last_ms, self.next_counter = now_ms, 0
            if self.next_counter + n > _COUNTER_LIMIT:  # borrow the next millisecond
                self.last_ms += 1
                self.next_counter = 0
            first = self.next_counter
            self.next_counter += n
            if n > _POOL_IDS:
                return self.last_ms, first, os.urandom(6 * n).hex()
            end = self.pool_at + 12 * n
            if end > len(self.pool):
                self.pool, self.pool_at, end = os.urandom(6 * _POOL_IDS).hex(), 0, 12 * n
            rnd = self.pool[self.pool_at : end]
            self.pool_at = end
            return self.last_ms, first, rnd

    def forget_pool(self) -> None:
        self.lock = threading.Lock()
        self.pool, self.pool_at = "", 0


_sequence = _Sequence()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_sequence.forget_pool)


# The fourth group of every id ("8xxx-": the variant bits and the low 14 counter bits),
# formatted once: building ids from slices of this table is three times faster than formatting.
_LOW_GROUPS = [f"{0x8000 | low:04x}-" for low in range(1 << 14)]


def mint_ids(n: int) -> list[str]:
    """Return ``n`` fresh UUIDv7 strings, in increasing order."""
    if n <= 0:
        return []
    ms, counter, rnd = _sequence.reserve(n)
    stamp = f"{ms:012x}"
    head = f"{stamp[:8]}-{stamp[8:]}-7"
    if n == 1:  # the common case of small pushes, without the loop below
        return [f"{head}{counter >> 14:03x}-{_LOW_GROUPS[counter & 0x3FFF]}{rnd}"]
    ids: list[str] = []
    done = 0
    while done < n:  # one run per value of the counter's high 12 bits
        c = counter + done
        low = c & 0x3FFF
        take = min(n - done, 0x4000 - low)
        high = f"{head}{c >> 14:03x}-"
        ids += [
            high + group + rnd[j : j + 12]
            for group, j in zip(
                _LOW_GROUPS[low : low + take], range(12 * done, 12 * (done + take), 12), strict=True
            )
        ]
        done += take
    return ids


def mint_id() -> str:
    return mint_ids(1)[0]


def millis_of(message_id: str) -> int:
    """The creation time carried by a UUIDv7, in milliseconds since the epoch."""
    return int(message_id[:8] + message_id[9:13], 16)


def timestamp_of(message_id: str) -> datetime:
    """The creation time carried by a UUIDv7 (millisecond precision, UTC)."""
    ms = int(message_id[:8] + message_id[9:13], 16)
    return datetime.fromtimestamp(ms / 1000, tz=UTC)

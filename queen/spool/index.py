"""What the spool still holds, per file and per partition (in memory, rebuilt from the files).

The index answers the question the ordering rule needs: "does partition P have spooled items
that are not committed yet?" While it does, new pushes to P are spooled behind them.

Counts are in frames. They come from three places: this process's own appends (counted once
durable, by the writer), every other file of the directory, those other processes are still
writing included (counted by :class:`queen.spool.scan.SpoolScanner` as their records become
complete), and replay progress (subtracted as replayed frames commit). A file that disappears
(replayed and removed, by this process or another one) is dropped with all its counts.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from queen.model import PartitionKey


@dataclass(slots=True)
class _FileCounts:
    per_partition: Counter[PartitionKey] = field(default_factory=Counter)
    created: float = field(default_factory=time.time)


class SpoolIndex:
    def __init__(self) -> None:
        self._files: dict[str, _FileCounts] = {}
        self._backlog: Counter[PartitionKey] = Counter()

    def pending(self, key: PartitionKey) -> int:
        """Frames of ``key`` spooled and not yet committed."""
        return self._backlog.get(key, 0)

    def knows(self, name: str) -> bool:
        return name in self._files

    def files(self) -> list[str]:
        return sorted(self._files)

    @property
    def total(self) -> int:
        return sum(self._backlog.values())

    @property
    def file_count(self) -> int:
        return len(self._files)

    def oldest_age_s(self, now: float | None = None) -> float:
        if not self._files:
            return 0.0
        now = time.time() if now is None else now
        return max(0.0, now - min(f.created for f in self._files.values()))

    def track(self, name: str, created: float | None = None) -> None:
        """Start tracking a file (possibly still empty)."""
        if name not in self._files:
            self._files[name] = _FileCounts(created=time.time() if created is None else created)

    def add(self, name: str, key: PartitionKey, frames: int) -> None:
        self.track(name)
        self._files[name].per_partition[key] += frames
        self._backlog[key] += frames

    def settle(self, name: str, key: PartitionKey, frames: int) -> None:
        """``frames`` of ``key`` from file ``name`` are committed."""
        counts = self._files.get(name)
        if counts is None:
            return
        take = min(frames, counts.per_partition.get(key, 0))
        if take <= 0:
            return
        counts.per_partition[key] -= take
        if counts.per_partition[key] == 0:
            del counts.per_partition[key]
        self._subtract(key, take)

    def drop(self, name: str) -> None:
        """Forget a file and everything it still counted."""
        counts = self._files.pop(name, None)
        if counts is None:
            return
        for key, frames in counts.per_partition.items():
            self._subtract(key, frames)

    def _subtract(self, key: PartitionKey, frames: int) -> None:
        left = self._backlog.get(key, 0) - frames
        if left > 0:
            self._backlog[key] = left
        else:
            self._backlog.pop(key, None)

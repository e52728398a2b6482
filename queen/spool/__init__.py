"""The spool: pushes that cannot reach PostgreSQL are kept on disk and replayed later.

- :mod:`queen.spool.format`: the record format (self-delimiting, checksummed);
- :mod:`queen.spool.files`: directory layout, locks, progress marks;
- :mod:`queen.spool.index`: which partitions still have spooled frames;
- :mod:`queen.spool.scan`: keeps the index true to the directory (every process's files);
- :mod:`queen.spool.writer`: appends with grouped fsync;
- :mod:`queen.spool.router`: database, spool or hold, per push;
- :mod:`queen.spool.plan`: what a replay pass may store, and in which order;
- :mod:`queen.spool.replay`: the replay loop the supervisor runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from queen.spool import files
from queen.spool.index import SpoolIndex
from queen.spool.replay import Replayer
from queen.spool.router import SpoolRouter
from queen.spool.writer import SpoolError, SpoolWriter

__all__ = [
    "Replayer",
    "Spool",
    "SpoolError",
    "SpoolIndex",
    "SpoolRouter",
    "SpoolState",
    "SpoolWriter",
    "spool_state",
]


@dataclass(slots=True)
class Spool:
    """The spool of one broker: index, writer, replay loop."""

    index: SpoolIndex
    writer: SpoolWriter
    replayer: Replayer | None = None

    def state(self) -> SpoolState:
        return spool_state(self.index, self.writer, self.replayer)


@dataclass(frozen=True, slots=True)
class SpoolState:
    """How the spool stands now (``/health``, the maintenance routes, ``/metrics``)."""

    directory: Path
    pending_items: int  # spooled items not yet replayed, every process's files
    files: int
    pending_bytes: int  # size of the files that still hold items to replay
    oldest_age_s: float
    replay_rate: float  # items per second of the last replay pass
    healthy: bool  # the last append could be written and synced, and the directory is there
    quarantined_ranges: int  # damaged byte ranges set aside
    quarantined_bytes: int
    problem: str | None = None  # why it is not healthy


def spool_state(index: SpoolIndex, writer: SpoolWriter, replayer: Replayer | None) -> SpoolState:
    """The spool's state for /health and the maintenance routes."""
    ranges, size = _quarantined(writer.directory)
    return SpoolState(
        directory=writer.directory,
        pending_items=index.total,
        files=index.file_count,
        pending_bytes=_bytes(writer.directory, index.files()),
        oldest_age_s=round(index.oldest_age_s(), 3),
        replay_rate=round(replayer.last_rate, 1) if replayer else 0.0,
        healthy=writer.healthy,
        quarantined_ranges=ranges,
        quarantined_bytes=size,
        problem=writer.problem,
    )


def _bytes(directory: Path, names: list[str]) -> int:
    total = 0
    for name in names:
        try:
            total += (directory / name).stat().st_size
        except OSError:  # replayed and removed meanwhile
            pass
    return total


_last_quarantined: dict[Path, tuple[int, int]] = {}


def _quarantined(directory: Path) -> tuple[int, int]:
    """The quarantine's counts; when the folder cannot be read now (no descriptor to spare,
    say), the last counts read, so /health still answers."""
    try:
        counts = files.quarantined(directory)
    except OSError:
        return _last_quarantined.get(directory, (0, 0))
    _last_quarantined[directory] = counts
    return counts

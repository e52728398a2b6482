"""What one replay pass may store, and in which order (see :mod:`queen.spool.replay`).

:class:`Planner` reads the directory (run it in a worker thread): the sealed files of every
process, then every file it did not read, for barriers. :func:`replay_order` is the pure
merge: records by order stamp, each partition cut at its barrier.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from queen.model import PartitionKey
from queen.spool import files
from queen.spool.format import Skipped, SpoolRecord, read_records

# A file's records were stamped after the time its name carries; a second of margin covers a
# name minted a little ahead of the clock.
NAME_CLOCK_MARGIN_NS = 1_000_000_000


@dataclass(slots=True)
class Item:
    """One record (or one unreadable range, ``record is None``) of a file, from its mark on."""

    offset: int
    end: int
    record: SpoolRecord | None
    done: bool


@dataclass(slots=True)
class FileRead:
    name: str
    size: int
    items: list[Item]
    kept: bool = True  # False while an unreadable range could not be put in quarantine


@dataclass(slots=True)
class Unreadable:
    """An unreadable range met while reading: where it was put, or why it could not be."""

    name: str
    skipped: Skipped
    kept_as: Path | None
    error: str = ""


@dataclass(slots=True)
class Plan:
    files: dict[str, FileRead]
    entries: list[tuple[FileRead, Item]]  # replayable records, in replay order
    held_back: int  # frames read but not replayable in this pass (barriers)
    unreadable: list[Unreadable] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)  # leftovers removed
    unsaved: set[str] = field(default_factory=set)  # files whose mark could not be saved


def replay_order(
    read: dict[str, FileRead], barriers: dict[PartitionKey, int], barrier_all: int | None
) -> tuple[list[tuple[FileRead, Item]], int]:
    """The records of ``read`` not done yet that may be replayed, in replay order (stamp,
    then file, then offset), and how many frames wait: a record waits if it is stamped at or
    after its partition's barrier or ``barrier_all``. Per partition, what may be replayed is a
    prefix of its records in stamp order."""
    entries: list[tuple[FileRead, Item]] = []
    held_back = 0
    for file in read.values():
        for item in file.items:
            record = item.record
            if record is None or item.done:
                continue
            limit = barriers.get(record.key)
            if (limit is not None and record.stamp >= limit) or (
                barrier_all is not None and record.stamp >= barrier_all
            ):
                held_back += len(record)
            else:
                entries.append((file, item))
    entries.sort(key=_order)
    return entries, held_back


def _order(entry: tuple[FileRead, Item]) -> tuple[int, str, int]:
    file, item = entry
    assert item.record is not None
    return item.record.stamp, file.name, item.offset


class Planner:
    def __init__(self, directory: Path, *, read_budget_bytes: int) -> None:
        self._dir = directory
        self._read_budget = read_budget_bytes

    def plan(self) -> Plan:
        """Read the directory and plan a pass (blocking: run in a worker thread)."""
        swept = files.sweep(self._dir)
        read: dict[str, FileRead] = {}
        unreadable: list[Unreadable] = []
        budget_left = self._read_budget
        barrier_all: int | None = None
        # Step 1: sealed files, oldest first, within the budget.
        for name in files.list_spool_files(self._dir):
            if budget_left <= 0:
                barrier_all = files.created_ns(name) - NAME_CLOCK_MARGIN_NS
                break
            with files.readable_file(self._dir / name) as fd:
                if fd is None:
                    continue  # still being written: step 2 reads it
                data = files.read_all(fd)
            progress = files.read_progress(self._dir, name)
            read[name] = self._read_file(name, data, progress, unreadable)
            budget_left -= len(data) - progress.offset
        # Step 2, after step 1: every other file, for barriers.
        barriers: dict[PartitionKey, int] = {}
        for name in files.list_spool_files(self._dir):
            if name in read:
                continue
            if barrier_all is not None and (
                files.created_ns(name) - NAME_CLOCK_MARGIN_NS >= barrier_all
            ):
                continue  # all its records are stamped after barrier_all anyway
            for key, stamp in first_stamps(self._dir, name).items():
                barriers[key] = min(stamp, barriers.get(key, stamp))
        entries, held_back = replay_order(read, barriers, barrier_all)
        return Plan(read, entries, held_back, unreadable, swept)

    def _read_file(
        self, name: str, data: bytes, progress: files.Progress, unreadable: list[Unreadable]
    ) -> FileRead:
        file = FileRead(name, len(data), [])
        for item in read_records(data, progress.offset):
            if not isinstance(item, Skipped):
                offset, end, record = item
                file.items.append(Item(offset, end, record, offset in progress.done))
                continue
            stop = item.offset + item.length
            try:
                kept_as = files.quarantine(
                    self._dir, name, item.offset, data[item.offset : stop], item.reason
                )
            except OSError as exc:
                unreadable.append(Unreadable(name, item, None, str(exc.strerror or exc)))
                file.items.append(Item(item.offset, stop, None, False))
                file.kept = False
                continue
            unreadable.append(Unreadable(name, item, kept_as))
            file.items.append(Item(item.offset, stop, None, True))
        return file


def first_stamps(directory: Path, name: str) -> dict[PartitionKey, int]:
    """The smallest order stamp of every partition in spool file ``name`` not committed yet
    (read without a lock: its writer may still be appending; a partial record at the end is
    ignored)."""
    try:
        fd = os.open(directory / name, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    try:
        data = files.read_all(fd)
    finally:
        os.close(fd)
    progress = files.read_progress(directory, name)
    stamps: dict[PartitionKey, int] = {}
    for item in read_records(data, progress.offset):
        if isinstance(item, Skipped):
            continue
        offset, _, record = item
        if offset not in progress.done:
            stamps[record.key] = min(record.stamp, stamps.get(record.key, record.stamp))
    return stamps

"""Keeps a :class:`SpoolIndex` true to the spool directory, for every process sharing it.

The hold rule ("partition P still has spooled frames: store nothing of P before them") must
see what *any* process spooled, including records in files their writers still hold open:
a producer may push to process A right after process B answered ``buffered``. So before
every decision to write to the database, the router calls :meth:`SpoolScanner.sync`, which
brings the index up to date with the directory at that moment:

- files that appeared are counted (from their progress mark), files that disappeared are
  dropped;
- files of other processes that are still being written are followed as they grow: the new
  complete records are counted (a record is complete once its writer fsynced it; a partial
  record at the tail is read again next time).

This process's own files are counted by its writer as it appends, never here.

Cost when nothing changed: one ``stat`` of the directory, plus one per file another process
is still writing. A decision needs a sync begun after its push arrived (:attr:`synced_at`):
the pushes of one request, written by several partitions' actors in one pass of the scheduler,
share one. A new or removed file changes the directory's modification time. Because
the kernel stamps it with a coarse clock, a time that is less than ``_SETTLE_NS`` old is not
trusted (the directory is listed again at every call until it is); an older one is: any later
change stamps a strictly newer time. This relies on the host's clock not stepping back.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from queen.model import PartitionKey
from queen.spool import files
from queen.spool.format import Skipped, read_records
from queen.spool.index import SpoolIndex

_SETTLE_NS = 200_000_000


@dataclass(slots=True)
class _Followed:
    """A file of another process counted up to ``offset`` (the end of its last complete
    record); ``sealed`` once its writer let it go (it cannot grow any more)."""

    offset: int
    size: int
    sealed: bool


class SpoolScanner:
    def __init__(self, directory: Path, index: SpoolIndex, own: set[str]) -> None:
        """``own``: the names of the files this process's writer created (it adds a name
        before the file exists); names of files that are gone are removed from it here."""
        self._dir = directory
        self._dir_name = os.fspath(directory)  # what sync stats before every write (a str)
        self._index = index
        self._own = own
        self._followed: dict[str, _Followed] = {}
        self._growing: set[str] = set()  # followed files not known to be sealed
        self._mtime: int | None = None
        self._trusted = False
        self.synced_at = float("-inf")  # when the last sync that ended began (time.monotonic)

    def sync(self, *, check_seals: bool = False) -> bool:
        """Bring the index up to date; True if a file was dropped (a backlog may have gone).

        ``check_seals`` also asks whether files still followed were let go by their writer.
        """
        dropped = False
        began = time.monotonic()
        try:
            mtime: int | None = os.stat(self._dir_name).st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):  # no directory: no files
            mtime = None
        if not check_seals and not self._growing and self._trusted and mtime == self._mtime:
            self.synced_at = began
            return False  # the common case: nothing changed
        if check_seals or not (self._trusted and mtime == self._mtime):
            self._trusted = mtime is not None and time.time_ns() - mtime > _SETTLE_NS
            self._mtime = mtime
            dropped = self._relist()
        for name in list(self._growing):
            followed = self._followed.get(name)
            if followed is None or followed.sealed:
                self._growing.discard(name)
            else:
                self._follow(name, followed, check_seal=check_seals)
        self.synced_at = began
        return dropped

    def forget(self, name: str) -> None:
        """``name`` was replayed and removed by this process."""
        self._index.drop(name)
        self._followed.pop(name, None)
        self._own.discard(name)

    def _relist(self) -> bool:
        present = set(files.list_spool_files(self._dir))
        own = self._own
        dropped = False
        for name in self._index.files():
            if name not in present:  # replayed and removed, by this process or another
                self._index.drop(name)
                self._followed.pop(name, None)
                own.discard(name)
                dropped = True
        for name in present:
            if name not in own and not self._index.knows(name):
                self._start(name)
        return dropped

    def _start(self, name: str) -> None:
        progress = files.read_progress(self._dir, name)
        self._index.track(name, created=files.created_at(name))
        followed = _Followed(offset=progress.offset, size=-1, sealed=False)
        self._followed[name] = followed
        self._growing.add(name)
        self._follow(name, followed, check_seal=True, done=progress.done)

    def _follow(
        self,
        name: str,
        followed: _Followed,
        *,
        check_seal: bool,
        done: frozenset[int] = frozenset(),
    ) -> None:
        path = self._dir / name
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return  # gone: the next listing drops it
        if size == followed.size and not check_seal:
            return
        cut_back = followed.size >= 0 and size < max(followed.size, followed.offset)
        if cut_back:  # its writer cut a failed write back: count the file again
            self._index.drop(name)
            self._followed.pop(name, None)
            self._start(name)
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            sealed = files.try_lock(fd, shared=True)
            os.lseek(fd, followed.offset, os.SEEK_SET)
            data = files.read_all(fd)
        finally:
            os.close(fd)
        counts: Counter[PartitionKey] = Counter()
        end = followed.offset
        for item in read_records(data):
            if isinstance(item, Skipped):
                if item.offset == 0 and item.reason == "bad magic" and followed.size >= 0:
                    # No record starts where the last one ended: the file was cut back and
                    # written again between two looks. Count it again.
                    self._index.drop(name)
                    self._followed.pop(name, None)
                    self._start(name)
                    return
                if not sealed:
                    break  # a record still being written: read it again next time
                end = followed.offset + item.offset + item.length
                continue
            offset, stop, record = item
            if followed.offset + offset not in done:
                counts[record.key] += len(record)
            end = followed.offset + stop
        for key, frames in counts.items():
            self._index.add(name, key, frames)
        followed.offset = end
        followed.size = size
        followed.sealed = sealed
        if sealed:
            self._growing.discard(name)

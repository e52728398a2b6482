"""The spool writer: appends records to this process's active spool file, with grouped fsync.

It owns the active file (descriptor, size, lock) and nothing else touches it. Appends arrive
on a bounded channel; the writer takes everything waiting (up to ``group_max_records``),
writes it, and makes it durable with one ``fsync`` in a worker thread, then answers every
append of the group. While one group is being synced, the next one gathers, so a flood of
pushes during an outage costs one fsync per group, not one per item.

Only after the fsync returns is an append answered; an append that is answered without error
is on disk. The fsync is a seam: :attr:`SpoolWriter.fsync` (``os.fsync`` unless the constructor
is given another) is the one call that makes a group durable, so a test can watch it run, see
what the file holds at that moment, and hold it to prove that no append is answered before it
returns. If a write or fsync fails (disk full, permissions, I/O error), the file is cut
back to where the group started, every append of the group fails with :class:`SpoolError`,
and the file is closed (after a failed fsync its pages cannot be trusted); the next append
opens a new file. While the last write failed, the writer proves every ``probe_s`` that the
directory takes data again (a probe file written, fsynced and removed), so ``healthy`` comes
back when the disk does, without waiting for the next push.

The directory may be removed under the writer (an operator, a cleaner of temporary files). A
new file is created only in a directory that is there: one that is gone is made again (and its
parents), with the mode it had at start, each new directory's entry fsynced in its parent
before a file is created in it. An append is answered only once its file is still in the
directory after the fsync; a file removed meanwhile is let go and the group written again to a
new file (the records answered earlier from it went with it: that is logged). While idle the
writer looks for the directory every ``probe_s`` and makes it again at once; if it cannot
(a regular file where a parent should be, no permission), ``healthy`` turns false and
``problem`` says why, until it can.

Every record gets its **order stamp** as it is written: Unix nanoseconds, strictly increasing
within the process. A record answered before another record is created, in any process of
the host, was stamped before it: the replay merges files by stamp (see
:mod:`queen.spool.replay`).

A new file is created as ``.new``, locked, then renamed to ``.log``: a ``.log`` file is
either locked by its writer or sealed for good. A replaying process sweeps away ``.new`` files
nobody holds (their writer died); one caught in the instant before its lock is noticed by its
writer, which starts again with a new name.

The active file is sealed (closed, so a replayer can take it) when it reaches
``file_max_bytes``, when it has been open ``file_max_age_s`` with records in it, or on request
(:meth:`SpoolWriter.seal`). The writer runs until cancelled; on the way out it closes its file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from queen.errors import QueenError
from queen.metrics import Metrics
from queen.primitives import Reply
from queen.spool import files
from queen.spool.format import SpoolRecord, encode
from queen.spool.index import SpoolIndex

log = logging.getLogger("queen.spool")

_OPEN_ATTEMPTS = 8  # new names tried when the one being created is swept away


class SpoolError(QueenError):
    """Records could not be made durable; nothing of them is on disk."""


@dataclass(slots=True, eq=False)
class _Append:
    records: list[SpoolRecord]
    reply: Reply[None] = field(default_factory=Reply)


@dataclass(slots=True, eq=False)
class _Seal:
    reply: Reply[None] = field(default_factory=Reply)


@dataclass(slots=True)
class _ActiveFile:
    name: str
    fd: int
    opened: float
    size: int = 0
    records: int = 0


class SpoolWriter:
    def __init__(
        self,
        directory: Path,
        index: SpoolIndex,
        metrics: Metrics,
        *,
        group_max_records: int,
        file_max_bytes: int,
        file_max_age_s: float,
        queue_size: int = 4096,
        probe_s: float = 1.0,
        fsync: Callable[[int], None] = os.fsync,
    ) -> None:
        self.directory = directory
        self._index = index
        self._metrics = metrics
        self._group_max = group_max_records
        self._file_max_bytes = file_max_bytes
        self._file_max_age_s = file_max_age_s
        self._send, self._recv = trio.open_memory_channel[_Append | _Seal](queue_size)
        self._active: _ActiveFile | None = None
        self._probe_s = probe_s
        self._last_stamp = 0
        self.own_names: set[str] = set()  # files this writer created (its index counts them)
        # Makes the active file's data durable (called in a worker thread, after the group was
        # written and before any of its appends is answered).
        self.fsync = fsync
        self.healthy = True  # False while the last write failed, or the directory cannot be made
        self.problem: str | None = None  # why it is not healthy
        self._mode = 0o755  # the directory's mode at start: what it gets if made again

    @property
    def active_name(self) -> str | None:
        return self._active.name if self._active else None

    def prepare(self) -> None:
        """Create the spool directory and check it takes files; raise :class:`SpoolError`
        naming the setting if it does not."""
        try:
            files.ensure_writable(self.directory)
            self._mode = stat.S_IMODE(os.stat(self.directory).st_mode)
        except OSError as exc:
            raise SpoolError(
                f"FILE_BUFFER_DIR={str(self.directory)!r} cannot be used: {exc.strerror or exc}"
            ) from exc

    async def append(self, records: list[SpoolRecord]) -> None:
        """Make ``records`` durable in the spool; raises :class:`SpoolError` if they are not."""
        request = _Append(records)
        await self._send.send(request)
        await request.reply.wait()

    async def seal(self) -> None:
        """Close the active file (after everything queued before this call is written)."""
        request = _Seal()
        await self._send.send(request)
        await request.reply.wait()

    async def run(
        self, *, task_status: trio.TaskStatus[SpoolWriter] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.prepare()
        task_status.started(self)
        try:
            while True:
                first = await self._next()
                if first is None:
                    continue
                group: list[_Append | _Seal] = [first]
                records = len(first.records) if isinstance(first, _Append) else 0
                while records < self._group_max:
                    try:
                        more = self._recv.receive_nowait()
                    except trio.WouldBlock:
                        break
                    group.append(more)
                    if isinstance(more, _Append):
                        records += len(more.records)
                await self._handle(group)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close)

    async def _next(self) -> _Append | _Seal | None:
        """The next request; None when the active file's age limit passed (then seal it), when
        a probe of an unhealthy spool was due (then probe), or when a look at the directory
        was due (then make it again if it is gone)."""
        if not self.healthy:
            with trio.move_on_after(self._probe_s):
                return await self._recv.receive()
            await self._probe()
            return None
        active = self._active
        remaining: float | None = None
        if active is not None and active.records > 0:
            remaining = max(0.0, active.opened + self._file_max_age_s - time.monotonic())
        sealing = remaining is not None and remaining <= self._probe_s
        with trio.move_on_after(remaining if remaining is not None and sealing else self._probe_s):
            return await self._recv.receive()
        if sealing:
            await trio.to_thread.run_sync(self._close)
            return None
        try:  # one stat per probe_s while idle
            await trio.to_thread.run_sync(self._ensure_directory)
        except OSError as exc:
            self._unhealthy(exc.strerror or str(exc))
        return None

    async def _handle(self, group: list[_Append | _Seal]) -> None:
        # Appends before a seal go to the old file, appends after it to a new one.
        chunk: list[_Append] = []
        for request in group:
            if isinstance(request, _Append):
                chunk.append(request)
                continue
            await self._write_chunk(chunk)
            chunk = []
            await trio.to_thread.run_sync(self._close)
            request.reply.set(None)
        await self._write_chunk(chunk)

    async def _probe(self) -> None:
        """While unhealthy: mark the spool healthy again once its directory is there (made
        again if it is gone) and takes data."""
        try:
            await trio.to_thread.run_sync(self._ensure_directory)
        except OSError as exc:
            self._unhealthy(exc.strerror or str(exc))
            return
        try:
            await trio.to_thread.run_sync(files.probe_writable, self.directory)
        except OSError as exc:
            log.debug("spool directory %s still not writable: %s", self.directory, exc)
            return
        self.healthy = True
        self.problem = None
        log.info("spool directory %s takes writes again", self.directory)

    def _unhealthy(self, problem: str) -> None:
        if problem != self.problem:
            log.error("%s", problem)
        self.healthy = False
        self.problem = problem

    async def _write_chunk(self, chunk: list[_Append]) -> None:
        if not chunk:
            return
        try:
            name = await trio.to_thread.run_sync(
                self._write_durably, [request.records for request in chunk]
            )
        except OSError as exc:
            self.healthy = False
            self.problem = f"spool write failed: {exc.strerror or exc}"
            self._metrics.spool_write_failures += 1
            log.error("spool write failed in %s: %s", self.directory, exc.strerror or exc)
            error = SpoolError(self.problem)
            for request in chunk:
                request.reply.fail(error)
            return
        self.healthy = True
        self.problem = None
        self._metrics.spool_fsyncs += 1
        for request in chunk:
            for record in request.records:
                self._index.add(name, record.key, len(record))
                self._metrics.spool_appended_items += len(record)
            request.reply.set(None)

    # --- file operations: run in a worker thread, one at a time ----------------------------

    def _ensure_directory(self) -> None:
        """Make the spool directory again if it is gone (raises OSError naming it if it
        cannot be made)."""
        if os.path.isdir(self.directory):
            return
        try:
            made = files.make_directory(self.directory, self._mode)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"spool directory {self.directory} is missing and cannot be made: "
                f"{exc.strerror or exc}",
            ) from exc
        if made:
            log.warning("spool directory %s was missing: made it again", self.directory)

    def _open(self) -> _ActiveFile:
        # Between creating the ``.new`` file and locking it, the file is unlocked: a replaying
        # process's sweep may take it for one whose writer died and remove it. Locked, it is
        # safe from the sweep; so once locked, make sure the name is still ours, else begin
        # again with a new name (nothing was written to the one swept away).
        self._ensure_directory()
        for _ in range(_OPEN_ATTEMPTS):
            name = files.new_name()
            self.own_names.add(name)  # before the file exists: a scan that sees it knows it
            creating = self.directory / files.creating_name(name)
            path = self.directory / name
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
            fd = os.open(creating, flags, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not files.names_descriptor(creating, fd):
                    os.close(fd)
                    self.own_names.discard(name)
                    log.info("spool file %s was swept while being created; creating another", name)
                    continue
                os.rename(creating, path)
                files.fsync_directory(self.directory)
            except OSError:
                os.close(fd)
                creating.unlink(missing_ok=True)
                path.unlink(missing_ok=True)
                self.own_names.discard(name)
                raise
            return _ActiveFile(name=name, fd=fd, opened=time.monotonic())
        raise OSError(errno.EAGAIN, "every new spool file was swept away while being created")

    def _stamp(self) -> int:
        stamp = max(time.time_ns(), self._last_stamp + 1)
        self._last_stamp = stamp
        return stamp

    def _write_durably(self, groups: list[list[SpoolRecord]]) -> str:
        encoded: list[bytes] = []
        for records in groups:
            for record in records:
                record.stamp = self._stamp()
                encoded.append(encode(record))
        data = b"".join(encoded)
        for _ in range(_OPEN_ATTEMPTS):
            if self._active is None:
                self._active = self._open()
            active = self._active
            start = active.size
            try:
                view = memoryview(data)
                while view:
                    written = os.write(active.fd, view)
                    if written == 0:
                        raise OSError(errno.ENOSPC, "no space left on device")
                    view = view[written:]
                self.fsync(active.fd)
                kept = files.names_descriptor(self.directory / active.name, active.fd)
            except OSError:
                self._abandon(start)
                raise
            if kept:
                break
            self._let_go_removed()
        else:
            raise OSError(errno.ENOENT, "every spool file was removed as it was written")
        active.size += len(data)
        active.records += len(encoded)
        name = active.name
        if active.size >= self._file_max_bytes:
            self._close()
        return name

    def _let_go_removed(self) -> None:
        """The active file is no longer in the directory (removed with it, most likely): what
        it holds is out of the replay's reach. Close it and forget it; the caller writes its
        group again to a new file."""
        active, self._active = self._active, None
        if active is None:
            return
        os.close(active.fd)
        self._index.drop(active.name)
        self.own_names.discard(active.name)
        if active.records:
            log.error(
                "spool file %s was removed from %s while this process wrote it: the records "
                "answered buffered from it before (%d) went with it; writing to a new file",
                active.name,
                self.directory,
                active.records,
            )
        else:
            log.warning(
                "spool file %s was removed from %s as it was written; writing to a new file",
                active.name,
                self.directory,
            )

    def _abandon(self, good_size: int) -> None:
        """After a failed write: cut the file back to its last durable size and close it."""
        active = self._active
        if active is None:
            return
        try:
            os.ftruncate(active.fd, good_size)
            self.fsync(active.fd)
        except OSError as exc:
            log.error(
                "could not cut spool file %s back after a failed write: %s",
                active.name,
                exc.strerror or exc,
            )
        self._close()

    def _close(self) -> None:
        active, self._active = self._active, None
        if active is None:
            return
        os.close(active.fd)  # releases the lock: the file is now replayable
        if active.size == 0:  # never counted in the index: nothing was durable in it
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                (self.directory / active.name).unlink()
            self.own_names.discard(active.name)

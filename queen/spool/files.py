"""Spool directory conventions and the small file operations the writer and replayer share.

- ``spool-<uuid7>.log``: a spool file. The UUIDv7 makes names sort by creation time, so
  "oldest first" is name order, across processes too.
- ``spool-<uuid7>.done``: replay progress of that file: the byte offset up to which every
  record is committed, then the offsets of records past it that are committed too (the replay
  merges files, so a file's records may commit out of file order). Losing it only means
  replaying committed records again, which deduplication turns into ``duplicate``.
- ``spool-<uuid7>.new``: a spool file being created; it is renamed to ``.log`` once its writer
  holds its lock, so no reader ever sees a ``.log`` file that is about to grow unlocked.
- ``replay.lock``: held (``flock``) by the one process replaying the directory; the holder
  checks that the name still leads to the file it locked (:meth:`ReplayLock.held`).
- ``quarantine/``: ranges of spool files that held no readable record, moved out before their
  file is removed: ``spool-<uuid7>.<start>-<end>.bin`` holds the bytes, the ``.txt`` beside it
  says where they came from and why they could not be read.

A file being written is held with an exclusive ``flock`` by its writer. The replayer takes a
shared lock without waiting, so it replays only sealed files; files still growing are read
without a lock, only to learn which partitions they hold.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from queen.ids import mint_id, timestamp_of

PREFIX = "spool-"
SUFFIX = ".log"
PROGRESS_SUFFIX = ".done"
CREATING_SUFFIX = ".new"
REPLAY_LOCK = "replay.lock"
QUARANTINE = "quarantine"


@dataclass(frozen=True, slots=True)
class Progress:
    """How much of a spool file is committed: everything before ``offset``, and the records
    starting at the offsets in ``done``."""

    offset: int = 0
    done: frozenset[int] = frozenset()


def new_name() -> str:
    return f"{PREFIX}{mint_id()}{SUFFIX}"


def creating_name(name: str) -> str:
    return name[: -len(SUFFIX)] + CREATING_SUFFIX


def is_spool_file(name: str) -> bool:
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


def created_at(name: str) -> float:
    """Creation time carried by the file name (Unix seconds)."""
    try:
        return timestamp_of(name[len(PREFIX) : -len(SUFFIX)]).timestamp()
    except ValueError:
        return 0.0


def created_ns(name: str) -> int:
    """Creation time carried by the file name (Unix ns, millisecond precision)."""
    return int(created_at(name) * 1000) * 1_000_000


def list_spool_files(directory: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if is_spool_file(n))
    except (FileNotFoundError, NotADirectoryError):
        return []


Signature = tuple[tuple[str, int, int, bool], ...]


def signature(directory: Path) -> Signature:
    """Name, size, modification time and (for spool files) whether it is sealed, of every
    spool file and progress mark: equal signatures mean nothing in the spool changed."""
    found: list[tuple[str, int, int, bool]] = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return ()
    for entry in entries:
        if is_spool_file(entry.name) or entry.name.endswith(PROGRESS_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat()
                sealed = False
                if is_spool_file(entry.name):
                    with readable_file(Path(entry.path)) as fd:
                        sealed = fd is not None
                found.append((entry.name, st.st_size, st.st_mtime_ns, sealed))
    return tuple(sorted(found))


def ensure_writable(directory: Path) -> None:
    """Create ``directory`` if needed and prove a file can be created in it (raises OSError)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".queen-write-test-{os.getpid()}"  # processes may check at once
    probe.write_bytes(b"")
    probe.unlink()


def make_directory(directory: Path, mode: int) -> bool:
    """Create ``directory`` (a symbolic link's target, if it is one) and every missing parent,
    each made durable: the parent of each directory created is fsynced, so a file whose own
    entry is then fsynced in ``directory`` survives a crash. ``directory`` gets ``mode``
    whatever the umask (its parents mkdir's default). True if this call created it; raises
    OSError if it cannot be made."""
    target = Path(os.path.realpath(directory))
    missing: list[Path] = []
    path = target
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    made = False
    for path in reversed(missing):
        try:
            os.mkdir(path, mode if path == target else 0o777)
        except FileExistsError:  # another process sharing the spool made it meanwhile
            continue
        if path == target:
            os.chmod(path, mode)
            made = True
        fsync_directory(path.parent)
    if not os.path.isdir(target):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target))
    return made


def probe_writable(directory: Path) -> None:
    """Prove the directory takes data now: write, fsync and remove a small file (raises
    OSError if it does not)."""
    probe = directory / f".queen-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def names_descriptor(path: Path, fd: int) -> bool:
    """Whether ``path`` is (still) the file open as ``fd``."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def try_lock(fd: int, *, shared: bool = False) -> bool:
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def readable_file(path: Path) -> Iterator[int | None]:
    """Open a sealed spool file for reading; yield the descriptor, or None when the file is
    still being written (its writer holds the exclusive lock) or is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        yield fd if try_lock(fd, shared=True) else None
    finally:
        os.close(fd)


def read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


@dataclass(frozen=True, slots=True)
class ReplayLock:
    """The directory's replay lock as this process holds it: ``fd``, the ``replay.lock`` it
    opened and locked."""

    path: Path
    fd: int

    def held(self) -> bool:
        """Whether ``replay.lock`` in the directory is still the file locked. The lock guards
        a file, not a name: once the directory is removed and made again (or the lock file
        removed), the name leads to a new file, which another process can lock while this
        one still holds the old one."""
        return names_descriptor(self.path, self.fd)


_LOCK_ATTEMPTS = 3


@contextlib.contextmanager
def replay_lock(directory: Path) -> Iterator[ReplayLock | None]:
    """Hold the directory's replay lock if nobody else does; yield it, or None if another
    process holds it. A lock taken on a file the name no longer leads to (replaced between
    its opening and its locking) is let go and taken again on the present one; None when
    that keeps happening."""
    path = directory / REPLAY_LOCK
    for _ in range(_LOCK_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if not try_lock(fd):
                break
            lock = ReplayLock(path, fd)
            if lock.held():
                yield lock
                return
        finally:
            os.close(fd)
    yield None


def progress_path(directory: Path, name: str) -> Path:
    return directory / (name[: -len(SUFFIX)] + PROGRESS_SUFFIX)


def read_progress(directory: Path, name: str) -> Progress:
    try:
        lines = progress_path(directory, name).read_text().split()
        return Progress(int(lines[0]), frozenset(int(x) for x in lines[1:]))
    except (FileNotFoundError, ValueError, IndexError):
        return Progress()


def write_progress(directory: Path, name: str, progress: Progress) -> None:
    """Replace the progress mark of ``name``; on failure no ``.tmp`` file is left behind."""
    path = progress_path(directory, name)
    tmp = path.with_suffix(".tmp")
    text = "\n".join([str(progress.offset), *map(str, sorted(progress.done))])
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def quarantine(directory: Path, name: str, start: int, data: bytes, reason: str) -> Path:
    """Keep ``data`` (the unreadable range ``start``.. of spool file ``name``) in the
    quarantine folder, with a note; writing the same range again changes nothing."""
    folder = directory / QUARANTINE
    folder.mkdir(exist_ok=True)
    stem = f"{name[: -len(SUFFIX)]}.{start}-{start + len(data)}"
    kept = folder / f"{stem}.bin"
    note = folder / f"{stem}.txt"
    for path, content in (
        (kept, data),
        (note, f"{name} bytes {start}..{start + len(data)}: {reason}\n".encode()),
    ):
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(content)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
    return kept


def quarantined(directory: Path) -> tuple[int, int]:
    """How many ranges the quarantine folder holds, and their bytes."""
    count = size = 0
    try:
        entries = list(os.scandir(directory / QUARANTINE))
    except (FileNotFoundError, NotADirectoryError):
        return 0, 0
    for entry in entries:
        if entry.name.endswith(".bin"):
            with contextlib.suppress(OSError):
                size += entry.stat().st_size
                count += 1
    return count, size


def sweep(directory: Path) -> list[str]:
    """Remove what an interrupted operation left: ``.tmp`` files (only the replaying process
    writes them, and it calls this holding the replay lock) and ``.new`` files no writer holds
    (a process died between creating and renaming one; nothing was written to it). Returns
    the names removed."""
    removed: list[str] = []
    for folder in (directory, directory / QUARANTINE):
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            path = folder / name
            if name.endswith(CREATING_SUFFIX) and folder == directory:
                with readable_file(path) as fd:
                    if fd is None:
                        continue  # its writer holds it: about to be renamed
            elif not name.endswith(".tmp"):
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(name)
    return removed


def remove(directory: Path, name: str) -> None:
    for path in (directory / name, progress_path(directory, name)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

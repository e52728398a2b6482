"""The original C++ Queen server as a peer of the benchmark: where its build is, how it starts
on a database of the run's PostgreSQL, and the fresh database every peer step gets.

The original is built from source by ``../shared/peer/build-original.sh`` (its header says how);
``QUEEN_PEER_SERVER`` names the binary, by default ``../peer-build/server/bin/queen-server``
beside the repository. It runs from its ``server`` folder (it installs its schema from
``../lib/schema`` itself) and reaches PostgreSQL over TCP with a user and a password.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from bench.servers import ROOT, Database, Server, free_port

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


def start_original(
    db: Database, *, workdir: Path, name: str, settings: dict[str, str] | None = None
) -> Server:
    """The original on a free port of 127.0.0.1, on ``db`` (a TCP conninfo)."""
    parts = conninfo_to_dict(db.conninfo)
    host = str(parts.get("host") or "")
    if not host or host.startswith("/"):
        raise RuntimeError(f"the original reaches PostgreSQL over TCP only, not {db.description}")
    port = free_port()
    spool = workdir / f"peer-spool-{name}"
    spool.mkdir(parents=True, exist_ok=True)
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TZ") if k in os.environ}
    env.update(
        {
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "PG_HOST": host,
            "PG_PORT": str(parts.get("port") or 5432),
            "PG_USER": str(parts.get("user") or "postgres"),
            # trust authentication ignores it; the original insists on one
            "PG_PASSWORD": str(parts.get("password") or "postgres"),
            "PG_DB": str(parts.get("dbname") or "postgres"),
            "FILE_BUFFER_DIR": str(spool),
            **SETTINGS,
            **(settings or {}),
        }
    )
    log_path = workdir / f"peer-{name}.log"
    path = binary()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [str(path)],
            env=env,
            cwd=path.parent.parent,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    return Server(f"original ({name})", [proc], port, 1, log_path)


def with_dbname(conninfo: str, dbname: str) -> str:
    """``conninfo`` (a URL) naming database ``dbname`` instead."""
    url = urlsplit(conninfo)
    return urlunsplit(url._replace(path="/" + dbname))


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
            with_dbname(server.conninfo, dbname),
            f"{server.description}, database {dbname}",
            server.embedded,
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

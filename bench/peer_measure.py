"""CPU over one measured window of a peer step, for either server: the broker's process tree,
the PostgreSQL server's process tree, the backends of the step's own database, the clients
(this process and the children it reaped meanwhile: wrk, the pipeline's Node processes), and
what the rest of the machine used.

The backends of one database come and go with its sessions: a thread lists them in
``pg_stat_activity`` every half second and keeps each one's first and last CPU reading. A
backend there when the window opens counts from that reading, one born later from zero; one
that ends inside the window counts up to its last reading (at most half a second short).
"""

from __future__ import annotations

import resource
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench import procfs
from bench.servers import Database, Server

SAMPLE_S = 0.5


def _own_and_reaped_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class Backends:
    """CPU seconds of the backends of database ``dbname`` since :meth:`start`."""

    def __init__(self, server: Database, dbname: str) -> None:
        self.server = server
        self.dbname = dbname
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self, conn: Any, *, opening: bool = False) -> None:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.dbname,)
        ).fetchall()
        for (pid,) in rows:
            stat = procfs.read_stat(int(pid))
            if stat is None:
                continue
            self.first.setdefault(stat.pid, stat.cpu_s if opening else 0.0)
            self.last[stat.pid] = stat.cpu_s

    def _loop(self) -> None:
        with self.server.connect() as conn:
            self._sample(conn, opening=True)
            self._opened.set()
            while not self._stop.wait(SAMPLE_S):
                self._sample(conn)
            self._sample(conn)

    def start(self) -> None:
        self._thread.start()
        self._opened.wait(10)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


@dataclass(slots=True)
class Meter:
    """Readings of one window; :meth:`stop` returns its figures."""

    server: Server
    db: Database
    dbname: str
    backends: Backends | None = None
    t0: float = 0.0
    server0: float = 0.0
    pg0: float | None = None
    client0: float = 0.0
    busy0: float = 0.0

    def start(self) -> None:
        if self.db.postmaster_pid is not None:
            self.backends = Backends(self.db, self.dbname)
            self.backends.start()
        self.server0, self.pg0 = self.server.cpu_s(), self.db.cpu_s()
        self.client0, self.busy0 = _own_and_reaped_s(), procfs.machine_busy_s()
        self.t0 = time.monotonic()

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        server = self.server.cpu_s() - self.server0
        pg1 = self.db.cpu_s()
        client = _own_and_reaped_s() - self.client0
        busy = procfs.machine_busy_s() - self.busy0
        backends = self.backends.stop() if self.backends is not None else None
        pg = None if pg1 is None or self.pg0 is None else pg1 - self.pg0
        return {
            "wall_s": wall,
            "server_cpu_s": server,
            "server_cores": server / wall if wall > 0 else 0.0,
            "db_cpu_s": pg,
            "db_backends_cpu_s": backends,
            "client_cpu_s": client,
            "other_cores": max(0.0, busy - server - (pg or 0.0) - client) / wall if wall else 0.0,
        }


def per_100k(record: dict[str, Any], messages: float) -> None:
    """Add the CPU figures of ``record`` per 100k ``messages``."""
    for key in ("server_cpu_s", "db_cpu_s", "db_backends_cpu_s", "client_cpu_s"):
        value = record.get(key)
        record[key.replace("_cpu_s", "_cpu_s_per_100k")] = (
            None if value is None or messages <= 0 else value / messages * 100_000
        )

"""One measured wrk run against a server: throughput, latency, CPU of everything involved,
memory, and (for the broker) the /metrics counters of every worker.

Readings are taken just before and just after the wrk run: the server's process tree CPU,
the database's process tree CPU, the machine's busy time; RSS is sampled during the window.
Whatever the machine did beyond server, database, wrk and the harness is "other" load, so a
run on a busy machine shows it.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import counters, procfs
from bench.scenarios import Load
from bench.servers import Database, Server
from bench.wrk import WrkReport, run_wrk

MB = 1024 * 1024


class _Peak:
    """Samples ``read()`` every ``interval_s`` in a thread; keeps the largest value."""

    def __init__(self, read: Callable[[], int], interval_s: float = 0.5) -> None:
        self.read = read
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self.read())

    def __enter__(self) -> _Peak:
        self.peak = self.read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.read())


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(slots=True)
class Window:
    """One measured wrk run against ``server``."""

    wrk: WrkReport
    wall_s: float
    server_cpu_s: float
    db_cpu_s: float | None
    other_cpu_s: float
    rss_max_bytes: int
    rss_peak_bytes: int
    counters: dict[str, float] | None = None
    actors_active: float | None = None  # partition actors alive at the end (all workers)


def measure(
    server: Server,
    db: Database,
    wrk: str,
    load: Load,
    *,
    seconds: float,
    queue: str,
    tag: str,
    threads: int,
    broker_processes: int = 0,
) -> Window:
    before = counters.fetch_metrics(server.base_url, broker_processes) if broker_processes else {}
    busy0, self0 = procfs.machine_busy_s(), _self_cpu_s()
    server0, db0, t0 = server.cpu_s(), db.cpu_s(), time.monotonic()
    with _Peak(server.rss_bytes) as rss:
        report, _raw = run_wrk(
            wrk, server.base_url, load, seconds=seconds, queue=queue, tag=tag, threads=threads
        )
    server1, db1, t1 = server.cpu_s(), db.cpu_s(), time.monotonic()
    busy1, self1 = procfs.machine_busy_s(), _self_cpu_s()
    after = counters.fetch_metrics(server.base_url, broker_processes) if broker_processes else {}
    db_cpu = None if db0 is None or db1 is None else db1 - db0
    ours = (server1 - server0) + (db_cpu or 0.0) + report.cpu_s + (self1 - self0)
    return Window(
        wrk=report,
        wall_s=t1 - t0,
        server_cpu_s=server1 - server0,
        db_cpu_s=db_cpu,
        other_cpu_s=max(0.0, (busy1 - busy0) - ours),
        rss_max_bytes=rss.peak,
        rss_peak_bytes=server.rss_bytes(peak=True),
        counters=counters.delta(before, after) if broker_processes else None,
        actors_active=(
            sum(v.get("queen_actors_active", 0.0) for v in after.values())
            if broker_processes
            else None
        ),
    )


def per_100k(cpu_s: float | None, messages: float) -> float | None:
    return None if cpu_s is None or messages <= 0 else cpu_s / messages * 100_000


def _latency(report: WrkReport) -> dict[str, float]:
    out = {f"p{k}": v for k, v in report.percentiles_ms.items()}
    out["avg"] = report.latency_avg_ms
    out["max"] = report.latency_max_ms
    return out


def window_record(win: Window, load: Load) -> dict[str, Any]:
    report = win.wrk
    messages = report.ok_requests * load.items
    return {
        "items_per_request": load.items,
        "connections": load.connections,
        "partitions": load.partitions,
        "duplicates": load.duplicates,
        "seconds": report.duration_s,
        "requests": report.requests,
        "errors": {"non_2xx": report.non_2xx, **report.socket_errors},
        "requests_per_s": report.requests_per_s,
        "msg_per_s": messages / report.duration_s if report.duration_s else 0.0,
        "latency_ms": _latency(report),
        "server_cpu_s": win.server_cpu_s,
        "server_cores": win.server_cpu_s / win.wall_s,
        "server_cpu_s_per_100k": per_100k(win.server_cpu_s, messages),
        "db_cpu_s": win.db_cpu_s,
        "db_cpu_s_per_100k": per_100k(win.db_cpu_s, messages),
        "wrk_cpu_s": report.cpu_s,
        "other_cores": win.other_cpu_s / win.wall_s,
        "rss_mb": win.rss_max_bytes / MB,
        "rss_peak_mb": win.rss_peak_bytes / MB,
    }

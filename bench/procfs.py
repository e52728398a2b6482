"""CPU time and memory of process trees, machine-wide CPU, listening sockets: from /proc; and
:class:`Meter`, the CPU of everything involved in one measured window.

CPU time of a tree counts every CPU second once: a live process counts its own time plus that
of the children it has reaped (``cutime``/``cstime``), and a child that exits moves its time
into its parent's reaped total: two readings differ by the tree's CPU time in between, even
when processes come and go.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """CPU seconds used so far by the trees under ``roots`` (see the module docstring)."""
    stats = all_stats() if stats is None else stats
    return sum(stats[pid].cpu_s for pid in descendants(roots, stats))


def _rss_kib(pid: int) -> int:
    try:
        lines = (_PROC / str(pid) / "status").read_text().splitlines()
        return next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), 0)
    except (OSError, ValueError, IndexError):
        return 0


def tree_rss_bytes(roots: Iterable[int]) -> int:
    """Resident memory of the trees under ``roots`` (shared pages once per process)."""
    return 1024 * sum(map(_rss_kib, descendants(roots, all_stats())))


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
    """CPU seconds between :meth:`start` and :meth:`stop`: of the server's process trees
    (``pids``; none: this process, an embedding program), of the database server's tree
    (``db_pid``; None: not on this machine), of the clients (this process and the children it
    reaped meanwhile: wrk, the pipeline's Node processes), and what the rest of the machine
    used ("other", ~0 on a quiet machine)."""

    def __init__(self, db_pid: int | None = None, pids: Sequence[int] = ()) -> None:
        self.db_pid = db_pid
        self.pids = list(pids)
        self._start = self._read()

    def _read(self) -> tuple[float, float, float | None, float, float]:
        server = tree_cpu_s(self.pids) if self.pids else own_cpu_s()
        db = None if self.db_pid is None else tree_cpu_s([self.db_pid])
        return time.monotonic(), server, db, own_cpu_s(children=True), machine_busy_s()

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, Any]:
        (t0, server0, db0, client0, busy0), (t1, server1, db1, client1, busy1) = (
            self._start,
            self._read(),
        )
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

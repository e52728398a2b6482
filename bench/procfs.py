"""CPU time and memory of process trees, machine-wide CPU, listening sockets: from /proc.

CPU time of a tree is counted so that every CPU second is seen once: a live process counts its
own time plus that of the children it has already reaped (``cutime``/``cstime``), and a child
that exits moves its time into its parent's reaped total. The difference of two readings is
therefore the tree's CPU time in between, even when processes come and go.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

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
    stats: dict[int, ProcStat] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None:
                stats[stat.pid] = stat
    return stats


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


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in (_PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_rss_bytes(roots: Iterable[int], *, peak: bool = False) -> int:
    """Resident memory of the trees under ``roots`` (``peak``: each process's high-water
    mark). Shared pages are counted once per process."""
    key = "VmHWM" if peak else "VmRSS"
    return 1024 * sum(_status_kib(pid, key) for pid in descendants(roots, all_stats()))


def machine_busy_s(text: str | None = None) -> float:
    """CPU seconds all cores have spent busy since boot (from ``/proc/stat``)."""
    if text is None:
        text = (_PROC / "stat").read_text()
    fields = text.splitlines()[0].split()[1:]
    values = [int(v) for v in fields]
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    busy = sum(values[i] for i in (0, 1, 2, 5, 6, 7) if i < len(values))
    return busy / _TICKS


def listening_sockets(port: int) -> int:
    """How many TCP sockets listen on ``port`` (SO_REUSEPORT lets several processes)."""
    count = 0
    for name in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
                count += 1
    return count

"""wrk, the load generator: find or install it, run it with ``push.lua``, read its report."""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.scenarios import Load

LUA_SCRIPT = Path(__file__).resolve().parent / "push.lua"
PUSH_PATH = "/api/v1/push"


class WrkError(RuntimeError):
    """wrk is missing and cannot be installed, or a run failed."""


@dataclass(slots=True)
class WrkReport:
    """What one wrk run reported. Latencies in milliseconds."""

    requests: int
    duration_s: float
    latency_avg_ms: float
    latency_max_ms: float
    percentiles_ms: dict[str, float] = field(default_factory=dict)  # "50", "75", "90", "99"
    non_2xx: int = 0
    socket_errors: dict[str, int] = field(default_factory=dict)  # connect/read/write/timeout
    cpu_s: float = 0.0  # wrk's own CPU time (the load generator's share of the machine)

    @property
    def ok_requests(self) -> int:
        return self.requests - self.non_2xx

    @property
    def requests_per_s(self) -> float:
        return self.ok_requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def errors(self) -> int:
        return self.non_2xx + sum(self.socket_errors.values())

    def figures(self, items: int) -> dict[str, Any]:
        """msg/s (2xx answers x ``items`` per request ÷ the window), requests/s, latency."""
        latency = {f"p{k}": v for k, v in self.percentiles_ms.items()}
        return {
            "seconds": self.duration_s,
            "requests": self.requests,
            "requests_per_s": self.requests_per_s,
            "msg_per_s": self.ok_requests * items / self.duration_s if self.duration_s else 0.0,
            "latency_ms": {**latency, "avg": self.latency_avg_ms, "max": self.latency_max_ms},
        }


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
_TIME = r"([0-9.]+)(us|ms|s|m|h)"
_SOCKET_KINDS = ("connect", "read", "write", "timeout")
_SOCKET_ERRORS = r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"


def _ms(number: str, unit: str) -> float:
    return float(number) * _UNIT_MS[unit]


def parse_report(text: str) -> WrkReport:
    """wrk's text report (run with ``--latency``); :class:`WrkError` if it has no result."""
    done = re.search(r"^\s*(\d+) requests in " + _TIME, text, re.M)
    if done is None:
        raise WrkError(f"wrk printed no result:\n{text.strip()}")
    requests, duration_s = int(done.group(1)), _ms(done.group(2), done.group(3)) / 1000
    stats = re.search(r"^\s*Latency\s+" + _TIME + r"\s+" + _TIME + r"\s+" + _TIME, text, re.M)
    avg_ms = _ms(stats.group(1), stats.group(2)) if stats else 0.0
    max_ms = _ms(stats.group(5), stats.group(6)) if stats else 0.0
    percentiles = {
        m.group(1): _ms(m.group(2), m.group(3))
        for m in re.finditer(r"^\s+(\d+(?:\.\d+)?)%\s+" + _TIME + r"\s*$", text, re.M)
    }
    report = WrkReport(requests, duration_s, avg_ms, max_ms, percentiles)
    if non_2xx := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text):
        report.non_2xx = int(non_2xx.group(1))
    if sock := re.search(_SOCKET_ERRORS, text):
        report.socket_errors = dict(zip(_SOCKET_KINDS, map(int, sock.groups()), strict=True))
    return report


def ensure_wrk() -> str:
    """Return the path of wrk, installing the Debian package first if it is missing."""
    if found := shutil.which("wrk"):
        return found
    if shutil.which("apt-get") is None:
        raise WrkError("wrk is not installed and apt-get is not available: install wrk first")
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if prefix and shutil.which("sudo") is None:
        raise WrkError("wrk is not installed: run 'apt-get install -y wrk' as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("wrk is not installed: running apt-get install -y wrk", flush=True)

    def apt(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*prefix, "apt-get", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=False)

    result = apt("install", "-y", "-q", "wrk")
    if result.returncode != 0:  # the package lists may be missing or stale
        apt("update", "-q")
        result = apt("install", "-y", "-q", "wrk")
    if result.returncode == 0 and (found := shutil.which("wrk")):
        return found
    detail = " / ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
    raise WrkError(
        f"wrk is not installed and 'apt-get install -y wrk' failed: {detail}. "
        "Install wrk (Debian/Ubuntu package 'wrk') and run again."
    )


def wrk_version(wrk: str) -> str:
    out = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    first = (out.stdout or out.stderr).strip().splitlines()
    return first[0].split(" Copyright")[0].strip() if first else "unknown"


def run_wrk(
    wrk: str,
    base_url: str,
    load: Load,
    seconds: float,
    queue: str,
    tag: str,
    threads: int = 1,
    start: int = 0,
) -> WrkReport:
    """wrk's report of ``seconds`` of ``load``. ``tag``, new for every run, begins every
    transactionId sent; ``start`` skips that many requests' worth of items."""
    env = {**os.environ, "ITEMS": str(load.items), "PARTITIONS": str(load.partitions)}
    env.update(QUEUE=queue, TAG=tag, DUP="1" if load.duplicates else "0", START=str(start))
    argv = [wrk, f"-t{threads}", f"-c{load.connections}", f"-d{max(1, round(seconds))}s"]
    argv += ["--timeout", "30s", "--latency", "-s", str(LUA_SCRIPT), base_url + PUSH_PATH]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise WrkError(f"wrk failed ({result.returncode}): {result.stderr.strip()}")
    report = parse_report(result.stdout)
    report.cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return report

"""A description of the machine a run happened on, for the results."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

_PACKAGES = ("queen-trio", "trio", "hypercorn", "quart", "quart-trio", "psycopg", "orjson")


def _first(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip() if ":" in line else line.split("=", 1)[1]
    except OSError:
        pass
    return None


def _package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def describe() -> dict[str, Any]:
    memory_kib = _first("/proc/meminfo", "MemTotal")
    os_name = _first("/etc/os-release", "PRETTY_NAME=")
    return {
        "cpu": _first("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory_kib.split()[0]) / 1024 / 1024, 1) if memory_kib else None,
        "os": os_name.strip('"') if os_name else platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {name: _package(name) for name in _PACKAGES},
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }

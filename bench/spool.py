"""Spool throughput: pushes answered `buffered` (maintenance mode on), with and without grouped
fsync, then how fast the replay stores them once maintenance mode is switched off.

    python -m bench.spool --items 1 --connections 32 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def request(base: str, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{base}{path}", data=data, headers={"content-type": "application/json"}
    )
    return json.loads(urllib.request.urlopen(req, timeout=30).read())


def wait_until(predicate, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("timed out")


def run(group_max: int, args: argparse.Namespace) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="queen-spool-bench-"))
    env = {
        **os.environ,
        "QUEEN_PORT": str(args.port),
        "QUEEN_HOST": "127.0.0.1",
        "QUEEN_PG_DATA_DIR": str(work / "pg"),
        "FILE_BUFFER_DIR": str(work / "spool"),
        "QUEEN_LOG_LEVEL": "warning",
        "QUEEN_SPOOL_GROUP_MAX_RECORDS": str(group_max),
    }
    broker = subprocess.Popen([sys.executable, "-m", "queen.cli", "serve"], env=env)
    base = f"http://127.0.0.1:{args.port}"
    try:
        wait_until(lambda: request(base, "/health")["status"] == "healthy", 60)
        request(base, "/api/v1/system/maintenance", {"enabled": True})
        wrk_env = {
            **os.environ,
            "ITEMS": str(args.items),
            "PARTITIONS": str(args.partitions),
            "TAG": str(time.time_ns()),
        }
        out = subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{args.connections}",
                f"-d{args.seconds}s",
                "--latency",
                "-s",
                str(HERE / "push.lua"),
                f"{base}/api/v1/push",
            ],
            env=wrk_env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
        p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
        state = request(base, "/api/v1/system/maintenance")
        spooled = int(state["bufferedMessages"])  # type: ignore[call-overload]
        started = time.monotonic()
        request(base, "/api/v1/system/maintenance", {"enabled": False})
        wait_until(
            lambda: request(base, "/health")["spool"]["pendingItems"] == 0,  # type: ignore[index]
            600,
        )
        replay_s = time.monotonic() - started
    finally:
        broker.terminate()
        broker.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "group_max": group_max,
        "spool_msg_s": rps * args.items,
        "p99": p99.group(1) if p99 else "?",
        "spooled": spooled,  # type: ignore[dict-item]
        "replay_msg_s": spooled / replay_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--port", type=int, default=6692)
    args = ap.parse_args()
    for group_max in (4096, 1):
        r = run(group_max, args)
        label = "grouped fsync" if group_max > 1 else "fsync per write"
        print(
            f"{label:16s} spooling {r['spool_msg_s']:>9,.0f} msg/s  p99 {r['p99']:>8s}  "
            f"replay of {r['spooled']:,} items {r['replay_msg_s']:>9,.0f} msg/s"
        )


if __name__ == "__main__":
    main()

"""A first push measurement: start the broker, drive it with wrk, print what it did.

    python -m bench.quick --items 1 --connections 32 --partitions 10 --seconds 20

The full benchmark harness (ceilings, scenarios, JSON results) lives beside this file.
"""

from __future__ import annotations

import argparse
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


def metrics(base: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split()
            out[name] = float(value)
    return out


def wait_healthy(base: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("broker did not become healthy")


def parse_latency(text: str, pct: str) -> str:
    m = re.search(rf"^\s+{pct}%\s+(\S+)", text, re.M)
    return m.group(1) if m else "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=6690)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    work = Path(tempfile.mkdtemp(prefix="queen-bench-"))
    env = {
        **os.environ,
        "QUEEN_PORT": str(args.port),
        "QUEEN_HOST": "127.0.0.1",
        "QUEEN_PG_DATA_DIR": str(work / "pg"),
        "FILE_BUFFER_DIR": str(work / "spool"),
        "QUEEN_LOG_LEVEL": "warning",
    }
    broker = subprocess.Popen([sys.executable, "-m", "queen.cli", "serve"], env=env)
    base = f"http://127.0.0.1:{args.port}"
    try:
        wait_healthy(base)
        wrk_env = {**os.environ, "ITEMS": str(args.items), "PARTITIONS": str(args.partitions)}
        tag = f"{time.time_ns()}"
        wrk = ["wrk", "-t1", f"-c{args.connections}", "-s", str(HERE / "push.lua"), "--latency"]
        subprocess.run(
            [*wrk, f"-d{args.warmup}s", f"{base}/api/v1/push"],
            env={**wrk_env, "TAG": tag + "w"},
            capture_output=True,
            check=True,
        )
        before = metrics(base)
        cpu_before = _cpu(broker.pid)
        run = subprocess.run(
            [*wrk, f"-d{args.seconds}s", f"{base}/api/v1/push"],
            env={**wrk_env, "TAG": tag + "m"},
            capture_output=True,
            text=True,
            check=True,
        )
        cpu = _cpu(broker.pid) - cpu_before
        after = metrics(base)
    finally:
        broker.terminate()
        broker.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", run.stdout).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", run.stdout)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    tx = d["queen_push_transactions_total"] or 1
    print(
        f"items/request={args.items} connections={args.connections} "
        f"partitions={args.partitions} duration={args.seconds}s"
    )
    print(f"  requests/s      {rps:,.0f}")
    print(f"  messages/s      {rps * args.items:,.0f}")
    print(f"  latency p50     {parse_latency(run.stdout, '50')}")
    print(f"  latency p99     {parse_latency(run.stdout, '99')}")
    print(f"  requests/tx     {d['queen_push_requests_committed_total'] / tx:.1f}")
    print(f"  partitions/tx   {d['queen_push_segments_total'] / tx:.1f}")
    print(f"  broker CPU s    {cpu:.1f} ({cpu / args.seconds:.0%} of one core)")
    print(f"  non-2xx         {non2xx.group(1) if non2xx else 0}")


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()

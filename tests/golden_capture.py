"""Capture the original broker's answers to its dashboard's read routes for the fixed data set
of :mod:`tests.golden`: ``python -m tests.golden_capture [--out DIR] [--workdir DIR]``.

1. An embedded PostgreSQL on a TCP port (``--pg-bin`` names other server binaries, e.g.
   ``/usr/lib/postgresql/15/bin``) and a fresh database for the original.
2. The original server on it (``bench/peer_run.py`` says where its build is looked for;
   ``QUEEN_PEER_SERVER`` names the binary).
3. :func:`tests.golden.sequence` against it, over HTTP; its statistics refreshed twice (the
   first pass creates a partition's rows, the second counts from the cursors), then a wait
   until the minute the sequence ended in is over and written to its per-minute tables.
4. Each route of :data:`tests.golden.ROUTES`, as the app calls it (the ones that change the
   data last); its JSON body goes to ``DIR/<route>.json`` (default ``tests/golden/original``)
   and its HTTP status to ``DIR/routes.json``, with the path asked and the original's commit.

``--routes NAME ...`` captures only those routes and keeps every other file as it is (their
entries in ``routes.json`` too): a route added to :data:`tests.golden.ROUTES` is captured
without changing the answers already there.

Exits 2 when the original is not built here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.peer_run import fresh_database, missing, start_original
from bench.servers import ROOT, open_database
from tests.golden import ROUTES, resolve, sequence

OUT = ROOT / "tests" / "golden" / "original"


def call(base: str, method: str, path: str, body: Any = None, accept: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read()
        return json.loads(text) if text else None


def fill(base: str) -> dict[str, str]:
    steps = sequence()
    answer: Any = None
    try:
        while True:
            method, path, body = steps.send(answer)
            answer = call(base, method, path, body)
    except StopIteration as done:
        return dict(done.value)


def fetch(base: str, path: str, accept: str, method: str = "GET") -> tuple[int, Any]:
    req = urllib.request.Request(base + path, headers={"Accept": accept}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read()
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text.decode(errors="replace")


def settle(base: str, deadline_s: float = 180.0) -> None:
    """Statistics refreshed, and the minute the sequence ended in over and written: its
    workers' and its system's per-minute rows (polled, within ``deadline_s``)."""
    for _ in range(2):
        call(base, "POST", "/api/v1/stats/refresh")
    time.sleep(60 - time.time() % 60 + 15)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        system = call(base, "GET", "/api/v1/analytics/system-metrics")
        worker = call(base, "GET", "/api/v1/analytics/worker-metrics")
        if system.get("replicas") and worker.get("timeSeries"):
            break
        time.sleep(2)
    else:
        raise RuntimeError("the original wrote no per-minute metrics in time")
    call(base, "POST", "/api/v1/stats/refresh")


def original_commit(source: Path | None) -> str:
    """The commit checked out (HEAD) in ``source``, the original's git repository the binary
    was built from; "unknown" without one."""
    if source is None:
        return "unknown"
    done = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--pg-bin", type=Path, default=None)
    parser.add_argument("--source", type=Path, default=None, help="the original's git repository")
    parser.add_argument("--routes", nargs="+", default=None, help="capture only these routes")
    args = parser.parse_args()
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    names = {route.name for route in ROUTES}
    unknown = sorted(set(args.routes or ()) - names)
    if unknown:
        print(f"no such route: {', '.join(unknown)}", file=sys.stderr)
        return 2
    wanted = [r for r in ROUTES if args.routes is None or r.name in args.routes]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="queen-golden-"))
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        open_database(None, workdir, tcp=True, bin_dir=args.pg_bin) as server,
        fresh_database(server, "queen_golden") as orig,
    ):
        print(f"database: {server.version}")
        peer = start_original(orig, workdir=workdir, name="golden")
        try:
            peer.wait_ready()
            ids = fill(peer.base_url)
            settle(peer.base_url)
            now = datetime.now(UTC)
            index: dict[str, Any] = {}
            for route in wanted:
                path = resolve(route, ids, now)
                status, body = fetch(peer.base_url, path, route.accept, route.method)
                (args.out / f"{route.name}.json").write_text(
                    json.dumps(body, indent=1, sort_keys=False) + "\n"
                )
                index[route.name] = {"path": route.path, "status": status}
                if route.method != "GET":
                    index[route.name]["method"] = route.method
                print(f"{status} {route.method:6} {route.name:34} {path[:80]}")
        finally:
            peer.stop()
    captured = now.isoformat(timespec="seconds")
    meta = {
        "original": {"commit": original_commit(args.source)},
        "database": server.version,
        "capturedAt": captured,
        "routes": index,
    }
    if args.routes is not None:
        meta = _merged(args.out / "routes.json", meta)
    (args.out / "routes.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


def _merged(at: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The index at ``at`` with the routes of ``meta`` captured again or added, each of them
    with its own time, commit and database; the others' entries as they were, in
    :data:`tests.golden.ROUTES` order."""
    old: dict[str, Any] = json.loads(at.read_text()) if at.exists() else {"routes": {}}
    routes = dict(old["routes"])
    for name, entry in meta["routes"].items():
        routes[name] = {
            **entry,
            "capturedAt": meta["capturedAt"],
            "original": meta["original"],
            "database": meta["database"],
        }
    order = [r.name for r in ROUTES]
    ranked = sorted(routes.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 999)
    return {**{k: v for k, v in old.items() if k != "routes"}, "routes": dict(ranked)}


if __name__ == "__main__":
    raise SystemExit(main())

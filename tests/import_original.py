"""Import a database the original Queen server wrote, for real, and check it with the official
client: ``python -m tests.import_original [--workdir DIR]``.

1. An embedded PostgreSQL on a TCP port; a fresh database for the original, another for us.
2. The original server (bench/peer_run.py) on its database; the official Python client
   (tests/import_client.py ``fill``) creates 3 queues with 20 partitions, pushes 20,100
   messages and consumes part of them: queue mode and two groups ack some, queue mode leaves
   a batch leased, a group dead-letters three messages, a group subscribed ``new`` sees only
   later pushes. The original is stopped.
3. ``queen import --from <its database>`` into ours (timed), and a second run (nothing more).
4. ``queen serve`` on ours; the client (``drain``) pops everything each group has left.
5. Checked: for every group and partition, what it gets now is exactly what the original
   had not yet completed for it (leased messages included, dead letters excluded), in push
   order, nothing lost or doubled; the dead letters are in the DLQ.

Prints one line per figure and exits 1 if a check fails (2 when the original is not built).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.peer_run import fresh_database, missing, start_original
from bench.servers import ROOT, open_database, start_broker

CLIENT_PYTHON = Path(os.environ.get("QUEEN_CLIENT_PYTHON") or ROOT / ".venv-client/bin/python")
if not CLIENT_PYTHON.exists():
    CLIENT_PYTHON = ROOT.parent / "main" / ".venv-client" / "bin" / "python"


def client(mode: str, url: str, state: Path) -> float:
    started = time.monotonic()
    subprocess.run(
        [
            str(CLIENT_PYTHON),
            "-I",
            str(Path(__file__).with_name("import_client.py")),
            mode,
            url,
            str(state),
        ],
        check=True,
    )
    return time.monotonic() - started


def queen_import(source: str, target: str, *args: str) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG_", "QUEEN_"))}
    env["DATABASE_URL"] = target
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "queen.cli", "import", "--from", source, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"queen import failed ({done.returncode}): {done.stderr}")
    return time.monotonic() - started, done.stdout


def check(state: dict[str, Any]) -> list[str]:
    """What is wrong, if anything."""
    problems = []
    dead = {(d.split("#")[0], int(d.split("#")[1])) for ds in state["dead"].values() for d in ds}
    for group, parts in {**state["completed"], **state["after"]}.items():
        del parts
        for part, pushed in state["pushed"].items():
            q = part.split("/")[0]
            if not _consumes(group, q):
                continue
            before = set(state["completed"].get(group, {}).get(part, []))
            gone = {n for (p, n) in dead if p == part} if group == "analytics" else set()
            # 'late' subscribed (mode new) after the first PER_PARTITION of every partition
            start = 1000 if group == "late" else 0
            expected = [n for n in pushed if n >= start and n not in before and n not in gone]
            got = state["after"].get(group, {}).get(part, [])
            if got != expected:
                problems.append(
                    f"{group} on {part}: {len(got)} delivered after the import, "
                    f"{len(expected)} expected (first differences: "
                    f"{[x for x in got if x not in expected][:3]} / "
                    f"{[x for x in expected if x not in got][:3]})"
                )
    leased = state["leased"].get("__QUEUE_MODE__", {})
    for part, numbers in leased.items():
        got = state["after"].get("__QUEUE_MODE__", {}).get(part, [])
        if not set(numbers) <= set(got):
            problems.append(f"leased messages of {part} not delivered again")
    if sorted(d for ds in state["dead"].values() for d in ds) != state["dlq_after"]:
        problems.append(f"DLQ: {state['dlq_after']} != {state['dead']}")
    return problems


def _consumes(group: str, queue: str) -> bool:
    table = {
        "imp-orders": {"__QUEUE_MODE__", "billing"},
        "imp-events": {"__QUEUE_MODE__", "analytics"},
        "imp-audit": {"late"},
    }
    return group in table[queue]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    why = missing()
    if why:
        print(why, file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="queen-import-"))
    state_path = workdir / "state.json"
    state_path.unlink(missing_ok=True)
    with (
        open_database(None, workdir, tcp=True) as server,
        fresh_database(server, "queen_original") as orig,
        fresh_database(server, "queen_imported") as ours,
    ):
        print(f"database: {server.version}, {server.description}")
        peer = start_original(orig, workdir=workdir, name="import")
        try:
            peer.wait_ready()
            took = client("fill", peer.base_url, state_path)
        finally:
            peer.stop()
        state = json.loads(state_path.read_text())
        pushed = sum(len(v) for v in state["pushed"].values())
        completed = sum(len(v) for g in state["completed"].values() for v in g.values())
        print(
            f"original: {pushed} messages in {len(state['pushed'])} partitions pushed, "
            f"{completed} completed by queue mode and 3 groups, "
            f"{sum(len(v) for v in state['leased'].get('__QUEUE_MODE__', {}).values())} "
            f"leased, {sum(len(v) for v in state['dead'].values())} dead-lettered "
            f"({took:.1f} s)"
        )
        took, report = queen_import(orig.conninfo, ours.conninfo, "--dry-run")
        print(f"dry run: {took:.2f} s\n{report}", end="")
        took, report = queen_import(orig.conninfo, ours.conninfo)
        print(f"import: {took:.2f} s ({pushed / took:.0f} messages/s)\n{report}", end="")
        took, report = queen_import(orig.conninfo, ours.conninfo)
        print(f"second run: {took:.2f} s: {report.splitlines()[-2]}")
        broker = start_broker(ours, workers=1, workdir=workdir, name="imported")
        try:
            broker.wait_ready()
            took = client("drain", broker.base_url, state_path)
        finally:
            broker.stop()
        state = json.loads(state_path.read_text())
        after = sum(len(v) for g in state["after"].values() for v in g.values())
        print(f"after the import: {after} messages delivered to the groups ({took:.1f} s)")
        problems = check(state)
        for line in problems:
            print(f"FAIL {line}")
        if not problems:
            print("every group resumed where it was: nothing lost, nothing doubled, order kept")
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

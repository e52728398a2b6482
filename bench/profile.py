"""Where a push request's CPU goes (``python -m bench.profile``; docs/benchmark.md, "Profile").

Bare Hypercorn (the floor), our HTTP stack without a broker and ``queen serve`` take the same
wrk load in turn; py-spy samples each over the measured window. A sample counts for the
innermost frame of a listed component (Trio's and the standard library's frames count for the
component that called them), and a component's share of the samples times the server's CPU over
the window, divided by the messages pushed, is its µs per message. A process ready to run but
waiting for a core is sampled too, so with the cores oversubscribed the shares lean towards the
calls that woke another process; the totals come from /proc."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench import servers
from bench.report import table
from bench.scenarios import SCENARIOS, pick
from bench.servers import Meter
from bench.wrk import ensure_wrk, run_wrk

# (component, pattern of a frame's file): the first that matches names the frame's component.
COMPONENTS: list[tuple[str, str]] = [
    ("socket send/recv", r"trio/_socket\.py"),
    ("Hypercorn, h11", r"(^|/)(hypercorn|h11)/"),
    ("Quart, Werkzeug, Flask", r"(^|/)(quart|quart_trio|werkzeug|flask|blinker)/"),
    ("serving (queen/serving, queen/http/asgi.py)", r"queen/(serving/|http/asgi\.py)"),
    ("push route, body, answer", r"queen/http/|bench/(http_ceiling|hypercorn_floor)\.py"),
    ("intake, ids", r"queen/(intake|ids|names)\.py|(^|/)orjson"),
    ("push service", r"queen/push/"),
    ("partition actor, supervisor", r"queen/actors/(partition|supervisor|resolver|policy)"),
    ("batcher", r"queen/actors/batcher"),
    ("storage, psycopg", r"queen/storage/|(^|/)psycopg"),
    ("spool route", r"queen/spool/"),
    ("other queen code", r"queen/"),
]
RUN_LOOP = "Trio scheduler, standard library"
_FRAME = re.compile(r"\(([^:()]+):\d+\)")
_LOOP = re.compile(r"^(unrolled_run|run) \(trio/_core/_run\.py:")
_TRIO = re.compile(r"(^|/)trio/(?!_socket\.py)")
# A thread of Trio's thread cache waiting for a job (py-spy does not see that wait as idle).
_IDLE_WORKER = re.compile(r"(^|;)WorkerThread\._work \([^;]*$")
_MATCHERS = [(name, re.compile(pattern)) for name, pattern in COMPONENTS]
SERVERS = ("floor", "stack", "ours")


def component(stack: str) -> str:
    """The component a sample counts for: that of its innermost frame in one."""
    for frame in reversed(stack.split(";")):
        if _LOOP.search(frame):
            break  # the scheduler itself (its callers are the program's start)
        found = _FRAME.search(frame)
        if found is None or _TRIO.search(found[1]):
            continue  # the rest of Trio counts for its caller
        for name, pattern in _MATCHERS:
            if pattern.search(found[1]):
                return name
    return RUN_LOOP


def shares(raw: str) -> Counter[str]:
    """Samples per component from py-spy's ``--format raw`` (``frame;frame;... count`` lines)."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit() and not _IDLE_WORKER.search(stack):
            counts[component(stack)] += int(n)
    return counts


def sample(pid: int, args: argparse.Namespace, out: Path) -> None:
    """py-spy's samples of ``pid`` and its child processes for ``args.duration`` into ``out``."""
    spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid)]
    spy += ["--rate", str(args.rate), "--format", "raw", "--subprocesses"]
    spy += ["--duration", str(int(args.duration)), "-o", str(out)]
    subprocess.run(spy, check=True, capture_output=True)


def attach(args: argparse.Namespace, workdir: Path) -> None:
    """Sample a running server (``--attach PID``; with its children): each component's share of
    its samples, and the CPU it used meanwhile."""
    out = workdir / f"attached-{args.attach}.txt"
    meter = Meter(None, [args.attach])
    sample(args.attach, args, out)
    cpu, counts = meter.stop(), shares(out.read_text())
    total = sum(counts.values()) or 1
    rows = [[name, f"{100 * n / total:.1f}%"] for name, n in counts.most_common()]
    print(f"pid {args.attach}: {cpu['server_cpu_s']:.1f} s of CPU in {cpu['wall_s']:.1f} s")
    print(table(["component", "share of samples"], rows, markdown=args.markdown), flush=True)


@dataclass(frozen=True, slots=True)
class Figures:
    requests_per_s: float
    us: dict[str, float]  # per component, µs of process CPU per request
    cpu_us: float  # all of it
    other_cores: float  # the rest of the machine's load meanwhile


def measure(
    server: servers.Server, db_pid: int | None, shape: str, args: argparse.Namespace, workdir: Path
) -> Figures:
    load, wrk = SCENARIOS[shape].load, ensure_wrk()
    server.wait_ready()
    run_wrk(wrk, server.base_url, load, args.warmup, f"prof_{shape.lower()}", f"w{id(server)}")
    out = workdir / f"{server.name.split()[0]}-{shape}.txt"
    meter = Meter(db_pid, server.pids)
    sampler = threading.Thread(target=sample, args=(server.pids[0], args, out))
    sampler.start()
    report = run_wrk(
        wrk, server.base_url, load, args.duration, f"prof_{shape.lower()}", f"m{id(server)}"
    )
    cpu = meter.stop()
    sampler.join()
    counts = shares(out.read_text())
    total, requests = sum(counts.values()) or 1, max(1, report.requests)
    us = {name: cpu["server_cpu_s"] * 1e6 / requests * n / total for name, n in counts.items()}
    per_request = cpu["server_cpu_s"] * 1e6 / requests
    return Figures(report.requests / cpu["wall_s"], us, per_request, cpu["other_cores"])


def render(shape: str, figures: dict[str, Figures], items: int, markdown: bool) -> str:
    names = [n for n, _ in COMPONENTS] + [RUN_LOOP]
    rows = []
    for name in names:
        cells = [figures[s].us.get(name, 0.0) / items for s in SERVERS]
        if any(cells):
            rows.append([name, *(f"{c:.1f}" for c in cells), f"{cells[2] - cells[1]:+.1f}"])
    totals = [figures[s].cpu_us / items for s in SERVERS]
    rows.append(["**all**", *(f"{t:.1f}" for t in totals), f"{totals[2] - totals[1]:+.1f}"])
    rate = " / ".join(f"{figures[s].requests_per_s:,.0f}" for s in SERVERS)
    head = f"{shape}: µs of process CPU per message (requests/s floor / stack / ours: {rate})"
    headers = ["component", "bare Hypercorn", "our stack", "ours", "ours above stack"]
    return head + "\n\n" + table(headers, rows, markdown=markdown)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="S1,S2", help="push scenarios, comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="sampled seconds per server")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--workers", type=int, default=1, help="processes of each server")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--database-url", help="default: a new embedded PostgreSQL")
    p.add_argument("--pg-bin", type=Path, help="these PostgreSQL binaries, default settings")
    p.add_argument("--keep", type=Path, help="keep the samples and logs in this directory")
    p.add_argument("--attach", type=int, help="only sample this running server (and children)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="queen-bench-profile-") as tmp:
        workdir = args.keep or Path(tmp)
        if args.attach:
            attach(args, workdir)
            return 0
        with servers.open_database(args.database_url, workdir, bin_dir=args.pg_bin) as db:
            for shape in pick(args.shapes, list(SCENARIOS)):
                figures: dict[str, Figures] = {}
                for which in SERVERS:
                    if which == "ours":
                        server = servers.start_broker(
                            db, workers=args.workers, workdir=workdir, name=shape
                        )
                    else:
                        module = (
                            "bench.hypercorn_floor" if which == "floor" else "bench.http_ceiling"
                        )
                        server = servers.start_http_stack(
                            module, workers=args.workers, workdir=workdir, name=f"{which}-{shape}"
                        )
                    try:
                        figures[which] = measure(server, db.postmaster_pid, shape, args, workdir)
                    finally:
                        server.stop()
                print(
                    render(shape, figures, SCENARIOS[shape].load.items, args.markdown) + "\n",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

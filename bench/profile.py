"""Where a push request's CPU goes (``python -m bench.profile``; docs/benchmark.md, "Profile"):
bare Hypercorn, our stack without a broker and ``queen serve`` take the same wrk load in turn
while a sampler counts each one's stacks (by default every 2 ms of its CPU time:
``bench/cpu_sampler``; or py-spy's); a component's share of the samples times the server's CPU
(/proc), per message pushed, is its µs per message."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from bench import servers
from bench.report import table
from bench.runner import new_run_id
from bench.scenarios import SCENARIOS, pick
from bench.servers import Meter
from bench.wrk import ensure_wrk, run_wrk

# (component, pattern of a frame's file): the first that matches names the frame's component.
COMPONENTS = [
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
NAMES = [name for name, _ in COMPONENTS] + [RUN_LOOP]  # the order of a measurement's figures
_FRAME = re.compile(r"\(([^:()]+):\d+\)")
_LOOP = re.compile(r"^(unrolled_run|run) \(trio/_core/_run\.py:")
_TRIO = re.compile(r"(^|/)trio/(?!_socket\.py)")
# A thread of Trio's thread cache waiting for a job (py-spy does not see that wait as idle).
_IDLE_WORKER = re.compile(r"(^|;)WorkerThread\._work \([^;]*$")
_MATCHERS = [(name, re.compile(pattern)) for name, pattern in COMPONENTS]
SERVERS = {"floor": "bench.hypercorn_floor", "stack": "bench.http_ceiling", "ours": ""}
CPU_SAMPLER = Path(__file__).resolve().parent / "cpu_sampler"


def component(stack: str) -> str:
    """The component of the innermost frame that has one, below the scheduler; Trio's own
    frames count for their caller."""
    for frame in reversed(stack.split(";")):
        if _LOOP.search(frame):
            break  # the scheduler itself (its callers are the program's start)
        found = _FRAME.search(frame)
        if found is not None and not _TRIO.search(found[1]):
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


def sample(pid: int, args: argparse.Namespace, out: Path) -> Counter[str]:
    """py-spy's samples of ``pid`` and its child processes over ``args.duration``, counted."""
    spy = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--rate"]
    spy += [str(args.rate), "--format", "raw", "--subprocesses", "--duration"]
    subprocess.run([*spy, str(int(args.duration)), "-o", str(out)], check=True, capture_output=True)
    return shares(out.read_text())


def cpu_sampler_env(directory: Path) -> dict[str, str]:
    """The environment that gives a server's Python processes the CPU sampler, writing into
    ``directory``."""
    path = os.pathsep.join(filter(None, [str(CPU_SAMPLER), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "QUEEN_BENCH_CPU_SAMPLES": str(directory)}


@contextlib.contextmanager
def cpu_samples(directory: Path, timeout_s: float = 10.0) -> Iterator[Counter[str]]:
    """Sample every process of ``directory`` that has the sampler for the ``with`` block; the
    counts fill in as it ends."""
    pids = [int(ready.stem) for ready in directory.glob("*.ready")]
    if not pids:
        raise RuntimeError(f"no process has the CPU sampler ({directory})")
    counts: Counter[str] = Counter()
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    try:
        yield counts
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        out = directory / f"{pid}.txt"
        while not out.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"process {pid} wrote no samples into {directory}")
            time.sleep(0.05)
        counts.update(shares(out.read_text()))


def measure(which: str, db: servers.Database, shape: str, args: argparse.Namespace) -> list[float]:
    """One server's µs per message by component (in ``COMPONENTS`` order, the scheduler last),
    its whole µs per message and its requests per second."""
    name, load, wrk = f"{which}-{shape}", SCENARIOS[shape].load, ensure_wrk()
    samples = args.workdir / f"{name}-samples"
    env = cpu_sampler_env(samples) if args.sampler == "cpu" else {}
    where = {"workers": args.workers, "workdir": args.workdir, "name": name, "env": env}
    samples.mkdir(exist_ok=True)
    if which == "ours":
        server = servers.start_broker(db, **where)
    else:
        server = servers.start_http_stack(SERVERS[which], **where)
    try:
        server.wait_ready()
        queue, tag = f"prof_{shape.lower()}", f"{args.run_id}-{which}"  # a tag new to the queue
        run_wrk(wrk, server.base_url, load, args.warmup, queue, f"{tag}-w")
        meter = Meter(db.postmaster_pid, server.pids)
        if args.sampler == "cpu":
            with cpu_samples(samples) as counts:
                report = run_wrk(wrk, server.base_url, load, args.duration, queue, tag)
                cpu = meter.stop()
        else:
            counts = Counter[str]()
            sampler = threading.Thread(
                target=lambda: counts.update(sample(server.pids[0], args, samples / "py-spy.txt"))
            )
            sampler.start()
            report = run_wrk(wrk, server.base_url, load, args.duration, queue, tag)
            cpu = meter.stop()
            sampler.join()
    finally:
        server.stop()
    per_message = cpu["server_cpu_s"] * 1e6 / max(1, report.requests * load.items)
    total = sum(counts.values()) or 1
    parts = [per_message * counts[n] / total for n in NAMES]
    return [*parts, per_message, report.requests / cpu["wall_s"]]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="S1,S2", help="push scenarios, comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="sampled seconds per server")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--workers", type=int, default=1, help="processes of each server")
    p.add_argument(
        "--sampler",
        choices=["cpu", "py-spy"],
        default="cpu",
        help="cpu: every 2 ms of a process's CPU time, in the process; py-spy: --rate a second",
    )
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--database-url", help="default: a new embedded PostgreSQL")
    p.add_argument("--pg-bin", type=Path, help="these PostgreSQL binaries, default settings")
    p.add_argument("--keep", type=Path, help="keep the samples and logs in this directory")
    p.add_argument(
        "--attach", type=int, help="only sample this running server (and children), with py-spy"
    )
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="queen-bench-profile-") as tmp:
        args.workdir, args.run_id = args.keep or Path(tmp), new_run_id()
        if args.attach:  # each component's share of a running server's samples
            meter = Meter(None, [args.attach])
            counts = sample(args.attach, args, args.workdir / f"attached-{args.attach}.txt")
            cpu, total = meter.stop(), sum(counts.values()) or 1
            print(f"pid {args.attach}: {cpu['server_cpu_s']:.1f} s of CPU in {cpu['wall_s']:.1f} s")
            rows = [[name, f"{100 * n / total:.1f}%"] for name, n in counts.most_common()]
            print(table(["component", "share of samples"], rows, markdown=args.markdown))
            return 0
        with servers.open_database(args.database_url, args.workdir, bin_dir=args.pg_bin) as db:
            for shape in pick(args.shapes, list(SCENARIOS)):
                measured = [measure(which, db, shape, args) for which in SERVERS]
                floor, stack, ours = measured
                rows = [
                    [name, *(f"{c[i]:.1f}" for c in measured), f"{ours[i] - stack[i]:+.1f}"]
                    for i, name in enumerate([*NAMES, "**all**"])
                    if floor[i] or stack[i] or ours[i]
                ]
                rate = " / ".join(f"{c[-1]:,.0f}" for c in measured)
                print(f"{shape}: µs of server CPU per message (requests/s of each: {rate})\n")
                headers = ["component", "bare Hypercorn", "our stack", "ours", "ours above stack"]
                print(table(headers, rows, markdown=args.markdown) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

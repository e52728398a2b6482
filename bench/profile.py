"""Where a push request's CPU goes (``python -m bench.profile``; docs/benchmark.md, "Profile"):
bare Hypercorn, our stack without a broker and ``queen serve`` take the same wrk load in turn
while a sampler counts each one's stacks (by default every 2 ms of its CPU time:
``bench/cpu_sampler``; or py-spy's); a component's share of the samples times the server's CPU
(/proc), per message pushed, is its µs per message. ``--sampler calls`` counts Python calls per
message instead."""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import servers
from bench.inproc import CallEntry, calls_by_group
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


def sampler_env(directory: Path, mode: str = "cpu") -> dict[str, str]:
    """The environment that gives a server's Python processes the sampler (``mode`` cpu or
    calls), writing into ``directory``."""
    path = os.pathsep.join(filter(None, [str(CPU_SAMPLER), os.environ.get("PYTHONPATH")]))
    return {
        "PYTHONPATH": path,
        "QUEEN_BENCH_CPU_SAMPLES": str(directory),
        "QUEEN_BENCH_SAMPLE": mode,
    }


@contextlib.contextmanager
def signalled(directory: Path, suffix: str, timeout_s: float = 10.0) -> Iterator[list[Path]]:
    """Switch on the sampler of every process of ``directory`` for the ``with`` block; the
    files they write as it ends (``PID`` + ``suffix``) fill the list."""
    pids = [int(ready.stem) for ready in directory.glob("*.ready")]
    if not pids:
        raise RuntimeError(f"no process has the sampler ({directory})")
    written: list[Path] = []
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    try:
        yield written
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        out = directory / f"{pid}{suffix}"
        while not out.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"process {pid} wrote nothing into {directory}")
            time.sleep(0.05)
        written.append(out)


@contextlib.contextmanager
def cpu_samples(directory: Path) -> Iterator[Counter[str]]:
    """Sample every process of ``directory`` by CPU time for the ``with`` block; the counts by
    component fill in as it ends."""
    counts: Counter[str] = Counter()
    with signalled(directory, ".txt") as written:
        yield counts
    for path in written:
        counts.update(shares(path.read_text()))


def profiled_calls(paths: list[Path]) -> dict[str, int]:
    """Python calls by group (``bench.inproc.CALL_GROUPS``) in the profiles at ``paths``."""
    table_of: dict[Any, Any] = pstats.Stats(*map(str, paths)).stats  # type: ignore[attr-defined]
    callees: dict[str, list[tuple[str, str, int]]] = {}
    for function, (_, _, _, _, callers) in table_of.items():
        for caller, (_, calls, _, _) in callers.items():
            callees.setdefault(_key(caller), []).append((_key(function), _file(function), calls))
    entries: list[CallEntry] = [
        (_key(function), _file(function), calls, callees.get(_key(function), []))
        for function, (_, calls, _, _, _) in table_of.items()
    ]
    return calls_by_group(entries)


def _key(function: tuple[str, int, str]) -> str:
    return "{}:{}:{}".format(*function)


def _file(function: tuple[str, int, str]) -> str:
    return "" if function[0] == "~" else function[0]


@dataclass
class Measured:
    """One server at one shape: its parts per message (µs by component, or Python calls by
    group), its µs of CPU per message, its requests per second."""

    parts: dict[str, float]
    per_message: float
    rate: float


def measure(which: str, db: servers.Database, shape: str, args: argparse.Namespace) -> Measured:
    """One server under the shape's wrk load, sampled as ``args.sampler`` says."""
    name, load, wrk = f"{which}-{shape}", SCENARIOS[shape].load, ensure_wrk()
    samples = args.workdir / f"{name}-samples"
    env = {} if args.sampler == "py-spy" else sampler_env(samples, args.sampler)
    where = {"workers": args.workers, "workdir": args.workdir, "name": name, "env": env}
    samples.mkdir(exist_ok=True)
    if which == "ours":
        server = servers.start_broker(db, **where)
    else:
        server = servers.start_http_stack(SERVERS[which], **where)
    counts: Counter[str] = Counter()
    calls: dict[str, int] = {}
    try:
        server.wait_ready()
        queue, tag = f"prof_{shape.lower()}", f"{args.run_id}-{which}"  # a tag new to the queue
        run_wrk(wrk, server.base_url, load, args.warmup, queue, f"{tag}-w")
        meter = Meter(db.postmaster_pid, server.pids)
        if args.sampler == "py-spy":
            sampler = threading.Thread(
                target=lambda: counts.update(sample(server.pids[0], args, samples / "py-spy.txt"))
            )
            sampler.start()
            report = run_wrk(wrk, server.base_url, load, args.duration, queue, tag)
            cpu = meter.stop()
            sampler.join()
        elif args.sampler == "calls":
            with signalled(samples, ".prof") as written:
                report = run_wrk(wrk, server.base_url, load, args.duration, queue, tag)
                cpu = meter.stop()
            calls = profiled_calls(written)
        else:
            with cpu_samples(samples) as counts:
                report = run_wrk(wrk, server.base_url, load, args.duration, queue, tag)
                cpu = meter.stop()
    finally:
        server.stop()
    messages = max(1, report.requests * load.items)
    per_message = cpu["server_cpu_s"] * 1e6 / messages
    if args.sampler == "calls":
        parts = {group: n / messages for group, n in sorted(calls.items(), key=lambda g: -g[1])}
    else:
        total = sum(counts.values()) or 1
        parts = {n: per_message * counts[n] / total for n in NAMES}
    return Measured(parts, per_message, report.requests / cpu["wall_s"])


def report_shape(shape: str, measured: list[Measured], args: argparse.Namespace) -> str:
    """The table of one shape: each part per message for bare Hypercorn, our stack and ours,
    and ours above our stack."""
    calls = args.sampler == "calls"
    names = list(dict.fromkeys(n for m in measured for n in m.parts))
    columns = [
        {**m.parts, "**all**": sum(m.parts.values()) if calls else m.per_message} for m in measured
    ]
    rows = [
        [
            name,
            *(f"{c.get(name, 0.0):.1f}" for c in columns),
            f"{columns[2].get(name, 0.0) - columns[1].get(name, 0.0):+.1f}",
        ]
        for name in [*names, "**all**"]
        if any(c.get(name) for c in columns)
    ]
    what = "Python calls per message" if calls else "µs of server CPU per message"
    rate = " / ".join(f"{m.rate:,.0f}" for m in measured)
    headers = ["group" if calls else "component", "bare Hypercorn", "our stack", "ours"]
    text = table([*headers, "ours above stack"], rows, markdown=args.markdown)
    return f"{shape}: {what} (requests/s of each: {rate})\n\n{text}\n"


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="S1,S2", help="push scenarios, comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="sampled seconds per server")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--workers", type=int, default=1, help="processes of each server")
    p.add_argument(
        "--sampler",
        choices=["cpu", "calls", "py-spy"],
        default="cpu",
        help="cpu: every 2 ms of a process's CPU time, in the process; calls: Python calls "
        "counted by cProfile in the process; py-spy: --rate a second",
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
                print(report_shape(shape, measured, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

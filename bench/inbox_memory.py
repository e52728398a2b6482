"""Memory and time of a flood on one partition: ``pushers`` Trio tasks, started at once, each
push one item to the same partition (``broker.push``, in process, real PostgreSQL), so every
request but the first waits on that partition's actor while its writes go one at a time.

``python -m bench.inbox_memory`` starts an embedded PostgreSQL, then runs every case of
:data:`CASES` in a process of its own (``python -m bench.inbox_memory flood ...``), twice:
once plain (RSS: peak and after, above the broker's RSS before the flood; the flood's
duration), once under :mod:`tracemalloc` (the peak of Python allocations during the flood; the
flood is slower then). Each run prints one JSON record; the driver prints a table.

To measure another version of ``queen``, run the driver with ``PYTHONPATH`` pointing at its
checkout: the child processes inherit it. "Held by actor" and "blocked in send" are the most
requests the partition's actor had taken and the most producers waiting in front of its inbox,
read at every step of the actor.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import trio

from queen import open_broker
from queen.actors.partition import PartitionActor
from queen.settings import Settings

CASES: tuple[dict[str, Any], ...] = (
    {"segment_max_items": 10_000},  # the default: the whole flood fits in one segment
    {"segment_max_items": 100},  # the flood waits for 100 writes
)


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise LookupError(key)


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


async def _flood(args: argparse.Namespace) -> dict[str, Any]:
    changes = {k: v for k, v in vars(args).items() if k in CASES[0] and v is not None}
    settings = Settings(
        database_url=args.database_url,
        file_buffer_dir=tempfile.mkdtemp(prefix="queen-bench-spool-"),
    ).with_changes(**changes)
    queue = f"flood-{os.getpid()}"
    record: dict[str, Any] = {"pushers": args.pushers, **changes, "traced": args.trace}
    async with open_broker(settings) as broker:
        await broker.push([{"queue": queue, "partition": "p", "payload": 0}])  # warm up
        statuses: dict[str, int] = {}
        most = {"held": 0, "blocked": 0}
        top: list[str] = []
        serve = PartitionActor._serve_one_step

        async def counted(actor: PartitionActor) -> None:
            # At every step of the actor: requests it holds, producers blocked in `send`.
            held = len(actor._waiting)
            blocked = actor._inbox.statistics().tasks_waiting_send
            most["held"] = max(most["held"], held)
            most["blocked"] = max(most["blocked"], blocked)
            if args.trace and not top and held + blocked >= 0.9 * args.pushers:
                stats = tracemalloc.take_snapshot().statistics("lineno")[:8]
                top.extend(f"{s.size / 2**20:.1f} MiB {s.traceback}" for s in stats)
            await serve(actor)

        PartitionActor._serve_one_step = counted  # type: ignore[method-assign]

        async def push(n: int) -> None:
            [answer] = await broker.push([{"queue": queue, "partition": "p", "payload": n}])
            statuses[answer["status"]] = statuses.get(answer["status"], 0) + 1

        rss_before = _status_kib("VmRSS")
        _reset_peak_rss()
        if args.trace:
            tracemalloc.start()
        started = time.perf_counter()
        async with trio.open_nursery() as pushers:
            for n in range(args.pushers):
                pushers.start_soon(push, n)
        elapsed = time.perf_counter() - started
        if args.trace:
            _, traced_peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            record["traced_peak_mib"] = round(traced_peak / 2**20, 1)
        record.update(
            seconds=round(elapsed, 3),
            per_second=round(args.pushers / elapsed),
            rss_before_mib=round(rss_before / 1024, 1),
            rss_peak_above_mib=round((_status_kib("VmHWM") - rss_before) / 1024, 1),
            rss_after_above_mib=round((_status_kib("VmRSS") - rss_before) / 1024, 1),
            most_held_by_actor=most["held"],
            most_blocked_in_send=most["blocked"],
            statuses=statuses,
            segments=broker.metrics.push_segments,
        )
        if top:
            record["top_allocations"] = top
    return record


def _drive(args: argparse.Namespace) -> None:
    from queen.storage.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="queen-bench-pg-") as scratch:
        server = EmbeddedPostgres(Path(scratch) / "pg")
        server.start()
        try:
            for case in CASES:
                for trace in (False, True):
                    argv = [sys.executable, "-m", "bench.inbox_memory", "flood"]
                    argv += ["--database-url", server.conninfo, "--pushers", str(args.pushers)]
                    argv += [f"--{k.replace('_', '-')}={v}" for k, v in case.items()]
                    argv += ["--trace"] if trace else []
                    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
                    print(out.strip().splitlines()[-1], flush=True)
        finally:
            server.stop("immediate")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.inbox_memory")
    parser.add_argument("mode", nargs="?", default="drive", choices=["drive", "flood"])
    parser.add_argument("--database-url")
    parser.add_argument("--pushers", type=int, default=10_000)
    parser.add_argument("--segment-max-items", dest="segment_max_items", type=int)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    if args.mode == "flood":
        print(json.dumps(trio.run(_flood, args)))
    else:
        _drive(args)


if __name__ == "__main__":
    main()

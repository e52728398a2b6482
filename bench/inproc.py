"""The in-process scenarios: the embedding API (E1-E3) and the consume side (C1-C3).

Each step runs in a process of its own (``python -m bench.inproc NAME --database-url URL``):
a fresh broker from :func:`queen.open_broker` on the run's database, driven by Trio tasks in the
same process, no HTTP. The process prints one JSON record on its last line of output; the
harness (:mod:`bench.runner`) reads it. "Broker CPU" is this whole process (broker plus the
tasks that drive it: building the items is the embedding program's own work).

- **E** (push): ``tasks`` tasks each call ``broker.push()`` with ``items`` items in a closed
  loop, item ``n`` in partition ``p{n % partitions}``, ~100-byte payloads, unique
  transactionIds (dedup on, the queue default). Warm-up, then a measured window.
- **C** (consume): the queue is filled first (100 items per push, not measured), then
  ``consumers`` tasks pop ``batch`` messages in queue mode and ack each batch with one call
  until every message is acked. C2 first times single pops (``batch=1``, then acked) on the
  full queue. C3 lets a first group (queue mode) drain the queue before the measured group
  reads it.
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import json
import math
import resource
import sys
import tempfile
import threading
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from bench import procfs, servers
from bench.scenarios import CONSUME, EMBEDDED, SCENARIOS, ConsumeLoad, Load
from queen import open_broker, tune_gc
from queen.broker import Broker
from queen.settings import Settings

DRAIN_LIMIT_S = 300.0  # a drain that takes longer is reported unfinished
SINGLE_POPS = 100  # C2: single pops timed before the drain
FILL_TASKS = 8
FILL_ITEMS = 100


def _cpu_self_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50/p99/max of ``samples`` (milliseconds), nearest rank; empty: no figures."""
    if not samples:
        return {}
    ordered = sorted(samples)

    def rank(p: float) -> float:
        return ordered[max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))]

    return {"p50": rank(50), "p99": rank(99), "max": ordered[-1]}


def item(queue: str, partitions: int, n: int, tag: str) -> dict[str, Any]:
    return {
        "queue": queue,
        "partition": f"p{n % partitions}",
        "payload": {
            "orderId": n,
            "total": 4200,
            "customer": f"cust-{n % 997:03d}",
            "note": "benchmark payload, about one hundred bytes",
        },
        "transactionId": f"{tag}-{n}",
    }


@dataclass(slots=True)
class Meter:
    """CPU of this process and of the database, and wall time, between two readings."""

    db_pid: int | None
    cpu0: float = 0.0
    db0: float | None = None
    busy0: float = 0.0
    t0: float = 0.0

    def start(self) -> None:
        self.cpu0, self.db0, self.t0 = _cpu_self_s(), self._db(), time.monotonic()
        self.busy0 = procfs.machine_busy_s()

    def _db(self) -> float | None:
        return None if self.db_pid is None else procfs.tree_cpu_s([self.db_pid])

    def stop(self) -> dict[str, Any]:
        cpu, db, t = _cpu_self_s(), self._db(), time.monotonic()
        busy = procfs.machine_busy_s()
        db_cpu = None if db is None or self.db0 is None else db - self.db0
        ours = (cpu - self.cpu0) + (db_cpu or 0.0)
        return {
            "wall_s": t - self.t0,
            "server_cpu_s": cpu - self.cpu0,
            "db_cpu_s": db_cpu,
            "other_cores": max(0.0, (busy - self.busy0) - ours) / (t - self.t0),
        }


def _per_100k(seconds: float | None, messages: float) -> float | None:
    return None if seconds is None or messages <= 0 else seconds / messages * 100_000


async def embedded(
    broker: Broker, name: str, load: Load, args: argparse.Namespace
) -> dict[str, Any]:
    queue = f"{args.queue_prefix}{name.lower()}"
    measuring = False
    done = 0
    failed = 0
    latencies: list[float] = []
    counter = 0

    async def producer() -> None:
        nonlocal counter, done, failed
        while True:
            first = counter
            counter += load.items
            items = [
                item(queue, load.partitions, n, args.tag) for n in range(first, first + load.items)
            ]
            t0 = time.perf_counter()
            results = await broker.push(items)
            elapsed = time.perf_counter() - t0
            if measuring:
                latencies.append(elapsed * 1000)
                for r in results:
                    if r.status == "queued":
                        done += 1
                    else:
                        failed += 1

    meter = Meter(args.db_pid)
    async with trio.open_nursery() as nursery:
        for _ in range(load.connections):
            nursery.start_soon(producer)
        await trio.sleep(args.warmup)
        before = broker.metrics.snapshot()
        measuring = True
        meter.start()
        await trio.sleep(args.duration)
        measuring = False
        window = meter.stop()
        after = broker.metrics.snapshot()
        nursery.cancel_scope.cancel()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    tx = delta.get("push_transactions", 0)
    record: dict[str, Any] = {
        "kind": "embedded",
        "items_per_request": load.items,
        "connections": load.connections,
        "partitions": load.partitions,
        "seconds": window["wall_s"],
        "requests": len(latencies),
        "requests_per_s": len(latencies) / window["wall_s"],
        "msg_per_s": done / window["wall_s"],
        "latency_ms": percentiles(latencies),
        "errors": {"failed_items": failed},
        "requests_per_tx": delta.get("push_requests_committed", 0) / tx if tx else None,
        "partitions_per_tx": delta.get("push_segments", 0) / tx if tx else None,
        **window,
        "server_cores": window["server_cpu_s"] / window["wall_s"],
        "server_cpu_s_per_100k": _per_100k(window["server_cpu_s"], done),
        "db_cpu_s_per_100k": _per_100k(window["db_cpu_s"], done),
    }
    return record


async def fill(broker: Broker, queue: str, load: ConsumeLoad, tag: str) -> None:
    """Push ``load.messages`` messages, item ``n`` in partition ``p{n % partitions}``."""
    pushes = math.ceil(load.messages / FILL_ITEMS)

    async def pusher(worker: int) -> None:
        for k in range(worker, pushes, FILL_TASKS):
            first = k * FILL_ITEMS
            last = min(load.messages, first + FILL_ITEMS)
            results = await broker.push(
                [item(queue, load.partitions, n, tag) for n in range(first, last)]
            )
            bad = [r for r in results if r.status != "queued"]
            if bad:
                raise RuntimeError(f"fill of {queue}: {bad[0]}")

    async with trio.open_nursery() as nursery:
        for worker in range(FILL_TASKS):
            nursery.start_soon(pusher, worker)


@dataclass(slots=True)
class Drain:
    consumed: int = 0
    pops: int = 0
    empty_pops: int = 0
    finished: bool = False


async def drain(
    broker: Broker,
    queue: str,
    group: str | None,
    total: int,
    consumers: int,
    batch: int,
    pop_ms: list[float] | None = None,
    ack_ms: list[float] | None = None,
) -> Drain:
    """``consumers`` tasks pop and ack until ``total`` messages are acked (or the limit)."""
    state = Drain()
    pops = pop_ms if pop_ms is not None else []
    acks = ack_ms if ack_ms is not None else []

    async def consumer() -> None:
        while state.consumed < total:
            t0 = time.perf_counter()
            result = await broker.pop(queue, batch=batch, consumer_group=group, autopilot=True)
            t1 = time.perf_counter()
            pops.append((t1 - t0) * 1000)
            state.pops += 1
            if not result:
                state.empty_pops += 1
                await trio.lowlevel.checkpoint()
                continue
            answers = await broker.ack(result.messages)
            acks.append((time.perf_counter() - t1) * 1000)
            bad = [a for a in answers if not a.success]
            if bad:
                raise RuntimeError(f"ack failed: {bad[0]}")
            state.consumed += len(answers)

    with trio.move_on_after(DRAIN_LIMIT_S):
        async with trio.open_nursery() as nursery:
            for _ in range(consumers):
                nursery.start_soon(consumer)
        state.finished = True
    return state


async def consume(broker: Broker, load: ConsumeLoad, args: argparse.Namespace) -> dict[str, Any]:
    name = load.name
    queue = f"{args.queue_prefix}{name.lower()}"
    t0 = time.monotonic()
    await fill(broker, queue, load, args.tag)
    record: dict[str, Any] = {"kind": "consume", "fill_s": time.monotonic() - t0}
    total = load.messages
    group: str | None = None
    if load.fan_out:
        first = await drain(broker, queue, None, total, load.consumers, load.batch)
        if not first.finished:
            raise RuntimeError(f"{name}: the first group did not drain the queue")
        group = "bench-second"
    single: list[float] = []
    if load.single_pops:
        for _ in range(min(SINGLE_POPS, total)):
            s0 = time.perf_counter()
            result = await broker.pop(queue, batch=1, consumer_group=group)
            single.append((time.perf_counter() - s0) * 1000)
            await broker.ack(result.messages)
        total -= len(single)
        record["single_pop_ms"] = percentiles(single)
    pop_ms: list[float] = []
    ack_ms: list[float] = []
    meter = Meter(args.db_pid)
    meter.start()
    state = await drain(broker, queue, group, total, load.consumers, load.batch, pop_ms, ack_ms)
    window = meter.stop()
    record.update(
        {
            "messages": state.consumed,
            "partitions": load.partitions,
            "consumers": load.consumers,
            "batch": load.batch,
            "finished": state.finished,
            "pops": state.pops,
            "empty_pops": state.empty_pops,
            "msg_per_s": state.consumed / window["wall_s"],
            "pop_ms": percentiles(pop_ms),
            "ack_ms": percentiles(ack_ms),
            **window,
            "server_cores": window["server_cpu_s"] / window["wall_s"],
            "server_cpu_s_per_100k": _per_100k(window["server_cpu_s"], state.consumed),
            "db_cpu_s_per_100k": _per_100k(window["db_cpu_s"], state.consumed),
        }
    )
    return record


# name: (the load of the scenario of that name, over HTTP)
CALL_SHAPES = {
    **{name: (SCENARIOS[name].load, True) for name in ("S1", "S2")},
    **{name: (EMBEDDED[name].load, False) for name in ("E1", "E2")},
}
# Where a call is counted: the first fragment of its file's path that matches (see
# calls_by_group for the rest). "bench" (the drivers) is left out of the totals.
_ROOMS = (
    "actors/",
    "push/",
    "intake.py",
    "storage/",
    "http/",
    "primitives.py",
    "frames.py",
    "spool/",
)
CALL_GROUPS = (
    *((f"/queen/{room}", room.removesuffix(".py").strip("/")) for room in _ROOMS),
    ("/queen/", "queen other"),
    ("/bench/", "bench"),
    *((part, "trio") for part in ("/trio/", "/outcome/", "methods trio.", "methods outcome.")),
    *((f"/{name}", name) for name in ("psycopg", "quart", "hypercorn", "h11")),
)


def call_group(path: str) -> str:
    return next((name for part, name in CALL_GROUPS if part in path), "other")


def calls_by_group(profile: cProfile.Profile) -> dict[str, int]:
    """Calls per group. A function of no group (a builtin, the standard library, generated
    code) counts in each caller's group; a caller of no group in its own main caller's. Read
    from the profiler's own entries, one per code object (pstats merges the methods that
    dataclasses generate, which all share one file, line and name)."""
    entries = profile.getstats()
    callers: dict[Any, dict[Any, int]] = {}
    for entry in entries:
        for sub in entry.calls or ():
            by = callers.setdefault(sub.code, {})
            by[entry.code] = by.get(entry.code, 0) + sub.callcount

    def own(code: Any) -> str:
        return call_group(code.co_filename) if isinstance(code, types.CodeType) else "other"

    owners: dict[Any, str] = {}

    def owner(code: Any) -> str:
        if code not in owners:
            owners[code] = "other"  # while resolving: a cycle ends here
            by = callers.get(code)
            group = own(code)
            owners[code] = group if group != "other" or not by else owner(max(by, key=by.get))
        return owners[code]

    counts: dict[str, int] = {}
    for entry in entries:
        group = own(entry.code)
        by = {} if group != "other" else callers.get(entry.code, {})
        for caller, calls in by.items():
            counts[owner(caller)] = counts.get(owner(caller), 0) + calls
        rest = entry.callcount - sum(by.values())
        counts[group] = counts.get(group, 0) + rest
    return counts


def _post_all(port: int, bodies: list[bytes], errors: list[BaseException]) -> None:
    """POST ``bodies`` one after another on one keep-alive connection (a client thread)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for body in bodies:
            conn.request("POST", "/api/v1/push", body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            if answer.status != 201 or b'"failed"' in answer.read():
                raise RuntimeError(f"push answered {answer.status}")
        conn.close()
    except BaseException as exc:
        errors.append(exc)


def _post_lanes(port: int, lanes: list[list[bytes]]) -> None:
    """Each lane from a client thread of its own (threads cProfile does not see)."""
    errors: list[BaseException] = []
    clients = [threading.Thread(target=_post_all, args=(port, b, errors)) for b in lanes]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    if errors:
        raise errors[0]


async def count_calls(broker: Broker, shape: str, args: argparse.Namespace) -> dict[str, Any]:
    """``args.requests`` pushes of ``shape`` (its items and partitions; ``args.tasks``
    producers instead of its connections), profiled."""
    from queen.http.app import create_app
    from queen.server import listen_socket
    from queen.serving import serve_app

    load, over_http = CALL_SHAPES[shape]
    size, partitions = load.items, load.partitions
    queue = f"{args.queue_prefix}calls-{shape.lower()}"
    pushes = [
        [item(queue, partitions, n, args.tag) for n in range(r * size, (r + 1) * size)]
        for r in range(args.requests + 1)
    ]
    lanes = [pushes[1 + t :: args.tasks] for t in range(args.tasks)]
    await broker.push([item(queue, partitions, n, "warm") for n in range(partitions)])
    profile = cProfile.Profile()
    async with trio.open_nursery() as nursery:
        if over_http:
            sock = listen_socket("127.0.0.1", 0)
            stop = trio.Event()
            await nursery.start(
                partial(
                    serve_app, create_app(broker), broker.settings, sock, shutdown_trigger=stop.wait
                )
            )
            bodies = [[json.dumps({"items": p}).encode() for p in lane] for lane in lanes]
            port = sock.getsockname()[1]
            warm = [[json.dumps({"items": pushes[0]}).encode()]]
            await trio.to_thread.run_sync(_post_lanes, port, warm)  # the app warmed up
            before = broker.metrics.snapshot()
            profile.enable()
            await trio.to_thread.run_sync(_post_lanes, port, bodies)
            profile.disable()
            stop.set()
        else:

            async def producer(lane: list[list[dict[str, Any]]]) -> None:
                for push in lane:
                    if any(r.status != "queued" for r in await broker.push(push)):
                        raise RuntimeError("a push was not queued")

            before = broker.metrics.snapshot()
            profile.enable()
            async with trio.open_nursery() as producers:
                for lane in lanes:
                    producers.start_soon(producer, lane)
            profile.disable()
    delta = {k: v - before.get(k, 0) for k, v in broker.metrics.snapshot().items()}
    groups = calls_by_group(profile)
    groups.pop("bench", None)
    items = args.requests * size
    if args.profile_to:
        profile.dump_stats(f"{args.profile_to}-{shape}.prof")
    return {
        "shape": shape,
        "tasks": args.tasks,
        "requests": args.requests,
        "items": items,
        "transactions": delta.get("push_transactions", 0),
        "segments": delta.get("push_segments", 0),
        "calls_per_item": sum(groups.values()) / items,
        "calls_per_request": sum(groups.values()) / args.requests,
        "per_item": {
            k: round(v / items, 1) for k, v in sorted(groups.items(), key=lambda g: -g[1])
        },
    }


def calls_table(records: list[dict[str, Any]]) -> str:
    columns = [*dict.fromkeys(name for _, name in CALL_GROUPS if name != "bench"), "other"]
    shown = [c for c in columns if any(c in r["per_item"] for r in records)]
    lines = [
        "| shape | tasks | calls/item | calls/request | segments/tx | " + " | ".join(shown) + " |",
        "|---" * (5 + len(shown)) + "|",
    ]
    for r in records:
        per_tx = r["segments"] / r["transactions"] if r["transactions"] else 0
        cells = [str(r["per_item"].get(c, 0)) for c in shown]
        lines.append(
            f"| {r['shape']} | {r['tasks']} | {r['calls_per_item']:.1f} | "
            f"{r['calls_per_request']:.1f} | {per_tx:.1f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


async def run_calls(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="queen-bench-spool-") as spool:
        settings = Settings.from_env(database_url=url, file_buffer_dir=spool)
        async with open_broker(settings) as broker:
            tune_gc(settings.gc_gen0_threshold)
            return [await count_calls(broker, s, args) for s in args.shapes.split(",")]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="queen-bench-spool-") as spool:
        settings = Settings.from_env(database_url=args.database_url, file_buffer_dir=spool)
        async with open_broker(settings) as broker:
            tune_gc(settings.gc_gen0_threshold)  # what queen serve does, as the README advises
            if args.name in EMBEDDED:
                return await embedded(broker, args.name, EMBEDDED[args.name].load, args)
            return await consume(broker, CONSUME[args.name], args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.inproc")
    p.add_argument("name", choices=[*EMBEDDED, *CONSUME, "calls"])
    p.add_argument("--database-url", help="required, except for calls (else embedded)")
    p.add_argument("--db-pid", type=int, help="postmaster pid, to measure the database's CPU")
    p.add_argument("--duration", type=float, default=25.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--queue-prefix", default="qbench-")
    p.add_argument("--tag", default=f"t{time.time_ns()}")
    p.add_argument("--shapes", default=",".join(CALL_SHAPES), help="calls: which shapes")
    p.add_argument("--requests", type=int, default=1000, help="calls: pushes per shape")
    p.add_argument("--tasks", type=int, default=1, help="calls: concurrent producers")
    p.add_argument("--profile-to", help="calls: save each shape's profile as PREFIX-SHAPE.prof")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.name == "calls":
        with (
            tempfile.TemporaryDirectory(prefix="queen-bench-calls-") as workdir,
            servers.open_database(args.database_url, Path(workdir)) as db,
        ):
            records = trio.run(run_calls, args, db.conninfo)
        sys.stdout.write(calls_table(records) + "\n" + json.dumps(records) + "\n")
        return 0
    if not args.database_url:
        parser().error("--database-url is required")
    record = trio.run(run, args)
    sys.stdout.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The in-process steps (docs/benchmark.md), each a process of its own (``python -m
bench.inproc NAME --database-url URL``) printing one JSON record last: the embedding API
(E1-E3), the consume side (C1-C3), and the Python calls per pushed item (``calls``)."""

from __future__ import annotations

import argparse
import cProfile
import http.client
import json
import math
import os
import sys
import tempfile
import time
import types
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from bench import servers
from bench.report import table
from bench.scenarios import CONSUME, EMBEDDED, SCENARIOS, ConsumeLoad, Load
from bench.servers import Meter, per_100k
from queen import open_broker, tune_gc
from queen.broker import Broker
from queen.settings import Settings

DRAIN_LIMIT_S = 300.0  # a drain that takes longer is reported unfinished
SINGLE_POPS = 100  # C2: single pops timed before the drain
FILL_TASKS = 8
FILL_ITEMS = 100
Push = Callable[[list[dict[str, Any]]], Awaitable[None]]  # push items, raise where one failed
Pop = Callable[[], Awaitable[list[Any]]]
Ack = Callable[[list[Any]], Awaitable[int]]  # ack messages, answer how many were acked


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50/p99/max of ``samples`` (milliseconds), nearest rank; empty: no figures."""
    if not samples:
        return {}
    ordered = sorted(samples)

    def rank(p: float) -> float:
        return ordered[max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))]

    return {"p50": rank(50), "p99": rank(99), "max": ordered[-1]}


NOTE = "benchmark payload, about one hundred bytes"


def item(queue: str, partitions: int, n: int, tag: str) -> dict[str, Any]:
    """Item ``n`` in partition ``p{n % partitions}``, as ``push.lua`` writes them."""
    payload = {"orderId": n, "total": 4200, "customer": f"cust-{n % 997:03d}", "note": NOTE}
    return {
        "queue": queue,
        "partition": f"p{n % partitions}",
        "payload": payload,
        "transactionId": f"{tag}-{n}",
    }


async def embedded(
    broker: Broker, name: str, load: Load, args: argparse.Namespace
) -> dict[str, Any]:
    """An E step (docs/benchmark.md): warm-up, then the measured window."""
    queue = f"{args.queue_prefix}{name.lower()}"
    if args.dedup_window is not None:  # the queue made first, with that window (0: dedup off)
        await broker.configure(queue, {"dedupWindowSeconds": args.dedup_window})
    measuring, done, failed, counter = False, 0, 0, 0
    latencies: list[float] = []

    async def producer() -> None:
        nonlocal counter, done, failed
        while True:
            first, counter = counter, counter + load.items
            items = [item(queue, load.partitions, n, args.tag) for n in range(first, counter)]
            t0 = time.perf_counter()
            results = await broker.push(items)
            if measuring:
                latencies.append((time.perf_counter() - t0) * 1000)
                queued = sum(1 for r in results if r.status == "queued")
                done, failed = done + queued, failed + len(results) - queued

    async with trio.open_nursery() as nursery:
        for _ in range(load.connections):
            nursery.start_soon(producer)
        await trio.sleep(args.warmup)
        before = broker.metrics.snapshot()
        measuring, meter = True, Meter(args.db_pid)
        await trio.sleep(args.duration)
        measuring = False
        window = meter.stop()
        after = broker.metrics.snapshot()
        nursery.cancel_scope.cancel()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    tx = delta.get("push_transactions", 0)
    return {
        "seconds": window["wall_s"],
        "requests": len(latencies),
        "requests_per_s": len(latencies) / window["wall_s"],
        "msg_per_s": done / window["wall_s"],
        "latency_ms": percentiles(latencies),
        "errors": {"failed_items": failed},
        "requests_per_tx": delta.get("push_requests_committed", 0) / tx if tx else None,
        "partitions_per_tx": delta.get("push_segments", 0) / tx if tx else None,
        **per_100k(window, done),
    }


async def fill(push: Push, queue: str, messages: int, partitions: int, tag: str) -> None:
    """Push ``messages`` items (:func:`item`), 100 per push from 8 tasks."""
    pushes = math.ceil(messages / FILL_ITEMS)

    async def pusher(worker: int) -> None:
        for k in range(worker, pushes, FILL_TASKS):
            numbers = range(k * FILL_ITEMS, min(messages, (k + 1) * FILL_ITEMS))
            await push([item(queue, partitions, n, tag) for n in numbers])

    async with trio.open_nursery() as nursery:
        for worker in range(FILL_TASKS):
            nursery.start_soon(pusher, worker)


@dataclass(slots=True)
class Drain:
    consumed: int = 0
    pops: int = 0
    empty_pops: int = 0
    failed_acks: int = 0
    finished: bool = False
    pop_ms: list[float] = field(default_factory=list)
    ack_ms: list[float] = field(default_factory=list)


async def drain(pop: Pop, ack: Ack, total: int, consumers: int) -> Drain:
    """``consumers`` tasks ``pop`` and ``ack`` (answering how many it acked) until ``total``
    messages are acked or :data:`DRAIN_LIMIT_S` passed; the others are then cancelled."""
    state = Drain()

    async def consumer(cancel: trio.CancelScope) -> None:
        while state.consumed < total:
            t0 = time.perf_counter()
            messages = await pop()
            t1 = time.perf_counter()
            state.pop_ms.append((t1 - t0) * 1000)
            state.pops += 1
            if not messages:
                state.empty_pops += 1
                await trio.lowlevel.checkpoint()
                continue
            acked = await ack(messages)
            state.ack_ms.append((time.perf_counter() - t1) * 1000)
            state.failed_acks += len(messages) - acked
            state.consumed += acked
        cancel.cancel()

    with trio.move_on_after(DRAIN_LIMIT_S):
        async with trio.open_nursery() as nursery:
            for _ in range(consumers):
                nursery.start_soon(consumer, nursery.cancel_scope)
    state.finished = state.consumed >= total
    return state


async def consume(broker: Broker, load: ConsumeLoad, args: argparse.Namespace) -> dict[str, Any]:
    """A C step (docs/benchmark.md): fill the queue (not measured), then drain it."""
    queue = f"{args.queue_prefix}{load.name.lower()}"
    t0 = time.monotonic()

    async def push(items: list[dict[str, Any]]) -> None:
        bad = [r for r in await broker.push(items) if r.status != "queued"]
        if bad:
            raise RuntimeError(f"fill of {queue}: {bad[0]}")

    await fill(push, queue, load.messages, load.partitions, args.tag)
    record: dict[str, Any] = {"fill_s": time.monotonic() - t0}
    group: str | None = None

    async def pop() -> list[Any]:
        popped = await broker.pop(queue, batch=load.batch, consumer_group=group, autopilot=True)
        return popped.messages

    async def ack(messages: list[Any]) -> int:
        bad = [a for a in await broker.ack(messages) if not a.success]
        if bad:
            raise RuntimeError(f"ack failed: {bad[0]}")
        return len(messages)

    total = load.messages
    if load.fan_out:
        if not (await drain(pop, ack, total, load.consumers)).finished:
            raise RuntimeError(f"{load.name}: the first group did not drain the queue")
        group = "bench-second"
    if load.single_pops:
        single: list[float] = []
        for _ in range(min(SINGLE_POPS, total)):
            s0 = time.perf_counter()
            result = await broker.pop(queue, batch=1, consumer_group=group)
            single.append((time.perf_counter() - s0) * 1000)
            await broker.ack(result.messages)
        total -= len(single)
        record["single_pop_ms"] = percentiles(single)
    meter = Meter(args.db_pid)
    state = await drain(pop, ack, total, load.consumers)
    window = meter.stop()
    return {
        **record,
        "messages": state.consumed,
        "finished": state.finished,
        "pops": state.pops,
        "msg_per_s": state.consumed / window["wall_s"],
        "pop_ms": percentiles(state.pop_ms),
        "ack_ms": percentiles(state.ack_ms),
        **per_100k(window, state.consumed),
    }


CALL_SHAPES = {
    **{name: (SCENARIOS[name].load, True) for name in ("S1", "S2")},
    **{name: (EMBEDDED[name].load, False) for name in ("E1", "E2")},
}
# Where a call is counted: the first fragment of its file's path that matches (see
# calls_by_group for the rest). "bench" (the drivers) is left out of the totals.
_ROOMS = "actors/ push/ intake.py storage/ http/ primitives.py frames.py spool/"
CALL_GROUPS = (
    *((f"/queen/{room}", room.removesuffix(".py").strip("/")) for room in _ROOMS.split()),
    ("/queen/", "queen other"),
    ("/bench/", "bench"),
    *((part, "trio") for part in ("/trio/", "/outcome/", "methods trio.", "methods outcome.")),
    *((f"/{name}", name) for name in ("psycopg", "quart", "hypercorn", "h11")),
)


# One function's entry of a profile: its key, its file ("" for a builtin), how often it was
# called, and the functions it called (key, file, how often), as ``cProfile``'s entries hold.
CallEntry = tuple[str, str, int, list[tuple[str, str, int]]]


def call_entries(profile: cProfile.Profile) -> list[CallEntry]:
    """The profiler's own entries, one per code object (pstats merges the methods that
    dataclasses generate, which all share one file, line and name), keyed apart."""
    keys: dict[Any, str] = {}  # code objects that compare equal share a key

    def key(code: Any) -> str:
        if not isinstance(code, types.CodeType):
            return str(code)
        found = keys.get(code)
        if found is None:
            found = keys[code] = f"{code.co_filename}:{code.co_firstlineno}:{len(keys)}"
        return found

    def path(code: Any) -> str:
        return code.co_filename if isinstance(code, types.CodeType) else ""

    return [
        (
            key(entry.code),
            path(entry.code),
            entry.callcount,
            [(key(sub.code), path(sub.code), sub.callcount) for sub in entry.calls or ()],
        )
        for entry in profile.getstats()
    ]


def calls_by_group(entries: list[CallEntry]) -> dict[str, int]:
    """Calls per group. A function of no group (a builtin, the standard library, generated
    code) counts in each caller's group; a caller of no group in its own main caller's."""
    callers: dict[str, dict[str, int]] = {}
    paths: dict[str, str] = {}
    for key, path, _, subcalls in entries:
        paths[key] = path
        for sub, sub_path, calls in subcalls:
            paths.setdefault(sub, sub_path)
            by = callers.setdefault(sub, {})
            by[key] = by.get(key, 0) + calls

    def own(key: str) -> str:
        path = paths.get(key, "")
        return next((name for part, name in CALL_GROUPS if part in path), "other")

    owners: dict[str, str] = {}

    def owner(key: str) -> str:
        if key not in owners:
            owners[key] = "other"  # while resolving: a cycle ends here
            by = callers.get(key)
            group = own(key)
            main_caller = max(by, key=by.__getitem__) if by else None
            owners[key] = group if group != "other" or main_caller is None else owner(main_caller)
        return owners[key]

    counts: dict[str, int] = {}
    for key, _, callcount, _ in entries:
        group = own(key)
        by = {} if group != "other" else callers.get(key, {})
        for caller, calls in by.items():
            counts[owner(caller)] = counts.get(owner(caller), 0) + calls
        rest = callcount - sum(by.values())
        counts[group] = counts.get(group, 0) + rest
    return counts


def _post_lanes(port: int, lanes: list[list[bytes]]) -> None:
    """Each lane's bodies one after another on one keep-alive connection, from a client
    thread of its own (threads cProfile does not see)."""

    def post_all(bodies: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for body in bodies:
            conn.request("POST", "/api/v1/push", body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            if answer.status != 201 or b'"failed"' in answer.read():
                raise RuntimeError(f"push answered {answer.status}")
        conn.close()

    with ThreadPoolExecutor(len(lanes)) as clients:  # every lane runs to its end
        lanes_done = [clients.submit(post_all, bodies) for bodies in lanes]
    for lane in lanes_done:
        lane.result()  # a lane's error, raised


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
    profile, stop = cProfile.Profile(), trio.Event()

    async def push_lanes() -> None:
        async def producer(lane: list[list[dict[str, Any]]]) -> None:
            for push in lane:
                if any(r.status != "queued" for r in await broker.push(push)):
                    raise RuntimeError("a push was not queued")

        async with trio.open_nursery() as producers:
            for lane in lanes:
                producers.start_soon(producer, lane)

    async with trio.open_nursery() as nursery:
        send = push_lanes
        if over_http:
            sock, app = listen_socket("127.0.0.1", 0), create_app(broker)
            serve = partial(serve_app, app, broker.settings, sock, shutdown_trigger=stop.wait)
            await nursery.start(serve)
            port = sock.getsockname()[1]
            bodies = [[json.dumps({"items": p}).encode() for p in lane] for lane in lanes]
            warm = [[json.dumps({"items": pushes[0]}).encode()]]
            await trio.to_thread.run_sync(_post_lanes, port, warm)  # the app warmed up
            send = partial(trio.to_thread.run_sync, _post_lanes, port, bodies)
        before = broker.metrics.snapshot()
        profile.enable()
        await send()
        profile.disable()
        stop.set()
    delta = {k: v - before.get(k, 0) for k, v in broker.metrics.snapshot().items()}
    groups = calls_by_group(call_entries(profile))
    groups.pop("bench", None)
    items = args.requests * size
    per_item = {k: round(v / items, 1) for k, v in sorted(groups.items(), key=lambda g: -g[1])}
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
        "per_item": per_item,
    }


def calls_table(records: list[dict[str, Any]]) -> str:
    columns = [*dict.fromkeys(name for _, name in CALL_GROUPS if name != "bench"), "other"]
    shown = [c for c in columns if any(c in r["per_item"] for r in records)]
    headers = ["shape", "tasks", "calls/item", "calls/request", "segments/tx", *shown]
    rows = []
    for r in records:
        per_tx = r["segments"] / r["transactions"] if r["transactions"] else 0
        figures = [f"{v:.1f}" for v in (r["calls_per_item"], r["calls_per_request"], per_tx)]
        calls = [str(r["per_item"].get(c, 0)) for c in shown]
        rows.append([r["shape"], str(r["tasks"]), *figures, *calls])
    return table(headers, rows, markdown=True, left=len(headers))  # every column "---"


def in_process(
    module: list[str], db: servers.Database, log_path: Path, timeout_s: float, **options: Any
) -> dict[str, Any]:
    """``python -m`` ``module`` in a process of its own on ``db``, ``options`` as ``--name
    value``, its standard error into ``log_path``: the JSON record it prints last."""
    argv = [sys.executable, "-m", *module, "--database-url", db.conninfo]
    for name, value in {**options, "db_pid": db.postmaster_pid}.items():
        argv += [] if value is None else [f"--{name.replace('_', '-')}", str(value)]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "QUEEN_WORKER_ID")}
    env.setdefault("QUEEN_LOG_LEVEL", "warning")
    out = servers.output_of(argv, env, log_path, timeout_s)
    return dict(json.loads(out.strip().splitlines()[-1]))


async def run(args: argparse.Namespace, url: str) -> Any:
    with tempfile.TemporaryDirectory(prefix="queen-bench-spool-") as spool:
        settings = Settings.from_env(database_url=url, file_buffer_dir=spool)
        async with open_broker(settings) as broker:
            tune_gc(settings.gc_gen0_threshold)  # what queen serve does, as the README advises
            if args.name == "calls":
                return [await count_calls(broker, s, args) for s in args.shapes.split(",")]
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
    p.add_argument(
        "--dedup-window", type=int, help="E steps: the queue's dedup window in s (0: off)"
    )
    p.add_argument("--shapes", default=",".join(CALL_SHAPES), help="calls: which shapes")
    p.add_argument("--requests", type=int, default=1000, help="calls: pushes per shape")
    p.add_argument("--tasks", type=int, default=1, help="calls: concurrent producers")
    p.add_argument("--profile-to", help="calls: save each shape's profile as PREFIX-SHAPE.prof")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.name != "calls":
        if not args.database_url:
            parser().error("--database-url is required")
        sys.stdout.write(json.dumps(trio.run(run, args, args.database_url)) + "\n")
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="queen-bench-calls-") as workdir,
        servers.open_database(args.database_url, Path(workdir)) as db,
    ):
        records = trio.run(run, args, db.conninfo)
    sys.stdout.write(calls_table(records) + "\n" + json.dumps(records) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

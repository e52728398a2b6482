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
import json
import math
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio
import trio.lowlevel

from bench import procfs
from bench.scenarios import CONSUME, EMBEDDED, ConsumeLoad, Load
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
    p.add_argument("name", choices=[*EMBEDDED, *CONSUME])
    p.add_argument("--database-url", required=True)
    p.add_argument("--db-pid", type=int, help="postmaster pid, to measure the database's CPU")
    p.add_argument("--duration", type=float, default=25.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--queue-prefix", default="qbench-")
    p.add_argument("--tag", default=f"t{time.time_ns()}")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    record = trio.run(run, args)
    sys.stdout.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

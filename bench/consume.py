"""Consume-side measurements through the embedding API (no HTTP in the way).

    python -m bench.consume --messages 50000 --partitions 10 --batch 100 --samples 300

1. End-to-end throughput: push ``--messages`` across ``--partitions`` partitions in pushes of
   ``--batch`` items, then drain them with ``--consumers`` concurrent consumers (one group,
   pop batch ``--batch``, one ack call per batch) and report messages per second of each phase.
2. Delivery latency of a waiting consumer: a pop waits (long poll); one message is pushed;
   the time from the push's acknowledgment (its transaction committed) to the pop returning
   the message. Measured in one broker process (the batcher's commit listener wakes it) and
   across two broker processes' worth of components sharing the database (NOTIFY wakes it).

It starts its own embedded PostgreSQL (durable settings, the server defaults) unless
``--database-url`` is given.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import trio

from queen import open_broker
from queen.broker import Broker
from queen.settings import Settings
from queen.storage.embedded import EmbeddedPostgres


async def throughput(broker: Broker, args: argparse.Namespace) -> None:
    queue = f"bench-{time.time_ns()}"
    per_push = args.batch
    pushes = args.messages // per_push
    started = time.perf_counter()

    async def producer(worker: int) -> None:
        for n in range(worker, pushes, 8):
            partition = f"p{n % args.partitions}"
            await broker.push(
                [
                    {"queue": queue, "partition": partition, "payload": {"n": n, "i": i}}
                    for i in range(per_push)
                ]
            )

    async with trio.open_nursery() as nursery:
        for worker in range(8):
            nursery.start_soon(producer, worker)
    pushed_s = time.perf_counter() - started
    total = pushes * per_push
    print(f"push     {total} msgs in {pushed_s:.2f}s = {total / pushed_s:,.0f} msg/s")

    consumed = 0
    pops = 0
    started = time.perf_counter()

    async def consumer() -> None:
        nonlocal consumed, pops
        while consumed < total:
            result = await broker.pop(queue, batch=args.batch, consumer_group="bench")
            pops += 1
            if not result:
                continue
            answers = await broker.ack(result.messages)
            assert all(a.success for a in answers)
            consumed += len(answers)

    async with trio.open_nursery() as nursery:
        for _ in range(args.consumers):
            nursery.start_soon(consumer)
    consumed_s = time.perf_counter() - started
    print(
        f"consume  {consumed} msgs in {consumed_s:.2f}s = {consumed / consumed_s:,.0f} msg/s"
        f" ({pops} pops, {args.consumers} consumers, pop+ack per batch of {args.batch})"
    )
    print(f"end-to-end {total / (pushed_s + consumed_s):,.0f} msg/s")


async def latency(waiting: Broker, pushing: Broker, samples: int, label: str) -> None:
    queue = f"lat-{label}-{time.time_ns()}"
    await pushing.push([{"queue": queue, "payload": "warm-up"}])
    await waiting.ack((await waiting.pop(queue)).messages)
    delays: list[float] = []
    for n in range(samples):
        got: list[float] = []

        async def wait_for_it(got: list[float] = got) -> None:
            result = await waiting.pop(queue, wait=True, timeout_ms=10_000)
            got.append(time.perf_counter())
            await waiting.ack(result.messages)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_it)
            await waiting.consume.wakeups.until_waiting(1)
            await pushing.push([{"queue": queue, "payload": n}])
            committed = time.perf_counter()
        delays.append((got[0] - committed) * 1000)
    delays.sort()
    p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
    print(
        f"latency  {label}: p50 {statistics.median(delays):.2f} ms, p99 {p99:.2f} ms,"
        f" max {delays[-1]:.2f} ms ({samples} samples)"
    )


async def run(args: argparse.Namespace, url: str, spool: str) -> None:
    settings = Settings(database_url=url, file_buffer_dir=spool, pop_recheck_ms=60_000)
    async with open_broker(settings) as broker:
        await throughput(broker, args)
        await latency(broker, broker, args.samples, "same process")
        async with open_broker(settings) as other:
            await latency(broker, other, args.samples, "other process (NOTIFY)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--database-url")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="queen-bench-"))
    server = None
    try:
        url = args.database_url
        if url is None:
            server = EmbeddedPostgres(scratch / "pg")
            url = server.start()
        trio.run(run, args, url, str(scratch / "spool"))
    finally:
        if server is not None:
            server.stop("fast")
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

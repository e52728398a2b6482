"""Streaming cycles per second: a 1-key tumbling window (a count per source partition) over
100 partitions, driven over HTTP with the official Streams SDK's calls and bodies.

    python -m bench.streams --partitions 100 --messages-per-partition 200 --batch 10

It starts its own embedded PostgreSQL (or uses ``--database-url``) and one ``queen serve``
process, pushes the source messages (event time ``ts``, ``--events-per-window`` per 1 s
window), registers the query, then ``--workers`` concurrent workers each loop as the SDK's
runner does for one partition: pop (one partition, ``--batch`` messages, the query's group),
read the partition's state, fold the batch into its open windows, and commit one cycle: the
open window upserted, closed windows pushed to the sink and deleted, the batch acked. It
reports cycles per second, messages per second and cycle latency, then checks that every
message was counted exactly once (sink counts plus open windows).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from bench.servers import Database, Server, open_database, start_broker

WINDOW_MS = 1000


async def _post(http: httpx.AsyncClient, path: str, body: Any) -> Any:
    answer = await http.post(path, json=body)
    answer.raise_for_status()
    return answer.json()


async def _push(http: httpx.AsyncClient, src: str, args: argparse.Namespace) -> None:
    step = WINDOW_MS // args.events_per_window

    async def one(partition: int) -> None:
        items = [
            {"queue": src, "partition": f"p{partition}", "payload": {"ts": i * step}}
            for i in range(args.messages_per_partition)
        ]
        for start in range(0, len(items), 500):
            answer = await http.post("/api/v1/push", json={"items": items[start : start + 500]})
            answer.raise_for_status()

    async with trio.open_nursery() as nursery:
        for partition in range(args.partitions):
            nursery.start_soon(one, partition)


def _fold(
    messages: list[dict[str, Any]], state: dict[str, Any], sink: str, partition: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The SDK's tumbling count for one key: state ops and sink items for one batch."""
    windows: dict[int, int] = {}
    for row in state.values():
        windows[int(row["windowStart"])] = int(row["acc"]["count"])
    seeded = set(windows)
    watermark = max(m["data"]["ts"] for m in messages)
    for m in messages:
        start = m["data"]["ts"] // WINDOW_MS * WINDOW_MS
        windows[start] = windows.get(start, 0) + 1
    ops: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    for start, count in sorted(windows.items()):
        key = f"tumb:1\u001f{start}\u001f{partition}"
        if start + WINDOW_MS <= watermark:
            items.append({"queue": sink, "partition": partition, "payload": {"count": count}})
            if start in seeded:
                ops.append({"type": "delete", "key": key})
        else:
            value = {"acc": {"count": count}, "windowStart": start, "windowEnd": start + WINDOW_MS}
            ops.append({"type": "upsert", "key": key, "value": value})
    return ops, items


async def _drive(
    http: httpx.AsyncClient, src: str, sink: str, query_id: str, args: argparse.Namespace
) -> tuple[int, int, dict[str, list[float]], float]:
    total = args.partitions * args.messages_per_partition
    group = f"streams.{src}"
    done = {"cycles": 0, "messages": 0}
    latencies: list[float] = []
    reads: list[float] = []
    pops: list[float] = []
    started = time.perf_counter()

    async def worker() -> None:
        while done["messages"] < total:
            t0 = time.perf_counter()
            answer = await http.get(
                f"/api/v1/pop/queue/{src}",
                params={
                    "batch": args.batch,
                    "partitions": 1,
                    "wait": "true",
                    "timeout": 200,
                    "consumerGroup": group,
                },
            )
            if answer.status_code == 204:
                continue
            answer.raise_for_status()
            pops.append(time.perf_counter() - t0)
            messages = answer.json()["messages"]
            pid, partition = messages[0]["partitionId"], messages[0]["partition"]
            t0 = time.perf_counter()
            got = await _post(
                http,
                "/streams/v1/state/get",
                {"query_id": query_id, "partition_id": pid, "keys": []},
            )
            reads.append(time.perf_counter() - t0)
            state = {row["key"]: row["value"] for row in got["rows"]}
            ops, items = _fold(messages, state, sink, partition)
            last = messages[-1]
            body = {
                "query_id": query_id,
                "partition_id": pid,
                "consumer_group": group,
                "state_ops": ops,
                "push_items": items,
                "ack": {
                    "transactionId": last["transactionId"],
                    "leaseId": last["leaseId"],
                    "status": "completed",
                    "count": len(messages),
                },
                "release_lease": True,
            }
            t0 = time.perf_counter()
            result = await _post(http, "/streams/v1/cycle", body)
            latencies.append(time.perf_counter() - t0)
            if not result["success"]:
                raise RuntimeError(f"cycle refused: {result}")
            done["cycles"] += 1
            done["messages"] += len(messages)

    async with trio.open_nursery() as nursery:
        for _ in range(args.workers):
            nursery.start_soon(worker)
    timings = {"pop": pops, "state/get": reads, "cycle": latencies}
    return done["cycles"], done["messages"], timings, time.perf_counter() - started


def _counted(conninfo: str, sink: str, query_id: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        emitted = conn.execute(
            """SELECT coalesce(sum((u.p::jsonb ->> 'count')::bigint), 0)
               FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
               JOIN queen.queues q ON q.id = p.queue_id, unnest(s.payloads) AS u (p)
               WHERE q.name = %s""",
            (sink,),
        ).fetchone()
        open_windows = conn.execute(
            """SELECT coalesce(sum((value -> 'acc' ->> 'count')::bigint), 0)
               FROM queen_streams.state WHERE query_id = %s::uuid""",
            (query_id,),
        ).fetchone()
    assert emitted is not None and open_windows is not None
    return int(emitted[0]) + int(open_windows[0])


async def run(args: argparse.Namespace, server: Server, db: Database) -> None:
    base_url, conninfo = server.base_url, db.conninfo
    src = f"bench-streams-{time.time_ns()}"
    sink = f"{src}-sink"
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        await _post(http, "/api/v1/configure", {"queue": src, "options": {"leaseTime": 60}})
        t0 = time.perf_counter()
        await _push(http, src, args)
        total = args.partitions * args.messages_per_partition
        print(f"pushed   {total} messages in {time.perf_counter() - t0:.1f}s")
        registered = await _post(
            http,
            "/streams/v1/queries",
            {"name": src, "source_queue": src, "sink_queue": sink, "config_hash": "bench"},
        )
        query_id = registered["query_id"]
        broker_cpu, db_cpu = server.cpu_s(), db.cpu_s()
        cycles, messages, timings, elapsed = await _drive(http, src, sink, query_id, args)
        broker_cpu = server.cpu_s() - broker_cpu
        db_used = None if db_cpu is None else (db.cpu_s() or 0.0) - db_cpu
    print(
        f"cycles   {cycles} in {elapsed:.1f}s = {cycles / elapsed:,.0f} cycles/s, "
        f"{messages / elapsed:,.0f} msg/s ({args.workers} workers, batch {args.batch}, "
        f"{args.partitions} partitions)"
    )
    for call, values in timings.items():
        values.sort()
        p99 = values[max(0, int(len(values) * 0.99) - 1)] if values else 0.0
        median = statistics.median(values) if values else 0.0
        print(f"{call:9} p50 {median * 1000:6.1f} ms   p99 {p99 * 1000:6.1f} ms")
    per = 1000 / max(cycles, 1)
    db_text = "n/a" if db_used is None else f"{db_used * per:.2f} s"
    print(
        f"CPU per 1,000 cycles (each with its pop and state read): broker {broker_cpu * per:.2f} s,"
        f" PostgreSQL {db_text}"
    )
    counted = _counted(conninfo, sink, query_id)
    print(f"counted  {counted} of {total} messages exactly once: {counted == total}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--messages-per-partition", type=int, default=200)
    parser.add_argument("--events-per-window", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="queen-bench-streams-") as tmp:
        workdir = Path(tmp)
        with open_database(args.database_url, workdir) as db:
            server = start_broker(db, workers=1, workdir=workdir, name="streams")
            try:
                server.wait_ready()
                trio.run(run, args, server, db)
            finally:
                server.stop()


if __name__ == "__main__":
    main()

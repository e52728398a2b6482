"""The consume shapes over HTTP, the same requests to either server, shaped as the official JS
client's ``consume()`` with ``.batch(n)`` sends them: ``GET /api/v1/pop/queue/{queue}`` with
``batch``, ``wait=true``, ``timeout=30000`` (and ``consumerGroup`` for a group), then one
``POST /api/v1/ack/batch`` per batch naming each message by transactionId, partitionId and
leaseId.

The queue is filled first over HTTP (100 items per push, 8 pushes at a time, not measured);
then the consumers pop and ack until every message is acked by every group, and the drain is
the measured window. A consumer still waiting in a long poll when the last message is acked is
cancelled.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import trio

from bench.inproc import item, percentiles

FILL_ITEMS = 100
FILL_TASKS = 8
WAIT_MS = 30_000
DRAIN_LIMIT_S = 300.0  # a drain that takes longer is reported unfinished


@dataclass(frozen=True, slots=True)
class HttpConsume:
    """``messages`` in ``partitions``, drained by ``consumers`` consumers popping ``batch``:
    in queue mode (``groups`` 0), or in each of ``groups`` consumer groups at once."""

    name: str
    messages: int
    partitions: int
    consumers: int
    batch: int
    groups: int = 0

    def describe(self) -> str:
        text = (
            f"{self.messages:,} messages in {self.partitions:,} partitions, "
            f"{self.consumers} consumers, batch={self.batch}"
        )
        if self.groups:
            return text + f", {self.groups} consumer groups at once ({self.consumers} each)"
        return text + ", queue mode"


@dataclass(slots=True)
class Drain:
    consumed: int = 0
    pops: int = 0
    empty_pops: int = 0
    failed_acks: int = 0
    finished: bool = False
    pop_ms: list[float] = field(default_factory=list)
    ack_ms: list[float] = field(default_factory=list)


def _client(base_url: str, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=httpx.Timeout(WAIT_MS / 1000 + 30),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def fill(base_url: str, queue: str, shape: HttpConsume, tag: str) -> None:
    """Push ``shape.messages``, item ``n`` in partition ``p{n % partitions}``."""
    pushes = math.ceil(shape.messages / FILL_ITEMS)
    async with _client(base_url, FILL_TASKS) as client:

        async def pusher(worker: int) -> None:
            for k in range(worker, pushes, FILL_TASKS):
                first = k * FILL_ITEMS
                last = min(shape.messages, first + FILL_ITEMS)
                items = [item(queue, shape.partitions, n, tag) for n in range(first, last)]
                answer = await client.post("/api/v1/push", json={"items": items})
                if answer.status_code >= 300:
                    raise RuntimeError(f"fill of {queue}: {answer.status_code} {answer.text}")

        async with trio.open_nursery() as nursery:
            for worker in range(FILL_TASKS):
                nursery.start_soon(pusher, worker)


def _failed(answer: Any) -> int:
    """Acks an answer to /api/v1/ack/batch reports as not done."""
    rows = answer if isinstance(answer, list) else (answer or {}).get("results") or []
    return sum(1 for r in rows if isinstance(r, dict) and r.get("success") is False)


async def _consumer(
    client: httpx.AsyncClient,
    path: str,
    group: str | None,
    total: int,
    state: Drain,
    done: trio.Event,
) -> None:
    while state.consumed < total:
        t0 = time.perf_counter()
        answer = await client.get(path)
        t1 = time.perf_counter()
        state.pop_ms.append((t1 - t0) * 1000)
        state.pops += 1
        if answer.status_code == 204 or not answer.content:
            state.empty_pops += 1
            continue
        answer.raise_for_status()
        messages = answer.json().get("messages") or []
        if not messages:
            state.empty_pops += 1
            continue
        acks = [
            {
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "leaseId": m.get("leaseId"),
                "status": "completed",
                "error": None,
            }
            for m in messages
        ]
        reply = await client.post(
            "/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": group}
        )
        state.ack_ms.append((time.perf_counter() - t1) * 1000)
        reply.raise_for_status()
        failed = _failed(reply.json())
        state.failed_acks += failed
        state.consumed += len(acks) - failed
    done.set()


async def drain(base_url: str, queue: str, shape: HttpConsume) -> dict[str, Any]:
    """Every group (or queue mode) drains the queue at once; the figures of the whole."""
    groups: list[str | None] = [f"g{k + 1}" for k in range(shape.groups)] or [None]
    states = {g: Drain() for g in groups}
    t0 = time.monotonic()
    async with _client(base_url, shape.consumers * len(groups)) as client:
        with trio.move_on_after(DRAIN_LIMIT_S):
            async with trio.open_nursery() as nursery:
                for group in groups:
                    nursery.start_soon(_group, client, queue, group, shape, states[group])
    wall = time.monotonic() - t0
    consumed = sum(s.consumed for s in states.values())
    return {
        "messages": consumed,
        "deliveries_expected": shape.messages * len(groups),
        "finished": all(s.finished for s in states.values()),
        "pops": sum(s.pops for s in states.values()),
        "empty_pops": sum(s.empty_pops for s in states.values()),
        "failed_acks": sum(s.failed_acks for s in states.values()),
        "drain_s": wall,
        "msg_per_s": consumed / wall if wall > 0 else 0.0,
        "pop_ms": percentiles([v for s in states.values() for v in s.pop_ms]),
        "ack_ms": percentiles([v for s in states.values() for v in s.ack_ms]),
    }


async def _group(
    client: httpx.AsyncClient, queue: str, group: str | None, shape: HttpConsume, state: Drain
) -> None:
    query = f"batch={shape.batch}&wait=true&timeout={WAIT_MS}"
    if group is not None:
        query += f"&consumerGroup={quote(group)}"
    path = f"/api/v1/pop/queue/{quote(queue, safe='')}?{query}"
    done = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(shape.consumers):
            nursery.start_soon(_consumer, client, path, group, shape.messages, state, done)
        await done.wait()
        # the last batch is acked: the others may be waiting in a long poll for nothing
        nursery.cancel_scope.cancel()
    state.finished = state.consumed >= shape.messages

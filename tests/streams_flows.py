"""The official Streams SDK (queen-mq 2.6.0, ``queen.streams``) run against a live broker.

Runs in the client's own virtualenv (``.venv-client``, see ``tests/client_env.py``):
``python -I streams_flows.py <flow> <base url> <name>``. Each flow prints one line
``RESULT <json>``; ``tests/test_streams_sdk.py`` checks it. Windows use event time (a ``ts``
field in every message), so what closes when depends on the data, never on the clock.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from queen import Queen  # the official client, not this broker
from queen.streams import Stream

DEADLINE_S = 60.0
WINDOW_S = 1
PARTITIONS = ["p0", "p1", "p2", "p3"]
PER_PARTITION = 750  # 3,000 messages in all


async def until(check: Callable[[], Any], what: str) -> None:
    """Poll ``check`` until it is true, or fail after DEADLINE_S."""
    end = time.monotonic() + DEADLINE_S
    while not await check():
        if time.monotonic() > end:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


class Sink:
    """Reads a sink queue with a group of its own, acking what it reads."""

    def __init__(self, client: Queen, queue: str) -> None:
        self.client = client
        self.queue = queue
        self.seen: list[Any] = []

    async def read(self) -> list[Any]:
        while True:
            popped = await (
                self.client.queue(self.queue).group("reader").batch(500).wait(False).pop()
            )
            if not popped:
                return self.seen
            self.seen.extend(m["data"] for m in popped)
            await self.client.ack(popped, True, {"group": "reader"})


async def push_events(client: Queen, queue: str, events: dict[str, list[int]]) -> None:
    for partition, stamps in events.items():
        for start in range(0, len(stamps), 250):
            chunk = stamps[start : start + 250]
            await (
                client.queue(queue)
                .partition(partition)
                .push([{"data": {"ts": ts}} for ts in chunk])
            )


def tumbling_stream(client: Queen, src: str, sink: str) -> Stream:
    return (
        Stream.from_(client.queue(src))
        .window_tumbling(seconds=WINDOW_S, idle_flush_ms=0, event_time=lambda m: m["data"]["ts"])
        .aggregate({"count": lambda v: 1})
        .map(lambda agg, ctx: {"partition": ctx["partition"], "start": ctx["windowStart"], **agg})
        .to(client.queue(sink))
    )


async def tumbling(client: Queen, name: str, url: str) -> dict[str, Any]:
    """A count per key (the source partition) in 1 s tumbling windows over 3,000 messages,
    with the runner stopped mid-stream and started again on the same query."""
    src, sink_queue, query = f"{name}-src", f"{name}-sink", f"{name}-query"
    await client.queue(src).config({"lease_time": 2}).create()
    await client.queue(sink_queue).create()
    stamps = {p: [i * (20 + 7 * k) for i in range(PER_PARTITION)] for k, p in enumerate(PARTITIONS)}
    expected = Counter(
        (p, ts // (WINDOW_S * 1000) * WINDOW_S * 1000) for p, tss in stamps.items() for ts in tss
    )
    cut = PER_PARTITION * 6 // 10
    first = {p: tss[:cut] for p, tss in stamps.items()}
    # the last event closes every earlier window; its own window stays open
    second = {p: [*tss[cut:], tss[-1] + 10_000] for p, tss in stamps.items()}
    total = sum(len(t) for t in stamps.values())
    sink = Sink(client, sink_queue)

    await push_events(client, src, first)
    runner = await tumbling_stream(client, src, sink_queue).run(
        query_id=query, url=url, batch_size=100, max_partitions=4
    )

    async def halfway() -> bool:
        return runner.metrics()["messagesTotal"] >= total // 4

    await until(halfway, "the first runner processed a quarter of the messages")
    await runner.stop()
    first_run = runner.metrics()
    emitted_before = len(await sink.read())

    await push_events(client, src, second)
    runner = await tumbling_stream(client, src, sink_queue).run(
        query_id=query, url=url, batch_size=100, max_partitions=4
    )

    async def complete() -> bool:
        return sum(e["count"] for e in await sink.read()) >= total

    await until(complete, "every closed window reached the sink")
    await runner.stop()
    second_run = runner.metrics()
    windows: Counter[tuple[str, int]] = Counter()
    for e in sink.seen:
        windows[(e["partition"], e["start"])] += 1
    observed = {f"{p}@{s}": c for (p, s), c in sorted(_counts(sink.seen).items())}
    return {
        "total": total,
        "expected": {f"{p}@{s}": c for (p, s), c in sorted(expected.items())},
        "observed": observed,
        "windows_emitted_twice": sorted(f"{p}@{s}" for (p, s), n in windows.items() if n > 1),
        "emitted_before_restart": emitted_before,
        "first_run_messages": first_run["messagesTotal"],
        "errors": first_run["errorsTotal"] + second_run["errorsTotal"],
    }


def _counts(emits: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    out: Counter[tuple[str, int]] = Counter()
    for e in emits:
        out[(e["partition"], e["start"])] += e["count"]
    return out


def sessions_of(stamps: list[int], gap_ms: int) -> list[list[int]]:
    """Split sorted event times into sessions: a new one after a silence of gap_ms or more."""
    out: list[list[int]] = []
    for ts in stamps:
        if out and ts - out[-1][-1] < gap_ms:
            out[-1].append(ts)
        else:
            out.append([ts])
    return out


async def session(client: Queen, name: str, url: str) -> dict[str, Any]:
    """Session windows (gap 1 s, event time) per partition: count and sum of each session."""
    src, sink_queue, query = f"{name}-src", f"{name}-sink", f"{name}-query"
    await client.queue(src).create()
    await client.queue(sink_queue).create()
    stamps = {
        "u0": [0, 300, 900, 5_000, 5_200, 9_000],
        "u1": [0, 800, 1_600, 2_400, 10_000, 10_999, 30_000],
    }
    expected = {
        p: sorted((s[0], len(s), sum(s)) for s in sessions_of(tss, 1_000))
        for p, tss in stamps.items()
    }
    closers = {p: [tss[-1] + 60_000] for p, tss in stamps.items()}
    runner = await (
        Stream.from_(client.queue(src))
        .window_session(gap=1, idle_flush_ms=0, event_time=lambda m: m["data"]["ts"])
        .aggregate({"count": lambda v: 1, "sum": lambda v: v["ts"]})
        .map(lambda agg, ctx: {"partition": ctx["partition"], "start": ctx["windowStart"], **agg})
        .to(client.queue(sink_queue))
        .run(query_id=query, url=url, batch_size=3, max_partitions=2)
    )
    await push_events(client, src, stamps)
    await push_events(client, src, closers)
    sink = Sink(client, sink_queue)
    want = sum(len(v) for v in expected.values())

    async def complete() -> bool:
        return len(await sink.read()) >= want

    await until(complete, "every closed session reached the sink")
    await runner.stop()
    observed: dict[str, list[tuple[int, int, int]]] = {}
    for e in sink.seen:
        observed.setdefault(e["partition"], []).append((e["start"], e["count"], e["sum"]))
    return {
        "expected": expected,
        "observed": {p: sorted(v) for p, v in observed.items()},
        "errors": runner.metrics()["errorsTotal"],
    }


async def config_hash(client: Queen, name: str, url: str) -> dict[str, Any]:
    """A changed operator chain under the same query id is refused unless reset."""
    src, query = f"{name}-src", f"{name}-query"
    await client.queue(src).create()
    out: dict[str, Any] = {}
    first = await Stream.from_(client.queue(src)).map(lambda v: v).run(query_id=query, url=url)
    await first.stop()
    try:
        changed = await (
            Stream.from_(client.queue(src))
            .map(lambda v: v)
            .filter(lambda v: True)
            .run(query_id=query, url=url)
        )
        await changed.stop()
        out["refused"] = False
    except Exception as exc:  # the SDK's StreamsConfigHashMismatch
        out["refused"] = True
        out["error"] = str(exc)
        out["error_type"] = type(exc).__name__
    reset = await (
        Stream.from_(client.queue(src))
        .map(lambda v: v)
        .filter(lambda v: True)
        .run(query_id=query, url=url, reset=True)
    )
    await reset.stop()
    out["reset_accepted"] = True
    return out


FLOWS = {"tumbling": tumbling, "session": session, "config_hash": config_hash}


async def main(flow: str, url: str, name: str) -> None:
    async with Queen(url) as client:
        result = await FLOWS[flow](client, name, url)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

"""The official client's side of the import check (tests/import_original.py), run in the
client's own virtualenv: ``python -I import_client.py fill|drain <base url> <state file>``.

``fill`` (against the original): create three queues, push ``PER_PARTITION`` numbered
messages to each of their partitions, then consume part of them: queue mode and two named
groups ack some, queue mode leaves one batch leased, a group dead-letters messages by
nacking them past the retry limit, and a group subscribed ``new`` sees only later pushes.
It writes what it pushed and what each group completed to the state file.

``drain`` (against this broker, after the import): pop everything each group still has,
acking as it goes, and the dead letters; it adds them to the state file. The caller compares.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from queen import Queen  # the official client

QUEUES = {"imp-orders": 10, "imp-events": 6, "imp-audit": 4}  # 20 partitions
PER_PARTITION = 1000
GROUPS = {
    "imp-orders": [None, "billing"],  # None: queue mode
    "imp-events": [None, "analytics"],
    "imp-audit": ["late"],
}


async def pop_some(builder: Any) -> list[dict[str, Any]]:
    """Pop until something comes (the original finds a partition's new messages through a
    lookup table it refreshes after commits, so a pop right after a push may see none)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        got: list[dict[str, Any]] = await builder.pop()
        if got or asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(0.2)


def key(m: dict[str, Any]) -> str:
    return f"{m['data']['q']}/{m['data']['p']}"


async def fill(client: Queen, state: dict[str, Any]) -> None:
    for q in QUEUES:
        await (
            client.queue(q)
            .config({"lease_time": 600, "retry_limit": 1, "retry_delay": 0, "priority": 3})
            .create()
        )
    pushed: dict[str, list[int]] = {}
    for q, parts in QUEUES.items():
        for i in range(parts):
            p = f"p{i}"
            numbers = list(range(PER_PARTITION))
            for start in range(0, PER_PARTITION, 500):
                chunk = numbers[start : start + 500]
                await (
                    client.queue(q)
                    .partition(p)
                    .push([{"data": {"q": q, "p": p, "n": n}} for n in chunk])
                )
            pushed[f"{q}/{p}"] = numbers
    # 'late' subscribes to imp-audit with mode new before anything new is pushed.
    first = (
        await client.queue("imp-audit")
        .group("late")
        .subscription_mode("new")
        .batch(10)
        .wait(False)
        .pop()
    )
    completed: dict[str, dict[str, list[int]]] = {}
    leased: dict[str, dict[str, list[int]]] = {}
    dead: dict[str, list[str]] = {}

    def done(group: str, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            completed.setdefault(group, {}).setdefault(key(m), []).append(m["data"]["n"])

    for m in first:  # a 'new' subscriber sees nothing pushed before its first pop
        raise RuntimeError(f"late got an old message: {m['data']}")
    for i in range(4):
        p = f"p{i}"
        more = list(range(PER_PARTITION, PER_PARTITION + 25))
        await (
            client.queue("imp-audit")
            .partition(p)
            .push([{"data": {"q": "imp-audit", "p": p, "n": n}} for n in more])
        )
        pushed[f"imp-audit/{p}"] += more

    for q in ("imp-orders", "imp-events"):
        for group in GROUPS[q]:
            name = group or "__QUEUE_MODE__"
            for _ in range(12):
                b = client.queue(q).batch(150).wait(False)
                if group:
                    b = b.group(group)
                got = await b.pop()
                if not got:
                    break
                await client.ack(got, True, {"group": group} if group else None)
                done(name, got)
    # Queue mode on imp-orders: one more batch leased, never acked.
    got = await pop_some(client.queue("imp-orders").batch(40).wait(False))
    for m in got:
        leased.setdefault("__QUEUE_MODE__", {}).setdefault(key(m), []).append(m["data"]["n"])
    # analytics dead-letters messages of imp-events by nacking them past the retry limit
    # (1): the same message, delivered again, fails a second time.
    seen = completed.get("analytics", {})
    open_parts = [
        f"p{i}"
        for i in range(QUEUES["imp-events"])
        if len(seen.get(f"imp-events/p{i}", [])) < PER_PARTITION
    ]
    for p in open_parts[:3]:
        for _ in range(2):
            [m] = await pop_some(
                client.queue("imp-events").partition(p).group("analytics").batch(1).wait(False)
            )
            answer = await client.ack(m, False, {"group": "analytics", "error": "gave up"})
        if not answer.get("dlq"):
            raise RuntimeError(f"{m['data']} was not dead-lettered: {answer}")
        dead.setdefault("analytics", []).append(f"{key(m)}#{m['data']['n']}")
    # late consumes part of what it subscribed to.
    got = await pop_some(client.queue("imp-audit").group("late").batch(30).wait(False))
    await client.ack(got, True, {"group": "late"})
    done("late", got)
    state.update(pushed=pushed, completed=completed, leased=leased, dead=dead)


async def drain(client: Queen, state: dict[str, Any]) -> None:
    after: dict[str, dict[str, list[int]]] = {}
    for q, groups in GROUPS.items():
        for group in groups:
            name = group or "__QUEUE_MODE__"
            while True:
                b = client.queue(q).batch(500).wait(False)
                if group:
                    b = b.group(group)
                got = await b.pop()
                if not got:
                    break
                await client.ack(got, True, {"group": group} if group else None)
                for m in got:
                    after.setdefault(name, {}).setdefault(key(m), []).append(m["data"]["n"])
    dlq = await client.queue("imp-events").dlq("analytics").limit(100).get()
    state["after"] = after
    state["dlq_after"] = sorted(
        f"{m['data']['q']}/{m['data']['p']}#{m['data']['n']}" for m in dlq["messages"]
    )


async def run(mode: str, url: str, state: dict[str, Any]) -> None:
    async with Queen(url) as client:
        await (fill if mode == "fill" else drain)(client, state)


def main(mode: str, url: str, path: str) -> None:
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        state = {}
    asyncio.run(run(mode, url, state))
    with open(path, "w") as f:
        json.dump(state, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])

"""Everyday flows of the official client (queen-mq 2.6.0), run against a live broker.

This file runs in the client's own virtualenv (``.venv-client``, see ``tests/client_env.py``),
never in the broker's: ``python -I client_flows.py <flow> <base url> <queue>``. Each flow
prints one line ``RESULT <json>`` with what it observed; ``tests/test_official_client.py``
checks it. The client is used exactly as its documentation shows, with no knowledge of this
broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

from queen import Queen  # the official client, not this broker

TRACE = str(uuid.uuid4())


def ids(messages: list[dict[str, Any]]) -> list[Any]:
    return [m["data"] for m in messages]


async def basics(client: Queen, q: str) -> dict[str, Any]:
    """create, push (duplicate, traceId dropped), pop, ack, nack, DLQ, namespace pop, delete."""
    out: dict[str, Any] = {}
    created = (
        await client.queue(q)
        .namespace(f"ns-{q}")
        .config({"lease_time": 30, "retry_limit": 1, "retry_delay": 0})
        .create()
    )
    out["created"] = {k: created[k] for k in ("configured", "queue", "namespace")}
    out["created_options"] = {
        k: created["options"][k] for k in ("leaseTime", "retryLimit", "retryDelay", "priority")
    }
    pushed = await client.queue(q).push(
        [
            {"data": {"n": 1}, "transactionId": "tx-1", "traceId": TRACE},
            {"data": {"n": 2}, "transactionId": "tx-2"},
            {"data": {"n": 3}, "transactionId": "tx-3"},
        ]
    )
    again = await client.queue(q).push([{"data": {"n": 1}, "transactionId": "tx-1"}])
    out["push_statuses"] = [r["status"] for r in pushed] + [r["status"] for r in again]

    first = await client.queue(q).batch(2).wait(False).pop()
    out["first_pop"] = ids(first)
    out["first_fields"] = {
        k: first[0].get(k)
        for k in ("transactionId", "traceId", "producerSub", "queue", "partition", "retryCount")
    }
    out["created_at_z"] = first[0]["createdAt"].endswith("Z")
    out["lease_shared"] = first[0]["leaseId"] == first[1]["leaseId"] != ""
    out["ack_single"] = (await client.ack(first[0], True))["success"]
    out["ack_batch"] = (await client.ack([first[1]], True))["success"]

    [third] = await client.queue(q).batch(1).wait(False).pop()
    out["nack"] = (await client.ack(third, False, {"error": "first failure"}))["success"]
    [again_third] = await client.queue(q).batch(1).wait(False).pop()
    out["redelivered"] = [again_third["data"], again_third["retryCount"]]
    await client.ack(again_third, False, {"error": "second failure"})
    out["after_dlq"] = ids(await client.queue(q).batch(5).wait(False).pop())
    dlq = await client.queue(q).dlq().limit(10).get()
    out["dlq_total"] = dlq["total"]
    out["dlq"] = [(m["data"], m["errorMessage"], m["retryCount"]) for m in dlq["messages"]]

    await client.queue(q).partition("side").push([{"data": "by namespace"}])
    out["namespace_pop"] = ids(await client.queue().namespace(f"ns-{q}").wait(False).pop())
    out["deleted"] = (await client.queue(q).delete())["deleted"]
    out["pop_after_delete"] = await client.queue(q).wait(False).pop()
    return out


async def consume_batches(client: Queen, q: str) -> dict[str, Any]:
    """consume() with its default autopilot (lists, one ack/batch each), then .batch(5)."""
    out: dict[str, Any] = {}
    for name in ("auto", "five"):
        queue = f"{q}-{name}"
        for p in range(3):
            await (
                client.queue(queue)
                .partition(f"p{p}")
                .push([{"data": {"p": p, "n": n}} for n in range(10)])
            )
        seen: list[dict[str, Any]] = []
        shapes: set[str] = set()

        async def handler(
            batch: Any, seen: list[dict[str, Any]] = seen, shapes: set[str] = shapes
        ) -> None:
            shapes.add(type(batch).__name__)
            seen.extend(m["data"] for m in (batch if isinstance(batch, list) else [batch]))

        builder = client.queue(queue).limit(30)
        if name == "five":
            builder = builder.batch(5)
        await asyncio.wait_for(builder.consume(handler), 30)
        per_partition: dict[int, list[int]] = {}
        for item in seen:
            per_partition.setdefault(item["p"], []).append(item["n"])
        out[name] = {
            "count": len(seen),
            "in_order": all(v == list(range(10)) for v in per_partition.values()),
            "partitions": sorted(per_partition),
            "shapes": sorted(shapes),
            "left": len(await client.queue(queue).batch(50).wait(False).pop()),
        }
    return out


async def consume_each_nack(client: Queen, q: str) -> dict[str, Any]:
    """.each(): one ack per message; a nack makes the client skip the rest of the partition,
    and the broker redelivers them. Then a handler that always fails drains into the DLQ."""
    await client.queue(q).config({"retry_delay": 0, "retry_limit": 1}).create()
    await client.queue(q).partition("p").push([{"data": n} for n in range(5)])
    calls: list[list[Any]] = []
    failed_once: set[int] = set()

    async def handler(message: dict[str, Any]) -> None:
        calls.append([message["data"], message["retryCount"]])
        if message["data"] == 2 and 2 not in failed_once:
            failed_once.add(2)
            raise RuntimeError("transient")

    await asyncio.wait_for(client.queue(q).each().limit(6).consume(handler), 30)
    left = await client.queue(q).wait(False).pop()

    poison = f"{q}-poison"
    await client.queue(poison).config({"retry_delay": 0, "retry_limit": 1}).create()
    await client.queue(poison).push([{"data": "bad"}, {"data": "good"}])
    handled: list[Any] = []

    async def picky(message: dict[str, Any]) -> None:
        handled.append(message["data"])
        if message["data"] == "bad":
            raise ValueError("cannot handle it")

    await asyncio.wait_for(client.queue(poison).each().limit(3).consume(picky), 30)
    dlq = await client.queue(poison).dlq().get()
    return {
        "calls": calls,
        "left": left,
        "poison_handled": handled,
        "dlq": [(m["data"], m["errorMessage"]) for m in dlq["messages"]],
    }


async def groups(client: Queen, q: str) -> dict[str, Any]:
    """Fan-out to two groups, subscription "new", and the consumer-group admin calls."""
    out: dict[str, Any] = {}
    await client.queue(q).push([{"data": "old-1"}, {"data": "old-2"}])
    for group in ("g1", "g2"):
        got = await client.queue(q).group(group).batch(10).wait(False).pop()
        out[group] = ids(got)
        await client.ack(got, True, {"group": group})
    out["g1_again"] = await client.queue(q).group("g1").wait(False).pop()
    late = f"late-{q}"
    out["new_before"] = await client.queue(q).group(late).subscription_mode("new").wait(False).pop()
    await client.queue(q).push([{"data": "fresh"}])
    got = await client.queue(q).group(late).subscription_mode("new").batch(10).wait(False).pop()
    out["new_after"] = ids(got)
    out["g1_sees_fresh"] = ids(await client.queue(q).group("g1").batch(10).wait(False).pop())

    replay = f"replay-{q}"
    first = await client.queue(q).group(replay).batch(10).wait(False).pop()
    await client.ack(first, True, {"group": replay})
    moved = await client.update_consumer_group_timestamp(replay, "2000-01-01T00:00:00Z")
    out["timestamp_update"] = [moved["success"], moved["rowsUpdated"]]
    out["replayed"] = ids(await client.queue(q).group(replay).batch(10).wait(False).pop())
    deleted = await client.delete_consumer_group(replay, True)
    out["group_deleted"] = [deleted["success"], deleted["deletedPartitions"]]
    return out


async def renewal(client: Queen, q: str) -> dict[str, Any]:
    """renew() directly, and renew_lease(True, ms) keeping a slow handler's lease alive."""
    await client.queue(q).config({"lease_time": 1, "retry_delay": 0}).create()
    await client.queue(q).push([{"data": "slow"}])
    [message] = await client.queue(q).wait(False).pop()
    renewed = await client.renew(message)
    out: dict[str, Any] = {
        "renew": [renewed["success"], renewed.get("renewed"), bool(renewed["newExpiresAt"])]
    }
    out["ack_direct"] = (await client.ack(message, True))["success"]

    await client.queue(q).push([{"data": "kept alive"}])
    seen_by_other: list[Any] = []

    async def slow(message: dict[str, Any]) -> None:
        await asyncio.sleep(1.6)  # longer than the 1 s lease: only renewals keep it
        seen_by_other.extend(await client.queue(q).wait(False).pop())

    await asyncio.wait_for(
        client.queue(q).batch(1).renew_lease(True, 200).limit(1).consume(slow), 30
    )
    out["other_consumer_saw"] = ids(seen_by_other)
    out["left_after_ack"] = await client.queue(q).wait(False).pop()
    return out


async def transaction(client: Queen, q: str) -> dict[str, Any]:
    """ack + push in one transaction (traceId kept); a stale ack rolls everything back."""
    out_queue, never = f"{q}-out", f"{q}-never"
    await client.queue(q).push([{"data": "in-1"}, {"data": "in-2"}])
    [message] = await client.queue(q).batch(1).wait(False).pop()
    result = (
        await client.transaction()
        .ack(message)
        .queue(out_queue)
        .push([{"data": {"done": "in-1"}, "traceId": TRACE}])
        .commit()
    )
    answer: dict[str, Any] = {
        "success": result["success"],
        "types": [r["type"] for r in result["results"]],
    }
    [moved] = await client.queue(out_queue).wait(False).pop()
    answer["moved"] = [moved["data"], moved["traceId"] == TRACE]
    await client.queue(out_queue).push([{"data": "plain", "traceId": TRACE}])
    got = await client.queue(out_queue).group(f"t-{q}").batch(5).wait(False).pop()
    answer["traces"] = [[m["data"], m["traceId"] == TRACE or m["traceId"]] for m in got]

    [second] = await client.queue(q).batch(1).wait(False).pop()
    await client.ack(second, True)  # the lease is gone now
    try:
        await client.transaction().ack(second).queue(never).push([{"data": "x"}]).commit()
        answer["stale_commit"] = "committed"
    except Exception as exc:  # the client raises when success is false
        answer["stale_commit"] = str(exc)
    answer["never"] = await client.queue(never).wait(False).pop()
    return answer


async def long_poll(client: Queen, q: str) -> dict[str, Any]:
    """A waiting pop is answered when a push arrives, well before its timeout."""

    async def later() -> None:
        await asyncio.sleep(0.3)
        await client.queue(q).push([{"data": "arrived"}])

    pusher = asyncio.create_task(later())
    started = datetime.now(UTC)
    got = await client.queue(q).wait(True).timeout_millis(20000).pop()
    waited = (datetime.now(UTC) - started).total_seconds()
    await pusher
    empty_started = datetime.now(UTC)
    empty = await client.queue(f"{q}-empty").wait(True).timeout_millis(500).pop()
    empty_waited = (datetime.now(UTC) - empty_started).total_seconds()
    return {"got": ids(got), "waited_s": waited, "empty": empty, "empty_waited_s": empty_waited}


async def authenticated(client: Queen, q: str) -> dict[str, Any]:
    """With a bearer token: the stored producerSub is the token's sub, whatever the body says."""
    await client.queue(q).create()
    pushed = await client.queue(q).push([{"data": {"n": 1}, "producerSub": "forged"}])
    got = await client.queue(q).batch(10).wait(False).pop()
    return {
        "statuses": [r["status"] for r in pushed],
        "subs": [m["producerSub"] for m in got],
        "data": ids(got),
    }


async def encrypted(client: Queen, q: str) -> dict[str, Any]:
    """An encrypted queue: push, pop, ack, a transaction push, a nack to the DLQ."""
    out_queue = f"{q}-out"
    created = await client.queue(q).config({"encryption_enabled": True, "retry_limit": 0}).create()
    await client.queue(out_queue).config({"encryption_enabled": True}).create()
    await client.queue(q).push([{"data": {"secret": "s-1"}}, {"data": {"secret": "s-2"}}])
    first, second = await client.queue(q).batch(2).wait(False).pop()
    await (
        client.transaction()
        .ack(first)
        .queue(out_queue)
        .push([{"data": {"secret": "moved"}}])
        .commit()
    )
    [moved] = await client.queue(out_queue).wait(False).pop()
    await client.ack(moved, True)
    await client.ack(second, False, {"error": "poison"})
    dlq = await client.queue(q).dlq().limit(10).get()
    return {
        "created": created["options"]["encryptionEnabled"],
        "popped": ids([first, second]),
        "moved": moved["data"],
        "dlq": [m["data"] for m in dlq["messages"]],
    }


async def retention_setup(client: Queen, q: str) -> dict[str, Any]:
    """Queues configured with retention times but retention off, and with a max wait time."""
    keep = await (
        client.queue(f"{q}-keep")
        .config(
            {"retention_enabled": False, "retention_seconds": 3, "completed_retention_seconds": 3}
        )
        .create()
    )
    wait = await client.queue(f"{q}-wait").config({"max_wait_time_seconds": 10}).create()
    for name in (f"{q}-keep", f"{q}-wait"):
        await client.queue(name).push([{"data": {"n": 1}}, {"data": {"n": 2}}])
    return {
        "keep": {k: keep["options"][k] for k in ("retentionEnabled", "retentionSeconds")},
        "wait": wait["options"]["maxWaitTimeSeconds"],
    }


async def retention_check(client: Queen, q: str) -> dict[str, Any]:
    """After the messages aged and a retention pass ran: what each queue still delivers."""
    keep = await client.queue(f"{q}-keep").batch(10).wait(False).pop()
    wait = await client.queue(f"{q}-wait").batch(10).wait(False).pop()
    return {"keep": ids(keep), "wait": ids(wait)}


async def consume_admin(client: Queen, q: str) -> dict[str, Any]:
    """subscription_mode("from_beginning"), pops without a batch, seek, deleting a group on
    one queue, and traces recorded from a consume() handler and read back."""
    out: dict[str, Any] = {}
    await client.queue(q).push([{"data": f"m{n}", "transactionId": f"tx-{n}"} for n in range(3)])
    got = (
        await client.queue(q)
        .group(f"fb-{q}")
        .subscription_mode("from_beginning")
        .batch(10)
        .wait(False)
        .pop()
    )
    out["from_beginning_pop"] = ids(got)
    seen: list[Any] = []

    async def collect(message: dict[str, Any]) -> None:
        seen.append(message["data"])

    await asyncio.wait_for(
        client.queue(q)
        .group(f"fbc-{q}")
        .subscription_mode("from_beginning")
        .batch(1)
        .limit(3)
        .consume(collect),
        30,
    )
    out["from_beginning_consume"] = seen

    single = await client.queue(q).autopilot(False).wait(False).pop()
    out["autopilot_off_pop"] = ids(single)
    await client.ack(single, True)
    out["autopilot_pop"] = ids(await client.queue(q).wait(False).pop())

    group = f"seek-{q}"
    read = await client.queue(q).group(group).batch(10).wait(False).pop()
    await client.ack(read, True, {"group": group})
    back = await client.admin.seek_consumer_group(group, q, {"timestamp": "2000-01-01T00:00:00Z"})
    out["seek_back"] = [back["success"], back["seekToEnd"], back["partitionsUpdated"]]
    again = await client.queue(q).group(group).batch(10).wait(False).pop()
    out["after_seek_back"] = ids(again)
    end = await client.admin.seek_consumer_group(group, q, {"toEnd": True})
    out["seek_end"] = [end["success"], end["seekToEnd"], end["partitionsUpdated"]]
    out["after_seek_end"] = await client.queue(q).group(group).batch(10).wait(False).pop()
    out["stale_ack"] = (await client.ack(again[0], True, {"group": group}))["success"]

    other = f"{q}-other"
    await client.queue(other).push([{"data": "o"}])
    await client.queue(other).group(group).wait(False).pop()
    deleted = await client.admin.delete_consumer_group_for_queue(group, q, True)
    out["deleted_on_queue"] = {
        k: deleted[k] for k in ("success", "consumerGroup", "queueName", "deletedPartitions")
    }
    out["reread_after_delete"] = ids(await client.queue(q).group(group).batch(10).wait(False).pop())

    traced = f"traced-{q}"
    await client.queue(traced).push([{"data": "t", "transactionId": "tx-traced"}])
    answers: list[Any] = []
    where: list[Any] = []

    async def trace_it(message: dict[str, Any]) -> None:
        where.append(message["partitionId"])
        answers.append(await message["trace"]({"traceName": f"order-{q}", "data": {"step": 1}}))
        answers.append(
            await message["trace"](
                {"traceName": [f"order-{q}", f"cust-{q}"], "eventType": "done", "data": {"n": 2}}
            )
        )

    await asyncio.wait_for(
        client.queue(traced).group("tracer").batch(1).limit(1).consume(trace_it), 30
    )
    out["trace_answers"] = [a["success"] for a in answers]
    mine = await client.admin.get_traces_for_message(where[0], "tx-traced")
    out["message_traces"] = [
        [t["event_type"], t["data"], t["consumer_group"], t["trace_names"]] for t in mine["traces"]
    ]
    named = await client.admin.get_traces_by_name(f"cust-{q}")
    out["by_name"] = [named["total"], [t["queue_name"] for t in named["traces"]]]
    names = await client.admin.get_trace_names(limit=1000)
    out["names"] = sorted(
        n["trace_name"] for n in names["trace_names"] if n["trace_name"].endswith(q)
    )
    return out


async def admin(client: Queen, q: str) -> dict[str, Any]:
    """Every read of the client's Admin API, and a message deletion, as the client makes them."""
    await client.queue(q).namespace(f"ns-{q}").create()
    await client.queue(q).push([{"data": {"n": n}, "transactionId": f"a{n}"} for n in range(3)])
    [first] = await client.queue(q).group(f"g-{q}").batch(1).wait(False).pop()
    a = client.admin
    out: dict[str, Any] = {}
    listed = await a.list_queues(search=q, limit=10)
    out["listed"] = [(x["name"], x["partitions"], x["messages"]["total"]) for x in listed["queues"]]
    queue = await a.get_queue(q)
    out["queue"] = [
        queue["name"],
        [p["name"] for p in queue["partitions"]],
        queue["totals"]["total"],
    ]
    out["namespaces"] = [n["namespace"] for n in (await a.get_namespaces())["namespaces"]]
    out["tasks"] = "tasks" in await a.get_tasks()
    out["overview_queues"] = (await a.get_overview())["queues"] >= 1
    msgs = await a.list_messages(queue=q, limit=10)
    out["messages"] = [m["transactionId"] for m in msgs["messages"]]
    pid = msgs["messages"][0]["partitionId"]
    out["message"] = (await a.get_message(pid, "a1"))["payload"]
    out["deleted"] = (await a.delete_message(pid, "a1"))["success"]
    out["status"] = "messages" in await a.get_status()
    out["queue_stats"] = [x["name"] for x in (await a.get_queue_stats(search=q))["queues"]]
    out["queue_detail"] = (await a.get_queue_detail(q))["queue"]["name"]
    out["analytics"] = "throughput" in await a.get_analytics()
    groups = await a.list_consumer_groups()
    out["group_lag"] = [g["totalLag"] for g in groups if g["name"] == f"g-{q}"]
    detail = await a.get_consumer_group(f"g-{q}")
    out["group_partitions"] = [p["offsetLag"] for p in detail[q]["partitions"]]
    lagging = await a.get_lagging_consumers(min_lag_seconds=0)
    out["lagging"] = any(g["name"] == f"g-{q}" for g in lagging)
    out["refresh"] = (await a.refresh_consumer_stats())["success"]
    out["system_metrics"] = "points" in await a.get_system_metrics()
    out["worker_metrics"] = "throughput" in await a.get_worker_metrics()
    await a.metrics()  # Prometheus text: the client reads it as no JSON
    del first
    return out


FLOWS = {
    f.__name__: f
    for f in (
        retention_setup,
        retention_check,
        basics,
        consume_batches,
        consume_each_nack,
        groups,
        renewal,
        transaction,
        long_poll,
        authenticated,
        encrypted,
        consume_admin,
        admin,
    )
}


async def main(flow: str, url: str, queue: str) -> None:
    token = os.environ.get("FLOW_BEARER_TOKEN") or None
    async with Queen(url, bearer_token=token) as client:
        result = await FLOWS[flow](client, queue)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

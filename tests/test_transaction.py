"""POST /api/v1/transaction on the real database: acks and pushes together or not at all."""

from __future__ import annotations

import fcntl
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from queen.broker import Broker
from queen.model import PartitionKey
from queen.spool import files
from queen.storage.base import SegmentWrite
from tests.conftest import Db
from tests.consuming import Api, data_of

TRACE = "6f1d7c2e-1111-4000-8000-000000000001"


def ack_op(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    op = {
        "type": "ack",
        "transactionId": message["transactionId"],
        "partitionId": message["partitionId"],
        "status": "completed",
    }
    if message.get("leaseId"):
        op["leaseId"] = message["leaseId"]
    return {**op, **extra}


async def test_ack_and_push_commit_together(api: Api, queue: str, db: Db) -> None:
    out = f"{queue}-out"
    await api.push(queue, "p", "work")
    [message] = await api.messages(queue)
    status, body = await api.post(
        "/api/v1/transaction",
        {
            "operations": [
                ack_op(message),
                {
                    "type": "push",
                    "items": [
                        {
                            "queue": out,
                            "payload": {"r": 1},
                            "transactionId": "r1",
                            "traceId": TRACE,
                        },
                        {"queue": out, "partition": "pp", "payload": {"r": 2}},
                    ],
                },
            ],
            "requiredLeases": [message["leaseId"]],
        },
    )
    assert status == 200 and body["success"] is True
    assert uuid.UUID(body["transactionId"])
    results = body["results"]
    assert [r["index"] for r in results] == [0, 1, 2]
    assert [r["type"] for r in results] == ["ack", "push", "push"]
    assert results[0]["leaseReleased"] is True and results[0]["success"] is True
    assert (results[1]["transactionId"], results[1]["status"], results[1]["queueName"]) == (
        "r1",
        "queued",
        out,
    )
    assert results[2]["partition"] == "pp" and results[2]["partitionId"]
    assert await api.messages(queue) == []
    [delivered] = await api.messages(out, "Default")
    assert (delivered["data"], delivered["traceId"], delivered["id"]) == (
        {"r": 1},
        TRACE,
        results[1]["messageId"],
    )
    frames = await db.frames(out, "Default")
    assert frames[0]["trace"] == TRACE


async def test_a_failing_ack_rolls_back_the_push(api: Api, queue: str, db: Db) -> None:
    out = f"{queue}-out"
    await api.push(queue, "p", "a", "b")
    batch = await api.messages(queue, batch=2)
    status, body = await api.post(
        "/api/v1/transaction",
        {
            "operations": [
                ack_op(batch[0]),
                {"type": "push", "items": [{"queue": out, "payload": 1}]},
                ack_op(batch[1], leaseId=str(uuid.uuid4())),
            ],
            "requiredLeases": [],
        },
    )
    assert status == 200 and body["success"] is False
    assert body["error"] == "ACK operation failed: Invalid or expired lease"
    assert [r["success"] for r in body["results"]] == [False, False, False]
    assert body["results"][2]["error"] == "Invalid or expired lease"
    assert await db.value("SELECT count(*) FROM queen.queues WHERE name = %s", out) == 0
    row = await db.rows(
        """SELECT c.next_offset, c.lease_id IS NOT NULL FROM queen.cursors c
           JOIN queen.queues q ON q.id = c.queue_id WHERE q.name = %s""",
        queue,
    )
    assert row == [(0, True)]  # the first ack was rolled back too
    assert all(r["success"] for r in await api.ack_batch(batch))


async def test_a_required_lease_that_is_not_live_fails_the_transaction(
    api: Api, queue: str, db: Db
) -> None:
    out = f"{queue}-out"
    status, body = await api.post(
        "/api/v1/transaction",
        {
            "operations": [{"type": "push", "items": [{"queue": out, "payload": 1}]}],
            "requiredLeases": [str(uuid.uuid4())],
        },
    )
    assert status == 200 and body["success"] is False
    assert "is not live" in body["error"]
    assert await db.count_frames(out) == 0


async def test_acks_without_lease_ids_act_under_the_required_leases_holding_them(
    api: Api, queue: str, db: Db
) -> None:
    """The JS client's transaction sends its acks without lease ids and the leases in
    ``requiredLeases``: two pops, two leases, one transaction."""
    await api.push(queue, "a", "one")
    await api.push(queue, "b", "two")
    [first] = await api.messages(queue, "a")
    [second] = await api.messages(queue, "b")
    assert first["leaseId"] != second["leaseId"]
    bare = [{k: v for k, v in ack_op(m).items() if k != "leaseId"} for m in (first, second)]

    # without the leases named, nobody may judge messages another consumer holds
    status, body = await api.post("/api/v1/transaction", {"operations": bare})
    assert status == 200 and body["success"] is False
    assert body["results"][0]["error"] == "Lease required: the partition is leased"

    status, body = await api.post(
        "/api/v1/transaction",
        {"operations": bare, "requiredLeases": [second["leaseId"], first["leaseId"]]},
    )
    assert status == 200 and body["success"] is True, body
    assert [r["leaseReleased"] for r in body["results"]] == [True, True]
    assert await api.messages(queue) == []


async def test_trace_ids_are_stored_only_by_transactions(api: Api, queue: str) -> None:
    status, _ = await api.post(
        "/api/v1/push", {"items": [{"queue": queue, "payload": "plain", "traceId": TRACE}]}
    )
    assert status == 201
    await api.post(
        "/api/v1/transaction",
        {
            "operations": [
                {"type": "push", "items": [{"queue": queue, "payload": "tx", "traceId": TRACE}]}
            ]
        },
    )
    got = await api.messages(queue, batch=5)
    assert [(m["data"], m["traceId"]) for m in got] == [("plain", None), ("tx", TRACE)]


async def test_a_duplicate_is_a_result_not_a_failure(api: Api, queue: str) -> None:
    [original] = await api.push(queue, "Default", "first", tx=["dup"])
    status, body = await api.post(
        "/api/v1/transaction",
        {
            "operations": [
                {
                    "type": "push",
                    "items": [
                        {"queue": queue, "payload": "again", "transactionId": "dup"},
                        {"queue": queue, "payload": "new", "transactionId": "other"},
                        {"queue": queue, "payload": "new twice", "transactionId": "other"},
                    ],
                }
            ]
        },
    )
    assert status == 200 and body["success"] is True
    statuses = [(r["status"], r["success"]) for r in body["results"]]
    assert statuses == [("duplicate", True), ("queued", True), ("duplicate", True)]
    assert body["results"][0]["messageId"] == original["message_id"]
    assert body["results"][2]["messageId"] == body["results"][1]["messageId"]
    assert data_of(await api.messages(queue, batch=5)) == ["first", "new"]


async def test_a_failed_ack_in_a_transaction_counts_a_retry(api: Api, queue: str) -> None:
    await api.configure(queue, retryDelay=0)
    await api.push(queue, "p", "x")
    [message] = await api.messages(queue)
    status, body = await api.post(
        "/api/v1/transaction", {"operations": [ack_op(message, status="failed")]}
    )
    assert status == 200 and body["success"] is True and body["results"][0]["leaseReleased"] is True
    [again] = await api.messages(queue)
    assert again["retryCount"] == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"operations": []}, "operations array cannot be empty"),
        ({"operations": [{"type": "push", "items": [{"payload": 1}]}]}, "queue is required"),
        (
            {
                "operations": [
                    {
                        "type": "push",
                        "items": [{"queue": "q", "payload": 1, "traceId": "v7-or-junk"}],
                    }
                ]
            },
            "traceId must be a UUID",
        ),
        ({"operations": [{"type": "ack", "partitionId": "1"}]}, "transactionId is required"),
        ({"operations": [{"type": "nope"}]}, "type must be"),
        ({"operations": "x"}, "operations array is required"),
    ],
)
async def test_bad_transactions_are_a_400_and_store_nothing(
    api: Api, db: Db, body: dict[str, Any], message: str
) -> None:
    before = await db.count_frames()
    status, answer = await api.post("/api/v1/transaction", body)
    assert status == 400 and message in answer["error"]
    assert await db.count_frames() == before


async def test_embedding_api_transaction(broker: Broker, queue: str) -> None:
    await broker.push([{"queue": queue, "payload": "in"}])
    popped = await broker.pop(queue)
    answer = await broker.transaction(
        popped.messages,
        [{"queue": f"{queue}-out", "payload": "out", "traceId": TRACE}],
        producer_sub="svc",
    )
    assert answer.success is True
    out = await broker.pop(f"{queue}-out")
    assert [(m.data, m.trace_id, m.producer_sub) for m in out.messages] == [("out", TRACE, "svc")]


async def _eventually(condition: Any, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until ``condition()`` holds; each look is a short real-time step,
    since the database works in other threads and processes."""
    with trio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110 (no event to wait on across threads)
            await trio.sleep(0.01)


def _tx_push(queue: str, partition: str, tx: str) -> list[dict[str, Any]]:
    items = [{"queue": queue, "partition": partition, "payload": tx, "transactionId": tx}]
    return [{"type": "push", "items": items}]


def hold_writes(broker: Broker) -> trio.Event:
    """From now on the broker's segment writes wait at the returned gate until it is set."""
    gate = trio.Event()
    real = broker.store.write_segments

    async def held(writes: list[SegmentWrite]) -> Any:
        await gate.wait()
        return await real(writes)

    broker.store.write_segments = held  # type: ignore[method-assign]
    return gate


async def test_transaction_push_waits_for_the_partition_actors_write(
    broker: Broker, queue: str, db: Db
) -> None:
    """A transaction pushing to a partition takes its turn behind the partition actor's write
    in flight: the partition keeps one writer, and offsets follow arrival order."""
    first = [{"queue": queue, "partition": "p", "payload": 0, "transactionId": "warm"}]
    await broker.push(first)
    actor = broker.supervisor.actor(PartitionKey(queue, "p"))
    assert actor is not None
    gate = hold_writes(broker)
    done: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:

        async def live() -> None:
            item = {"queue": queue, "partition": "p", "payload": 1, "transactionId": "live"}
            done["live"] = await broker.push([item])

        async def transaction() -> None:
            done["tx"] = await broker.transaction(push=_tx_push(queue, "p", "tx")[0]["items"])

        nursery.start_soon(live)
        await trio.testing.wait_all_tasks_blocked()  # the live write waits at the gate
        nursery.start_soon(transaction)
        # Either the transaction queued behind the actor's write, or (a second writer) it
        # went ahead and committed.
        await _eventually(lambda: actor.pending > 0 or "tx" in done)
        gate.set()
    assert done["tx"].success is True and done["live"][0].status == "queued"
    frames = await db.frames(queue, "p")
    assert [(f["offset"], f["transaction_id"]) for f in frames] == [
        (0, "warm"),
        (1, "live"),
        (2, "tx"),
    ]


@pytest.mark.parametrize("writer", ["consume.transaction", "streams.cycle"])
async def test_the_public_services_cannot_write_around_the_partition_actor(
    broker: Broker, api: Api, queue: str, db: Db, writer: str
) -> None:
    """The services an embedding program reaches (``broker.consume``, ``broker.streams``)
    hold the partition's actor for their writes themselves: called directly, with typed
    requests, a transaction or a cycle pushing to a partition still waits for the actor's
    write in flight, and lands after it."""
    from queen.consume.requests import transaction_request
    from queen.streams.requests import cycle_request

    sink = f"{queue}-sink"
    await broker.push([{"queue": sink, "partition": "p", "payload": 0, "transactionId": "warm"}])
    actor = broker.supervisor.actor(PartitionKey(sink, "p"))
    assert actor is not None
    if writer == "streams.cycle":
        status, registered = await api.post(
            "/streams/v1/queries",
            {"name": f"q-{queue}", "source_queue": queue, "sink_queue": sink, "config_hash": "h"},
        )
        assert status == 200, registered
        await api.push(queue, "src", 1)
        [message] = await api.messages(queue, "src")
    gate = hold_writes(broker)
    item = {"queue": sink, "partition": "p", "payload": "w", "transactionId": "written"}
    done: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:

        async def live() -> None:
            live_item = {"queue": sink, "partition": "p", "payload": 1, "transactionId": "live"}
            done["live"] = await broker.push([live_item])

        async def write() -> None:
            if writer == "consume.transaction":
                request = transaction_request({"operations": [{"type": "push", "items": [item]}]})
                done["write"] = (await broker.consume.transaction(request)).success
            else:
                request = cycle_request(
                    {
                        "query_id": registered["query_id"],
                        "partition_id": message["partitionId"],
                        "consumer_group": None,
                        "state_ops": [],
                        "push_items": [item],
                        "ack": {
                            "transactionId": message["transactionId"],
                            "leaseId": message["leaseId"],
                            "status": "completed",
                        },
                    }
                )
                done["write"] = (await broker.streams.cycle(request, None)).success

        nursery.start_soon(live)
        await trio.testing.wait_all_tasks_blocked()  # the live write waits at the gate
        nursery.start_soon(write)
        await _eventually(lambda: actor.pending > 0 or "write" in done)
        gate.set()
    assert done["write"] is True and done["live"][0].status == "queued"
    frames = await db.frames(sink, "p")
    assert [(f["offset"], f["transaction_id"]) for f in frames] == [
        (0, "warm"),
        (1, "live"),
        (2, "written"),
    ]


async def test_transaction_push_keeps_its_place_behind_spooled_messages(
    broker: Broker, api: Api, queue: str, db: Db
) -> None:
    """While a partition has spooled messages, a transaction pushing to it is refused (503,
    nothing applied) instead of overtaking them; once they are replayed it goes through."""
    await broker.set_maintenance(True)
    [spooled] = await broker.push(
        [{"queue": queue, "partition": "p", "payload": 0, "transactionId": "spooled"}]
    )
    assert spooled.status == "buffered"
    status, body = await api.post("/api/v1/transaction", {"operations": _tx_push(queue, "p", "a")})
    assert status == 503 and "maintenance" in body["error"]
    lock = os.open(
        Path(broker.settings.file_buffer_dir) / files.REPLAY_LOCK, os.O_RDWR | os.O_CREAT
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the replay cannot run yet
        await broker.set_maintenance(False)
        status, body = await api.post(
            "/api/v1/transaction", {"operations": _tx_push(queue, "p", "b")}
        )
        assert status == 503 and "replay" in body["error"]
        assert await db.frames(queue, "p") == []
        assert broker.metrics.transactions_refused == 2
    finally:
        os.close(lock)
    assert broker.spool is not None
    await _eventually(lambda: broker.spool is not None and broker.spool.index.total == 0)
    status, body = await api.post("/api/v1/transaction", {"operations": _tx_push(queue, "p", "c")})
    assert status == 200 and body["success"] is True
    assert [f["transaction_id"] for f in await db.frames(queue, "p")] == ["spooled", "c"]

"""POST /api/v1/traces and the trace reads, on the real database; traces and retention."""

from __future__ import annotations

import json
from typing import Any

import pytest

from queen.broker import Broker
from tests.conftest import Db
from tests.consuming import Api, age_messages


async def pushed_message(api: Api, queue: str, partition: str = "p", tx: str = "tx-1") -> str:
    """Push one message and pop it; its partitionId."""
    await api.push(queue, partition, {"n": 1}, tx=[tx])
    [message] = await api.messages(queue, partition)
    return str(message["partitionId"])


async def trace(api: Api, body: dict[str, Any]) -> tuple[int, Any]:
    return await api.post("/api/v1/traces", body)


async def test_traces_are_recorded_with_defaults_and_read_back(api: Api, queue: str) -> None:
    pid = await pushed_message(api, queue)
    status, answer = await trace(api, {"transactionId": "tx-1", "partitionId": pid, "data": None})
    assert status == 201 and answer["success"] is True and answer["traceId"]
    status, _ = await trace(
        api,
        {
            "transactionId": "tx-1",
            "partitionId": pid,
            "consumerGroup": "billing",
            "eventType": "processed",
            "traceNames": f"order-{queue}",
            "data": {"step": 2},
        },
    )
    assert status == 201
    status, _ = await trace(
        api,
        {
            "transactionId": "tx-1",
            "partitionId": pid,
            "traceNames": [f"order-{queue}", f"cust-{queue}", f"order-{queue}"],
            "data": [3],
        },
    )
    assert status == 201

    status, body = await api.get(f"/api/v1/traces/{pid}/tx-1")
    assert status == 200
    got = [
        (t["event_type"], t["data"], t["consumer_group"], t["trace_names"]) for t in body["traces"]
    ]
    assert got == [
        ("info", None, "__QUEUE_MODE__", []),
        ("processed", {"step": 2}, "billing", [f"order-{queue}"]),
        ("info", [3], "__QUEUE_MODE__", sorted([f"cust-{queue}", f"order-{queue}"])),
    ]
    assert all(t["created_at"].endswith("Z") and t["id"] for t in body["traces"])
    assert (await api.get(f"/api/v1/traces/{pid}/tx-other"))[1] == {"traces": []}
    assert (await api.get("/api/v1/traces/999999999999/tx-1"))[1] == {"traces": []}

    status, named = await api.get(f"/api/v1/traces/by-name/order-{queue}?limit=1")
    assert status == 200
    assert named["total"] == 2 and named["pagination"] == {"limit": 1, "offset": 0}
    [first] = named["traces"]
    assert first["event_type"] == "processed" and first["transaction_id"] == "tx-1"
    assert (first["queue_name"], first["partition_name"], first["partition_id"]) == (
        queue,
        "p",
        pid,
    )
    _, rest = await api.get(f"/api/v1/traces/by-name/order-{queue}?limit=5&offset=1")
    assert [t["data"] for t in rest["traces"]] == [[3]]

    status, names = await api.get("/api/v1/traces/names?limit=10000")
    assert status == 200 and names["pagination"] == {"limit": 10000, "offset": 0}
    mine = {n["trace_name"]: n for n in names["trace_names"] if n["trace_name"].endswith(queue)}
    assert {k: (v["trace_count"], v["message_count"]) for k, v in mine.items()} == {
        f"order-{queue}": (2, 1),
        f"cust-{queue}": (1, 1),
    }
    assert mine[f"cust-{queue}"]["last_seen"].endswith("Z")


async def test_a_transaction_id_with_slashes_is_read_back(api: Api, queue: str) -> None:
    pid = await pushed_message(api, queue, tx="order/91/created")
    body = {"transactionId": "order/91/created", "partitionId": pid, "data": 1}
    assert (await trace(api, body))[0] == 201
    _, read = await api.get(f"/api/v1/traces/{pid}/order/91/created")
    assert [t["data"] for t in read["traces"]] == [1]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"partitionId": "1", "data": 1}, 400, "transactionId and partitionId are required"),
        ({"transactionId": "t", "data": 1}, 400, "transactionId and partitionId are required"),
        ({"transactionId": "t", "partitionId": "P"}, 400, "data is required"),
        ({"transactionId": 5, "partitionId": "P", "data": 1}, 400, "transactionId must be a"),
        ({"transactionId": "a\x00b", "partitionId": "P", "data": 1}, 400, "control characters"),
        ({"transactionId": "t", "partitionId": [1], "data": 1}, 400, "partitionId must be"),
        ({"transactionId": "t", "partitionId": "P", "data": 1, "eventType": 3}, 400, "eventType"),
        ({"transactionId": "t", "partitionId": "P", "data": 1, "traceNames": 3}, 400, "traceNames"),
        ({"transactionId": "t", "partitionId": "P", "data": 1, "traceNames": [""]}, 400, "empty"),
        ({"transactionId": "t", "partitionId": "P", "data": 1, "traceNames": [1]}, 400, "string"),
        ({"transactionId": "t", "partitionId": "999999999999", "data": 1}, 404, "not found"),
        ({"transactionId": "t", "partitionId": "not-ours", "data": 1}, 404, "not found"),
    ],
)
async def test_bad_traces_are_refused_and_store_nothing(
    api: Api, queue: str, db: Db, body: dict[str, Any], status: int, message: str
) -> None:
    pid = await pushed_message(api, queue)
    if body.get("partitionId") == "P":
        body = {**body, "partitionId": pid}
    before = await db.value("SELECT count(*) FROM queen.traces")
    code, answer = await trace(api, body)
    assert code == status and message in answer["error"]
    assert await db.value("SELECT count(*) FROM queen.traces") == before


async def test_bad_trace_reads_are_a_400(api: Api) -> None:
    assert (await api.get("/api/v1/traces/names?limit=0"))[0] == 400
    assert (await api.get("/api/v1/traces/by-name/x?offset=-1"))[0] == 400
    assert (await api.get("/api/v1/traces/by-name/a%01b"))[0] == 400
    assert (await api.get("/api/v1/traces/not-a-partition/tx"))[0] == 404


async def test_traces_go_with_their_messages(api: Api, broker: Broker, queue: str, db: Db) -> None:
    await api.configure(queue, retentionEnabled=True, retentionSeconds=60)
    await api.push(queue, "old", "o", tx=["tx-old"])
    [old] = await api.messages(queue, "old")
    await api.push(queue, "kept", "k1", tx=["tx-k1"])
    [kept] = await api.messages(queue, "kept")
    for message in (old, kept):
        body = {"transactionId": message["transactionId"], "partitionId": message["partitionId"]}
        assert (await trace(api, {**body, "data": 1}))[0] == 201
        await api.ack(message)
    await age_messages(db, queue, 3600)  # both messages are past their retention now
    await api.push(queue, "kept", "k2", tx=["tx-k2"])
    body = {"transactionId": "tx-k2", "partitionId": kept["partitionId"]}
    assert (await trace(api, {**body, "data": 2}))[0] == 201

    outcome = await broker.run_retention_pass()
    # a pass covers every queue of the shared database: other tests' segments and traces that
    # expired meanwhile may go with these two; what this queue keeps is checked below
    assert outcome.segments >= 2 and outcome.traces >= 2
    remaining = await db.rows(
        "SELECT t.transaction_id FROM queen.traces t JOIN queen.queues q ON q.id = t.queue_id "
        "WHERE q.name = %s",
        queue,
    )
    assert remaining == [("tx-k2",)]
    assert await db.value("SELECT value FROM queen.retention_totals WHERE name = 'traces'") >= 2

    await api.delete(f"/api/v1/resources/queues/{queue}")
    assert await db.value("SELECT count(*) FROM queen.traces WHERE transaction_id = 'tx-k2'") == 0


async def test_traces_from_the_embedding_api(broker: Broker, queue: str) -> None:
    await broker.push([{"queue": queue, "payload": 1, "transactionId": "t"}])
    [message] = (await broker.pop(queue)).messages
    body = {"transactionId": "t", "partitionId": str(message.partition_id), "data": {"a": 1}}
    assert (await broker.consume.traces.record(body)).trace_id > 0
    read = await broker.consume.traces.for_message(str(message.partition_id), "t")
    assert [json.loads(t.data) for t in read.traces] == [{"a": 1}]  # stored as JSON text

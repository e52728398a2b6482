"""Acks and leases on the real database: statuses, retries into the DLQ, fencing, partial acks
as consume().each() sends them, out-of-order acks, and lease extension."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from queen.broker import Broker
from queen.consume.requests import dlq_query
from tests.conftest import Db
from tests.consuming import Api, data_of, end_retry_delays, expire_leases


async def cursor(db: Db, queue: str, group: str = "__QUEUE_MODE__") -> tuple[Any, ...]:
    rows = await db.rows(
        """SELECT c.next_offset, c.acked, c.lease_id IS NOT NULL
           FROM queen.cursors c JOIN queen.queues q ON q.id = c.queue_id
           WHERE q.name = %s AND c.consumer_group = %s""",
        queue,
        group,
    )
    return rows[0]


async def test_completed_acks_move_the_cursor_and_release_the_lease_at_the_end(
    api: Api, queue: str, db: Db
) -> None:
    await api.push(queue, "p", "a", "b", "c")
    batch = await api.messages(queue, batch=2)
    first = await api.ack(batch[0])
    assert first == {
        "index": 0,
        "transactionId": batch[0]["transactionId"],
        "success": True,
        "error": None,
        "queueName": queue,
        "partitionName": "p",
        "leaseReleased": False,
        "dlq": False,
    }
    assert await cursor(db, queue) == (1, [], True)
    assert (await api.ack(batch[1], "success"))["leaseReleased"] is True
    assert await cursor(db, queue) == (2, [], False)
    assert data_of(await api.messages(queue, batch=2)) == ["c"]


async def test_failed_acks_retry_until_the_limit_then_go_to_the_dlq(api: Api, queue: str) -> None:
    await api.configure(queue, retryLimit=2, retryDelay=0)
    await api.push(queue, "p", "poison", "next", tx=["bad", "good"])
    for attempt in range(3):
        [message] = await api.messages(queue, batch=1)
        assert (message["transactionId"], message["retryCount"]) == ("bad", attempt)
        answer = await api.ack(message, "failed", error=f"boom {attempt}")
        assert answer["success"] is True and answer["leaseReleased"] is True
        assert answer["dlq"] is (attempt == 2)
    [message] = await api.messages(queue, batch=1)
    assert message["transactionId"] == "good"
    _, dlq = await api.get(f"/api/v1/dlq?queue={queue}")
    assert dlq["total"] == 1
    entry = dlq["messages"][0]
    assert (entry["transactionId"], entry["errorMessage"], entry["retryCount"]) == (
        "bad",
        "boom 2",
        2,
    )
    assert entry["data"] == "poison"


async def test_retry_delay_holds_the_partition_after_a_failure(
    api: Api, queue: str, db: Db
) -> None:
    await api.configure(queue, retryDelay=60_000)
    await api.push(queue, "p", 1)
    [message] = await api.messages(queue)
    await api.ack(message, "failed")
    assert await api.messages(queue) == []
    await end_retry_delays(db, queue)
    [again] = await api.messages(queue)
    assert (again["id"], again["retryCount"]) == (message["id"], 1)


async def test_dlq_status_moves_the_message_at_once(api: Api, queue: str) -> None:
    await api.push(queue, "p", "x", "y")
    batch = await api.messages(queue, batch=2, consumerGroup="g")
    answer = await api.ack(batch[0], "dlq", group="g", error="unprocessable")
    assert answer["dlq"] is True and answer["leaseReleased"] is False
    assert (await api.ack(batch[1], group="g"))["leaseReleased"] is True
    _, dlq = await api.get(f"/api/v1/dlq?queue={queue}&consumerGroup=g")
    assert [(m["data"], m["retryCount"], m["consumerGroup"]) for m in dlq["messages"]] == [
        ("x", 0, "g")
    ]
    assert await api.messages(queue, consumerGroup="g") == []


async def test_retry_status_releases_without_counting(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", "once")
    [message] = await api.messages(queue)
    answer = await api.ack(message, "retry")
    assert answer["leaseReleased"] is True and answer["dlq"] is False
    [again] = await api.messages(queue)
    assert (again["id"], again["retryCount"]) == (message["id"], 0)
    assert (
        await db.value(
            "SELECT count(*) FROM queen.failures WHERE msg_offset = 0 AND partition_id = %s",
            int(message["partitionId"]),
        )
        == 0
    )


async def test_a_stale_or_foreign_lease_is_refused_and_changes_nothing(
    api: Api, queue: str, db: Db
) -> None:
    await api.push(queue, "p", "a", "b")
    batch = await api.messages(queue, batch=2)
    foreign = await api.ack(batch[0], lease=str(uuid.uuid4()))
    assert (foreign["success"], foreign["error"]) == (False, "Invalid or expired lease")
    garbage = await api.ack(batch[0], lease="not-a-lease")
    assert garbage["success"] is False and garbage["error"] == "Invalid or expired lease"
    assert await cursor(db, queue) == (0, [], True)
    await expire_leases(db, queue)
    late = await api.ack(batch[0])
    assert (late["success"], late["error"]) == (False, "Invalid or expired lease")
    again = await api.messages(queue, batch=2)
    assert [m["id"] for m in again] == [m["id"] for m in batch]
    # without a lease id, under the live lease of another pop: refused, the lease stays
    unfenced = await api.ack(again[0], lease=None)
    assert (unfenced["success"], unfenced["error"]) == (
        False,
        "Lease required: the partition is leased",
    )
    failed = await api.ack(again[0], "failed", lease=None)
    assert failed["success"] is False and failed["leaseReleased"] is False
    assert await cursor(db, queue) == (0, [], True)
    assert not await api.messages(queue, batch=2), "the holder keeps its batch"
    # once no lease is live, an ack without one is trusted (as the original server does)
    await expire_leases(db, queue)
    trusted = await api.ack(again[0], lease=None)
    assert trusted["success"] is True


async def test_unknown_messages_are_refused_per_item(api: Api, queue: str) -> None:
    await api.push(queue, "p", 1)
    [message] = await api.messages(queue)
    wrong_tx = await api.ack({**message, "transactionId": "nope"})
    assert (wrong_tx["success"], wrong_tx["error"]) == (False, "Message not found")
    foreign_partition = await api.ack({**message, "partitionId": "a2f3-uuid-of-elsewhere"})
    assert foreign_partition["error"] == "Message not found"
    other_group = await api.ack(message, group="never-popped", lease=None)
    assert other_group["error"] == "Message not found"
    assert (await api.ack(message))["success"] is True


async def test_a_nack_in_each_mode_redelivers_the_rest_of_the_partition(
    api: Api, queue: str
) -> None:
    """consume().each(): acks one by one, nacks one, skips the rest of that partition."""
    await api.configure(queue, retryDelay=0)
    await api.push(queue, "p", *range(5))
    batch = await api.messages(queue, batch=5, consumerGroup="g")
    for message in batch[:2]:
        assert (await api.ack(message, group="g"))["success"]
    nack = await api.ack(batch[2], "failed", group="g", error="handler raised")
    assert nack["leaseReleased"] is True
    again = await api.messages(queue, batch=5, consumerGroup="g")
    assert data_of(again) == [2, 3, 4]
    assert [m["retryCount"] for m in again] == [1, 0, 0]


async def test_out_of_order_acks_are_remembered(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", *range(4))
    batch = await api.messages(queue, batch=4)
    await api.ack(batch[2])
    assert await cursor(db, queue) == (0, [2], True)
    await api.ack(batch[0])
    assert await cursor(db, queue) == (1, [2], True)
    assert (await api.ack(batch[1], "retry"))["leaseReleased"] is True
    assert data_of(await api.messages(queue, batch=4)) == [1, 3]


async def test_ack_batch_answers_one_result_per_item_in_order(api: Api, queue: str) -> None:
    await api.configure(queue, retryLimit=0)
    await api.push(queue, "p", "ok", "bad", "fine")
    batch = await api.messages(queue, batch=3, consumerGroup="g")
    acks = [
        {
            "transactionId": m["transactionId"],
            "partitionId": m["partitionId"],
            "status": status,
            "error": "e" if status == "failed" else None,
            "leaseId": m["leaseId"],
        }
        for m, status in zip(batch, ["completed", "failed", "completed"], strict=True)
    ]
    acks.append(
        {
            "transactionId": "ghost",
            "partitionId": batch[0]["partitionId"],
            "status": "completed",
            "leaseId": batch[0]["leaseId"],
        }
    )
    acks.append({"transactionId": "elsewhere", "partitionId": "uuid-of-another-broker"})
    status, answer = await api.post(
        "/api/v1/ack/batch", {"acknowledgments": acks, "consumerGroup": "g"}
    )
    assert status == 200
    assert [a["index"] for a in answer] == [0, 1, 2, 3, 4]
    assert [a["success"] for a in answer] == [True, True, True, False, False]
    assert [a["dlq"] for a in answer] == [False, True, False, False, False]
    assert answer[3]["error"] == answer[4]["error"] == "Message not found"
    assert answer[2]["leaseReleased"] is True
    assert await api.messages(queue, consumerGroup="g") == []


async def test_lease_extension_with_no_body_uses_the_lease_time(
    api: Api, queue: str, db: Db
) -> None:
    await api.configure(queue, leaseTime=100)
    for name in ("p1", "p2"):
        await api.push(queue, name, name)
    status, body = await api.pop(queue, batch=10, partitions=2)
    assert status == 200
    lease = body["leaseId"]
    await db.rows(
        "UPDATE queen.cursors SET lease_expires_at = now() + interval '5 seconds' "
        "WHERE lease_id = %s",
        lease,
    )
    code, answer = await api.post(f"/api/v1/lease/{lease}/extend")
    assert code == 200 and isinstance(answer, list)
    renewal = answer[0]
    assert (renewal["success"], renewal["renewed"], renewal["error"]) == (True, 2, None)
    assert renewal["newExpiresAt"] == renewal["expiresAt"]
    expires = datetime.fromisoformat(renewal["newExpiresAt"])
    seconds_left = (expires - datetime.now(UTC)).total_seconds()
    assert 90 < seconds_left <= 101
    longer = (await api.post(f"/api/v1/lease/{lease}/extend", {"seconds": 1000}))[1][0]
    assert datetime.fromisoformat(longer["newExpiresAt"]) > expires
    shorter = (await api.post(f"/api/v1/lease/{lease}/extend", {"seconds": 1}))[1][0]
    assert shorter["newExpiresAt"] == longer["newExpiresAt"]  # never shortened

    await expire_leases(db, queue)
    expired = (await api.post(f"/api/v1/lease/{lease}/extend"))[1][0]
    assert (expired["success"], expired["error"]) == (False, "Lease already expired")
    missing = (await api.post(f"/api/v1/lease/{uuid.uuid4()}/extend"))[1][0]
    assert (missing["success"], missing["error"]) == (False, "Lease not found")
    assert await api.post("/api/v1/lease/not-a-uuid/extend") == (
        400,
        {"error": "leaseId must be a UUID"},
    )
    assert (await api.post(f"/api/v1/lease/{lease}/extend", {"seconds": "x"}))[0] == 400
    for seconds in (0, 604_801, 2**64 - 1, -(2**63)):
        assert await api.post(f"/api/v1/lease/{lease}/extend", {"seconds": seconds}) == (
            400,
            {"error": "seconds must be between 1 and 604800"},
        )


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/api/v1/ack", {"partitionId": "1", "status": "completed"}, "transactionId is required"),
        ("/api/v1/ack", {"transactionId": "t", "status": "completed"}, "partitionId is required"),
        (
            "/api/v1/ack",
            {"transactionId": "t", "partitionId": "1", "status": "nope"},
            "status must be one of",
        ),
        ("/api/v1/ack", [1], "body must be an object"),
        ("/api/v1/ack", None, "request body is empty"),
        ("/api/v1/ack/batch", {"consumerGroup": "g"}, "acknowledgments array is required"),
        (
            "/api/v1/ack/batch",
            {"acknowledgments": [{"transactionId": "t"}]},
            "acknowledgments[0].partitionId is required",
        ),
        (
            "/api/v1/ack/batch",
            {"acknowledgments": [], "consumerGroup": 7},
            "consumerGroup must be a string",
        ),
    ],
)
async def test_bad_acks_are_a_400_and_change_nothing(
    api: Api, queue: str, db: Db, path: str, body: Any, message: str
) -> None:
    await api.push(queue, "p", 1)
    [popped] = await api.messages(queue)
    status, answer = await api.post(path, body)
    assert status == 400 and message in answer["error"]
    assert await cursor(db, queue) == (0, [], True)
    assert (await api.ack(popped))["success"]


async def test_embedding_api_acks_with_statuses_and_extends(broker: Broker, queue: str) -> None:
    await broker.push([{"queue": queue, "payload": n} for n in range(2)])
    popped = await broker.pop(queue, batch=2)
    renewal = await broker.extend_lease(popped.lease_id, 30)
    assert renewal.success is True and renewal.renewed == 1 and renewal.expires_at is not None
    first, second = popped.messages
    answers = await broker.ack([first.ack("dlq", "bad"), second])
    assert [a.dlq for a in answers] == [True, False]
    page = await broker.consume.dlq(dlq_query({"queue": queue}))
    assert [m.entry.error_message for m in page.messages] == ["bad"]
    assert [m.data for m in page.messages] == [0]


def _advance_reference(start: int, done: list[int | None]) -> tuple[int, list[int]]:
    """What the cursor is after ``done`` offsets: past the run from ``start``, the rest kept."""
    pending = sorted({x for x in done if x is not None and x >= start})
    nxt = start
    while pending and pending[0] == nxt:
        pending.pop(0)
        nxt += 1
    return nxt, pending


@pytest.mark.parametrize(
    ("start", "done"),
    [
        (5, []),
        (5, [5]),
        (5, [5, 6, 7]),
        (5, [7, 6, 5]),
        (5, [5, 5, 6]),
        (5, [6, 7]),
        (5, [5, 6, 9, 10]),
        (5, [3, 4, 5]),
        (5, [4]),
        (5, [5, None, 6]),
        (0, [*range(1000), 1002]),
    ],
)
async def test_cursor_advance_moves_over_the_contiguous_run_only(
    broker: Broker, db: Db, start: int, done: list[int | None]
) -> None:
    row = (await db.rows("SELECT * FROM queen.cursor_advance(%s, %s::bigint[])", start, done))[0]
    assert (row[0], list(row[1])) == _advance_reference(start, done)

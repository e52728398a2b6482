"""GET /api/v1/dlq, DELETE /api/v1/consumer-groups/{g} and POST .../subscription."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest

from tests.conftest import Db
from tests.consuming import Api, age_messages, data_of


async def dead_letters(api: Api, queue: str, n: int, group: str | None = None) -> None:
    """Push ``n`` messages to two partitions and send each to the DLQ, in push order."""
    await api.push(queue, "p1", *[f"p1-{i}" for i in range(n // 2)])
    await api.push(queue, "p2", *[f"p2-{i}" for i in range(n - n // 2)])
    while batch := await api.messages(queue, batch=1, consumerGroup=group):
        answer = await api.ack(batch[0], "dlq", group=group, error=f"bad {batch[0]['data']}")
        assert answer["dlq"] is True


async def test_dlq_lists_newest_failure_first_with_total_and_pagination(
    api: Api, queue: str
) -> None:
    await dead_letters(api, queue, 5)
    status, page = await api.get(f"/api/v1/dlq?queue={queue}&limit=2&offset=0")
    assert status == 200
    assert page["total"] == 5 and page["pagination"] == {"limit": 2, "offset": 0}
    first = page["messages"]
    assert len(first) == 2
    entry = first[0]
    assert set(entry) >= {
        "id",
        "transactionId",
        "partitionId",
        "queue",
        "partition",
        "consumerGroup",
        "errorMessage",
        "retryCount",
        "data",
        "producerSub",
        "traceId",
        "createdAt",
        "failedAt",
    }
    assert entry["errorMessage"] == f"bad {entry['data']}"
    assert entry["failedAt"].endswith("Z") and entry["consumerGroup"] == "__QUEUE_MODE__"
    _, rest = await api.get(f"/api/v1/dlq?queue={queue}&limit=10&offset=2")
    everything = first + rest["messages"]
    assert len(everything) == 5
    stamps = [m["failedAt"] for m in everything]
    assert stamps == sorted(stamps, reverse=True)
    _, beyond = await api.get(f"/api/v1/dlq?queue={queue}&limit=10&offset=50")
    assert (beyond["messages"], beyond["total"]) == ([], 5)


async def test_dlq_filters_by_group_partition_and_time(api: Api, queue: str) -> None:
    await dead_letters(api, queue, 4)
    group = f"g-{queue}"  # the group filter spans queues: keep the name to this test
    await dead_letters(api, f"{queue}-b", 2, group=group)
    _, by_partition = await api.get(f"/api/v1/dlq?queue={queue}&partition=p2")
    assert {m["partition"] for m in by_partition["messages"]} == {"p2"}
    assert by_partition["total"] == 2
    _, by_group = await api.get(f"/api/v1/dlq?consumerGroup={group}")
    assert {m["queue"] for m in by_group["messages"]} == {f"{queue}-b"}
    future = quote((datetime.now(UTC) + timedelta(hours=1)).isoformat())
    _, none = await api.get(f"/api/v1/dlq?queue={queue}&from={future}")
    assert none["total"] == 0
    _, empty = await api.get(f"/api/v1/dlq?queue=never-{queue}")
    assert empty == {"messages": [], "total": 0, "pagination": {"limit": 100, "offset": 0}}
    assert (await api.get("/api/v1/dlq?limit=0"))[0] == 400
    assert (await api.get("/api/v1/dlq?from=yesterday"))[0] == 400


async def test_deleting_a_group_forgets_it_on_every_queue(api: Api, queue: str, db: Db) -> None:
    other = f"{queue}-2"
    for name in (queue, other):
        await api.push(name, "p", 1, 2)
    group = f"g {queue}/x"  # the client quotes it and leaves the slash as it is
    held = await api.messages(queue, batch=1, consumerGroup=group)
    await api.ack_batch(await api.messages(other, batch=2, consumerGroup=group), group=group)
    assert data_of(await api.messages(queue, batch=2, consumerGroup=f"keep-{queue}")) == [1, 2]

    status, body = await api.delete(f"/api/v1/consumer-groups/{quote(group)}?deleteMetadata=true")
    assert (status, body) == (
        200,
        {"success": True, "consumerGroup": group, "deletedPartitions": 2, "metadataDeleted": True},
    )
    assert (
        await db.value("SELECT count(*) FROM queen.cursors WHERE consumer_group = %s", group) == 0
    )
    assert (
        await db.value(
            "SELECT count(*) FROM queen.consumer_groups WHERE consumer_group = %s", group
        )
        == 0
    )
    kept = await db.value(
        "SELECT count(*) FROM queen.cursors WHERE consumer_group = %s", f"keep-{queue}"
    )
    assert kept == 1
    # the group starts over: its lease is gone and it reads from its subscription again
    again = await api.messages(queue, batch=5, consumerGroup=group)
    assert data_of(again) == [1, 2] and again[0]["leaseId"] != held[0]["leaseId"]
    stale = await api.ack(held[0], group=group)
    assert stale["success"] is False


async def test_deleting_a_group_can_keep_its_subscription(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", "old")
    await age_messages(db, queue, 60)
    late = f"late-{queue}"
    await api.messages(queue, consumerGroup=late, subscriptionMode="new")
    await api.push(queue, "p", "new")
    status, body = await api.delete(f"/api/v1/consumer-groups/{late}?deleteMetadata=false")
    assert status == 200 and body["metadataDeleted"] is False
    assert data_of(await api.messages(queue, batch=5, consumerGroup=late)) == ["new"]


async def test_subscription_update_moves_the_group_to_a_timestamp(
    api: Api, queue: str, db: Db
) -> None:
    group = f"g-{queue}"  # group-wide calls reach every queue: keep the name to this test
    await api.push(queue, "p", "a")
    await age_messages(db, queue, 3600)
    await api.push(queue, "p", "b")
    everything = await api.messages(queue, batch=5, consumerGroup=group)
    await api.ack_batch(everything, group=group)
    assert data_of(everything) == ["a", "b"]

    half_hour_ago = (datetime.now(UTC) - timedelta(minutes=30)).isoformat()
    status, body = await api.post(
        f"/api/v1/consumer-groups/{group}/subscription", {"subscriptionTimestamp": half_hour_ago}
    )
    assert status == 200
    assert body["success"] is True and body["consumerGroup"] == group
    assert body["rowsUpdated"] == 1 and body["newTimestamp"].endswith("Z")
    assert data_of(await api.messages(queue, batch=5, consumerGroup=group)) == ["b"]

    queue_id = await db.value("SELECT id FROM queen.queues WHERE name = %s", queue)
    subscribed = await db.value(
        "SELECT subscribed_at FROM queen.consumer_groups WHERE queue_id = %s AND "
        "consumer_group = %s",
        queue_id,
        group,
    )
    assert abs((subscribed - datetime.fromisoformat(half_hour_ago)).total_seconds()) < 1


@pytest.mark.parametrize(
    "body",
    [
        None,
        {},
        {"subscriptionTimestamp": ""},
        {"subscriptionTimestamp": 5},
        {"subscriptionTimestamp": "someday"},
    ],
)
async def test_subscription_update_needs_a_timestamp(api: Api, body: object) -> None:
    status, answer = await api.post("/api/v1/consumer-groups/g/subscription", body)
    assert status == 400 and "subscriptionTimestamp" in answer["error"]


async def test_bad_group_requests(api: Api) -> None:
    status, answer = await api.delete("/api/v1/consumer-groups/g?deleteMetadata=perhaps")
    assert status == 400 and "deleteMetadata" in answer["error"]
    status, answer = await api.delete("/api/v1/consumer-groups/a%01b")
    assert status == 400 and "control characters" in answer["error"]

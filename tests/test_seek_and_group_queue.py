"""POST /api/v1/consumer-groups/{g}/queues/{q}/seek (and .../partitions/{p}/seek), and
DELETE /api/v1/consumer-groups/{g}/queues/{q}, on the real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
import trio

from queen import open_broker
from queen.broker import Broker
from queen.consume import InvalidRequest, SeekTarget
from queen.settings import Settings
from tests.conftest import Db
from tests.consuming import Api, age_messages, data_of


async def cursors(db: Db, queue: str, group: str) -> int:
    return int(
        await db.value(
            "SELECT count(*) FROM queen.cursors c JOIN queen.queues q ON q.id = c.queue_id "
            "WHERE q.name = %s AND c.consumer_group = %s",
            queue,
            group,
        )
    )


# --- seek ------------------------------------------------------------------------------------


async def test_seek_to_a_timestamp_rereads_what_was_stored_from_then(
    api: Api, queue: str, db: Db
) -> None:
    group = f"g-{queue}"
    await api.push(queue, "p", "old")
    await age_messages(db, queue, 3600)
    await api.push(queue, "p", "recent-1", "recent-2")
    done = await api.messages(queue, batch=10, consumerGroup=group)
    await api.ack_batch(done, group=group)
    assert data_of(done) == ["old", "recent-1", "recent-2"]

    half_hour_ago = datetime.now(UTC) - timedelta(minutes=30)
    status, body = await api.post(
        f"/api/v1/consumer-groups/{group}/queues/{queue}/seek",
        {"timestamp": half_hour_ago.isoformat()},
    )
    assert status == 200
    assert body == {
        "success": True,
        "consumerGroup": group,
        "queueName": queue,
        "seekToEnd": False,
        "targetTimestamp": body["targetTimestamp"],
        "partitionsUpdated": 1,
    }
    assert body["targetTimestamp"].startswith(half_hour_ago.strftime("%Y-%m-%dT%H:%M"))
    assert data_of(await api.messages(queue, batch=10, consumerGroup=group)) == [
        "recent-1",
        "recent-2",
    ]
    # before everything: the whole partition again
    status, _ = await api.post(
        f"/api/v1/consumer-groups/{group}/queues/{queue}/seek",
        {"timestamp": "2000-01-01T00:00:00Z"},
    )
    assert status == 200
    assert len(await api.messages(queue, batch=10, consumerGroup=group)) == 3


async def test_seek_to_end_skips_everything_stored_so_far_on_every_partition(
    api: Api, queue: str, db: Db
) -> None:
    group = f"g-{queue}"
    await api.push(queue, "a", "a1", "a2")
    await api.messages(queue, "a", batch=1, consumerGroup=group)  # a cursor on "a" only
    await api.push(queue, "b", "b1")  # the group has never read "b"
    status, body = await api.post(
        f"/api/v1/consumer-groups/{group}/queues/{queue}/seek", {"toEnd": True}
    )
    assert status == 200
    assert body["seekToEnd"] is True and body["targetTimestamp"] is None
    assert body["partitionsUpdated"] == 2
    assert await api.messages(queue, batch=10, partitions=2, consumerGroup=group) == []
    await api.push(queue, "b", "b2")
    assert data_of(await api.messages(queue, batch=10, consumerGroup=group)) == ["b2"]
    # queue mode is a group too, and other groups are untouched
    other = await api.messages(queue, batch=10, partitions=2, consumerGroup=f"other-{queue}")
    assert sorted(data_of(other)) == ["a1", "a2", "b1", "b2"]
    status, _ = await api.post(
        f"/api/v1/consumer-groups/__QUEUE_MODE__/queues/{queue}/seek", {"toEnd": True}
    )
    assert status == 200 and await api.messages(queue, batch=10, partitions=2) == []


async def test_seek_releases_the_groups_leases_on_that_queue(api: Api, queue: str) -> None:
    group = f"g-{queue}"
    await api.push(queue, "p", 1, 2)
    held = await api.messages(queue, batch=2, consumerGroup=group)
    assert await api.messages(queue, batch=2, consumerGroup=group) == []  # leased
    status, _ = await api.post(
        f"/api/v1/consumer-groups/{group}/queues/{queue}/seek", {"timestamp": "2000-01-01T00:00Z"}
    )
    assert status == 200
    again = await api.messages(queue, batch=2, consumerGroup=group)
    assert data_of(again) == [1, 2] and again[0]["leaseId"] != held[0]["leaseId"]
    stale = await api.ack(held[0], group=group)
    assert stale["success"] is False and stale["error"] == "Invalid or expired lease"


async def test_seek_one_partition_to_its_end(api: Api, queue: str) -> None:
    group = f"g-{queue}"
    await api.push(queue, "a", "a1")
    await api.push(queue, "b", "b1")
    status, body = await api.post(
        f"/api/v1/consumer-groups/{group}/queues/{queue}/partitions/a/seek"
    )
    assert status == 200
    assert body["success"] is True and body["partitionName"] == "a"
    assert body["updated"] is True and body["cursorMovedTo"].endswith("Z")
    assert data_of(await api.messages(queue, batch=10, consumerGroup=group)) == ["b1"]
    await api.push(queue, "a", "a2")
    assert data_of(await api.messages(queue, batch=10, consumerGroup=group)) == ["a2"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (None, "body must be a JSON object"),
        ({}, "Must specify either 'toEnd': true or 'timestamp'"),
        ({"toEnd": False}, "Must specify either 'toEnd': true or 'timestamp'"),
        ({"toEnd": "yes"}, "toEnd must be true or false"),
        ({"timestamp": 5}, "timestamp must be an ISO-8601 string"),
        ({"timestamp": "last tuesday"}, "timestamp must be an ISO-8601 timestamp"),
        ([1], "body must be a JSON object"),
    ],
)
async def test_a_seek_without_a_target_is_a_400_and_moves_nothing(
    api: Api, queue: str, db: Db, body: object, message: str
) -> None:
    group = f"g-{queue}"
    await api.push(queue, "p", 1)
    status, answer = await api.post(f"/api/v1/consumer-groups/{group}/queues/{queue}/seek", body)
    assert (status, answer) == (400, {"error": message})
    assert await cursors(db, queue, group) == 0
    assert data_of(await api.messages(queue, consumerGroup=group)) == [1]


async def test_seeking_an_unknown_queue_or_partition_is_a_404(api: Api, queue: str) -> None:
    await api.push(queue, "p", 1)
    status, answer = await api.post(
        f"/api/v1/consumer-groups/g/queues/never-{queue}/seek", {"toEnd": True}
    )
    assert (status, answer) == (404, {"error": f"queue never-{queue} not found"})
    status, answer = await api.post(f"/api/v1/consumer-groups/g/queues/{queue}/partitions/q/seek")
    assert (status, answer) == (404, {"error": f"partition q not found in queue {queue}"})


async def test_seek_from_the_embedding_api(broker: Broker, queue: str) -> None:
    await broker.push([{"queue": queue, "partition": "p", "payload": n} for n in range(3)])
    answer = await broker.consume.seek("lib", queue, SeekTarget(to_end=True))
    assert answer.updated == 1 and answer.partition is None
    assert not await broker.pop(queue, consumer_group="lib")
    with pytest.raises(InvalidRequest, match="Must specify either"):
        await broker.consume.seek("lib", queue, SeekTarget(to_end=False))
    naive = datetime(2000, 1, 1)  # no zone: UTC
    back = await broker.consume.seek("lib", queue, SeekTarget(to_end=False, at=naive))
    assert back.at == datetime(2000, 1, 1, tzinfo=UTC)
    assert len((await broker.pop(queue, consumer_group="lib", batch=5)).messages) == 3


async def test_a_partition_seek_may_name_a_time(api: Api, queue: str) -> None:
    group = f"g-{queue}"
    await api.push(queue, "a", "a1")
    await api.ack_batch(await api.messages(queue, "a", consumerGroup=group), group=group)
    status, body = await api.post(
        f"/api/v1/consumer-groups/{group}/queues/{queue}/partitions/a/seek",
        {"timestamp": "2000-01-01T00:00:00Z"},
    )
    assert status == 200 and body["seekToEnd"] is False and body["updated"] is True
    assert data_of(await api.messages(queue, "a", consumerGroup=group)) == ["a1"]


async def test_seek_wakes_the_groups_waiting_pops(settings: Settings, queue: str) -> None:
    # no periodic re-check during the test: only a wake-up can answer the waiting pop
    async with open_broker(settings.with_changes(pop_recheck_ms=600_000)) as broker:
        await broker.push([{"queue": queue, "payload": n} for n in range(2)])
        done = await broker.pop(queue, consumer_group="g", batch=5)
        await broker.ack(done.messages)
        got: list[object] = []

        async def wait_for_them() -> None:
            result = await broker.pop(queue, consumer_group="g", batch=5, wait=True)
            got.extend(m.data for m in result.messages)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_for_them)
                await broker.consume.wakeups.until_waiting(1)
                target = SeekTarget(to_end=False, at=datetime(2000, 1, 1, tzinfo=UTC))
                await broker.consume.seek("g", queue, target)
        assert got == [0, 1]


# --- delete a group on one queue --------------------------------------------------------------


async def test_deleting_a_group_on_one_queue_keeps_it_elsewhere(
    api: Api, queue: str, db: Db
) -> None:
    group = f"g-{queue}"
    other = f"{queue}-2"
    for name in (queue, other):
        await api.push(name, "p1", 1)
        await api.push(name, "p2", 2)
        done = await api.messages(name, batch=5, partitions=2, consumerGroup=group)
        await api.ack_batch(done, group=group)
    await api.messages(queue, batch=5, partitions=2, consumerGroup=f"keep-{queue}")

    status, body = await api.delete(
        f"/api/v1/consumer-groups/{group}/queues/{queue}?deleteMetadata=true"
    )
    assert (status, body) == (
        200,
        {
            "success": True,
            "consumerGroup": group,
            "queueName": queue,
            "deletedPartitions": 2,
            "metadataDeleted": True,
        },
    )
    assert await cursors(db, queue, group) == 0
    assert await cursors(db, other, group) == 2
    assert await cursors(db, queue, f"keep-{queue}") == 2
    subscriptions = await db.value(
        "SELECT count(*) FROM queen.consumer_groups g JOIN queen.queues q ON q.id = g.queue_id "
        "WHERE g.consumer_group = %s",
        group,
    )
    assert subscriptions == 1  # the other queue's
    # the group starts over on this queue only
    again = await api.messages(queue, batch=5, partitions=2, consumerGroup=group)
    assert sorted(data_of(again)) == [1, 2]
    assert await api.messages(other, batch=5, partitions=2, consumerGroup=group) == []


async def test_a_group_whose_name_looks_like_a_path_is_never_confused(
    api: Api, queue: str, db: Db
) -> None:
    await api.push(queue, "p", 1)
    await api.messages(queue, consumerGroup="g")
    await api.messages(queue, consumerGroup=f"team/{queue}")
    # DELETE /consumer-groups/g/queues/<queue> is group g on that queue, never a group
    # named "g/queues/<queue>"
    status, body = await api.delete(f"/api/v1/consumer-groups/g/queues/{queue}")
    assert status == 200 and body["deletedPartitions"] == 1 and body["consumerGroup"] == "g"
    assert await cursors(db, queue, "g") == 0
    # a name with a slash, as the client sends it
    status, body = await api.delete(
        f"/api/v1/consumer-groups/{quote(f'team/{queue}')}/queues/{queue}?deleteMetadata=false"
    )
    assert status == 200 and body["consumerGroup"] == f"team/{queue}"
    assert body["deletedPartitions"] == 1 and body["metadataDeleted"] is False
    assert await cursors(db, queue, f"team/{queue}") == 0


async def test_deleting_a_group_on_an_unknown_queue_deletes_nothing(api: Api, queue: str) -> None:
    status, body = await api.delete(f"/api/v1/consumer-groups/g/queues/never-{queue}")
    assert status == 200 and body["deletedPartitions"] == 0 and body["metadataDeleted"] is False
    status, body = await api.delete(f"/api/v1/consumer-groups/g/queues/{queue}?deleteMetadata=2")
    assert status == 400 and "deleteMetadata" in body["error"]

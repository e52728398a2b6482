"""queen.consumer_watermarks: when each group last found a queue with nothing to deliver,
written by a pop of one whole queue that came back empty and removed when the group's place
there moves back or goes away. No pop reads it: a row dated in the future (as a tool may
write) never hides a message."""

from __future__ import annotations

from datetime import datetime

from tests.conftest import Db
from tests.consuming import Api, data_of


async def watermark(db: Db, queue: str, group: str) -> datetime | None:
    value = await db.value(
        "SELECT last_empty_scan_at FROM queen.consumer_watermarks"
        " WHERE queue_name = %s AND consumer_group = %s",
        queue,
        group,
    )
    assert value is None or isinstance(value, datetime)
    return value


async def push_and_drain(api: Api, queue: str, group: str) -> None:
    await api.push(queue, "p1", 1)
    await api.push(queue, "p2", 2)
    done = await api.messages(queue, batch=10, partitions=2, consumerGroup=group)
    assert sorted(data_of(done)) == [1, 2]
    await api.ack_batch(done, group=group)


async def redate(db: Db, queue: str, group: str, shift: str) -> None:
    """Set the row's time to now() plus ``shift`` (an interval, e.g. '10 minutes')."""
    await db.rows(
        "UPDATE queen.consumer_watermarks SET last_empty_scan_at = now() + %s::interval"
        " WHERE queue_name = %s AND consumer_group = %s RETURNING 1",
        shift,
        queue,
        group,
    )


async def test_an_empty_pop_of_the_whole_queue_records_when_and_a_delivering_one_does_not(
    api: Api, queue: str, db: Db
) -> None:
    group = f"g-{queue}"
    await api.push(queue, "p1", 1)
    assert len(await api.messages(queue, consumerGroup=group)) == 1
    assert await watermark(db, queue, group) is None  # it delivered
    assert await api.messages(queue, consumerGroup=group) == []  # leased: nothing to give
    first = await watermark(db, queue, group)
    assert first is not None
    # queue mode has its own row, under the group name the original uses
    await api.messages(queue)
    assert await api.messages(queue) == []
    assert await watermark(db, queue, "__QUEUE_MODE__") is not None
    # a pop of one named partition is not a look at the queue
    other = f"{queue}-named"
    await api.push(other, "p1", 1)
    assert len(await api.messages(other, "p1", consumerGroup=group)) == 1
    assert await api.messages(other, "p1", consumerGroup=group) == []
    assert await watermark(db, other, group) is None
    # nor is a pop across the queues of a namespace
    spread = f"{queue}-ns"
    status, _ = await api.post(
        "/api/v1/configure", {"queue": spread, "namespace": f"ns-{queue}", "task": "t"}
    )
    assert status == 200
    await api.push(spread, "p1", 1)
    assert len(await api.messages(None, namespace=f"ns-{queue}", consumerGroup=group)) == 1
    assert await api.messages(None, namespace=f"ns-{queue}", consumerGroup=group) == []
    assert await watermark(db, spread, group) is None
    assert await api.messages(spread, consumerGroup=group) == []
    assert await watermark(db, spread, group) is not None


async def test_a_recent_row_is_left_as_it_is(api: Api, queue: str, db: Db) -> None:
    group = f"g-{queue}"
    await api.push(queue, "p1", 1)
    await api.messages(queue, consumerGroup=group)
    assert await api.messages(queue, consumerGroup=group) == []
    first = await watermark(db, queue, group)
    assert await api.messages(queue, consumerGroup=group) == []
    assert await watermark(db, queue, group) == first
    # an older one moves on
    await redate(db, queue, group, "-1 minute")
    assert await api.messages(queue, consumerGroup=group) == []
    again = await watermark(db, queue, group)
    assert first is not None and again is not None and again > first


async def test_seek_back_removes_the_row_and_everything_is_read_again(
    api: Api, queue: str, db: Db
) -> None:
    group = f"g-{queue}"
    await push_and_drain(api, queue, group)
    assert await api.messages(queue, batch=10, consumerGroup=group) == []
    assert await watermark(db, queue, group) is not None
    await redate(db, queue, group, "10 minutes")
    status, _ = await api.post(
        f"/api/v1/consumer-groups/{group}/queues/{queue}/seek",
        {"timestamp": "2000-01-01T00:00:00Z"},
    )
    assert status == 200
    assert await watermark(db, queue, group) is None
    again = await api.messages(queue, batch=10, partitions=2, consumerGroup=group)
    assert sorted(data_of(again)) == [1, 2]


async def test_deleting_the_group_on_the_queue_or_everywhere_removes_its_rows(
    api: Api, queue: str, db: Db
) -> None:
    group = f"g-{queue}"
    other = f"{queue}-2"
    for name in (queue, other):
        await push_and_drain(api, name, group)
        assert await api.messages(name, consumerGroup=group) == []
        assert await watermark(db, name, group) is not None
    await redate(db, queue, group, "10 minutes")
    status, _ = await api.delete(f"/api/v1/consumer-groups/{group}/queues/{queue}")
    assert status == 200
    assert await watermark(db, queue, group) is None
    assert await watermark(db, other, group) is not None
    again = await api.messages(queue, batch=10, partitions=2, consumerGroup=group)
    assert sorted(data_of(again)) == [1, 2]

    status, _ = await api.delete(f"/api/v1/consumer-groups/{group}")
    assert status == 200
    assert await watermark(db, other, group) is None


async def test_a_new_subscription_start_removes_the_groups_rows(
    api: Api, queue: str, db: Db
) -> None:
    group = f"g-{queue}"
    await push_and_drain(api, queue, group)
    assert await api.messages(queue, consumerGroup=group) == []
    assert await watermark(db, queue, group) is not None
    status, _ = await api.post(
        f"/api/v1/consumer-groups/{group}/subscription",
        {"subscriptionTimestamp": "2000-01-01T00:00:00Z"},
    )
    assert status == 200
    assert await watermark(db, queue, group) is None


async def test_deleting_the_queue_removes_its_rows(api: Api, queue: str, db: Db) -> None:
    group = f"g-{queue}"
    await push_and_drain(api, queue, group)
    assert await api.messages(queue, consumerGroup=group) == []
    assert await watermark(db, queue, group) is not None
    status, _ = await api.delete(f"/api/v1/resources/queues/{queue}")
    assert status == 200
    assert await watermark(db, queue, group) is None

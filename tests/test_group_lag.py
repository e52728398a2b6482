"""Consumer-group lag counts every message a group will still receive: partitions it has never
popped count from where its subscription starts (the beginning, ``new``, a timestamp), in
``GET /api/v1/consumer-groups``, a group's detail and ``queen_consumer_group_lag``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.conftest import Db
from tests.consuming import Api, age_messages, data_of


async def standing(api: Api, queue: str, group: str) -> dict[str, Any]:
    status, rows = await api.get(f"/api/v1/consumer-groups?queue={queue}")
    assert status == 200
    [row] = [r for r in rows if r["name"] == group]
    return row  # type: ignore[no-any-return]


async def prometheus_lag(api: Api, queue: str, group: str) -> int:
    status, _ = await api.post("/api/v1/stats/refresh")
    assert status == 200
    resp = await api.client.get("/metrics/prometheus")
    text = (await resp.get_data()).decode()
    wanted = f'queen_consumer_group_lag{{queue="{queue}",consumer_group="{group}"}} '
    [line] = [x for x in text.splitlines() if x.startswith(wanted)]
    return int(float(line.removeprefix(wanted)))


async def drain(
    api: Api, queue: str, group: str | None = None, partition: str | None = None, **params: Any
) -> list[Any]:
    seen: list[Any] = []
    while batch := await api.messages(queue, partition, batch=10, consumerGroup=group, **params):
        seen += data_of(batch)
        for m in batch:
            await api.ack(m, group=group)
    return seen


async def test_a_partition_the_group_never_popped_counts_whole(api: Api, queue: str) -> None:
    await api.push(queue, "a", 1, 2)
    assert await drain(api, queue, "g") == [1, 2]
    assert await drain(api, queue) == [1, 2]
    assert (await standing(api, queue, "g"))["totalLag"] == 0
    await api.push(queue, "b", 3, 4, 5, 6)  # a partition neither has a cursor on

    for group in ("g", "__QUEUE_MODE__"):
        row = await standing(api, queue, group)
        assert row["totalLag"] == 4, row
        assert row["maxTimeLag"] >= 0
    assert await prometheus_lag(api, queue, "g") == 4
    status, detail = await api.get("/api/v1/consumer-groups/g")
    assert status == 200
    parts = {p["partition"]: p for p in detail[queue]["partitions"]}
    assert (parts["a"]["offsetLag"], parts["b"]["offsetLag"]) == (0, 4)
    assert (parts["b"]["offset"], parts["b"]["nextOffset"]) == (0, 4)  # where g will start
    # the session's other groups lag too, and longer: ask for the whole list
    _, lagging = await api.get("/api/v1/consumer-groups/lagging?minLagSeconds=0&limit=1000")
    assert any(r["name"] == "g" and r["queueName"] == queue for r in lagging)

    assert await drain(api, queue, "g") == [3, 4, 5, 6]  # what the lag promised
    assert (await standing(api, queue, "g"))["totalLag"] == 0
    assert await prometheus_lag(api, queue, "g") == 0


async def test_a_group_subscribed_new_lags_only_behind_what_came_after(
    api: Api, queue: str
) -> None:
    await api.push(queue, "a", "old-1", "old-2")
    assert await drain(api, queue, "n", subscriptionMode="new") == []
    row = await standing(api, queue, "n")
    assert row["totalLag"] == 0 and row["subscriptionMode"] == "new"
    await api.push(queue, "a", "new-1")
    await api.push(queue, "c", "new-2", "new-3")  # a new partition: never popped by n
    assert (await standing(api, queue, "n"))["totalLag"] == 3
    assert await prometheus_lag(api, queue, "n") == 3
    assert sorted(await drain(api, queue, "n", subscriptionMode="new")) == [
        "new-1",
        "new-2",
        "new-3",
    ]
    assert (await standing(api, queue, "n"))["totalLag"] == 0


async def test_a_timestamp_group_that_never_popped_a_partition(
    api: Api, queue: str, db: Db
) -> None:
    await api.push(queue, "a", "a-old")
    await api.push(queue, "b", "b-old-1", "b-old-2")
    await age_messages(db, queue, 3600)
    since = datetime.now(UTC).isoformat()
    await api.push(queue, "a", "a-new")
    await api.push(queue, "b", "b-new-1", "b-new-2")
    assert await drain(api, queue, "t", "a", subscriptionFrom=since) == ["a-new"]
    row = await standing(api, queue, "t")
    assert row["totalLag"] == 2, row  # b counts from its first message after the time
    assert row["subscriptionMode"] == "timestamp"
    assert await drain(api, queue, "t", subscriptionFrom=since) == ["b-new-1", "b-new-2"]
    assert (await standing(api, queue, "t"))["totalLag"] == 0

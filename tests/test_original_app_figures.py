"""Figures the original broker's dashboard (its Vue app) reads, with the meaning it gives them:
found by running the built app against this broker (``scripts/original-dashboard.sh``) and
reading the original's routes and SQL for each."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_history_points_are_labelled_by_the_start_of_their_interval(client: Any) -> None:
    """The app drops a bucket whose label is less than one bucket old as still aggregating:
    labelled by its end, the newest interval (often the only one with traffic) was dropped.
    Each interval starts where the one before it ended."""
    await client.post("/api/v1/stats/refresh")  # a history point ending now
    await client.post("/api/v1/stats/refresh")  # and a short one after it
    status = await (await client.get("/api/v1/status")).get_json()
    newest, before = status["throughput"][:2]
    assert abs(newest["seconds"] - before["seconds"]) > 0.005  # told apart below
    ended = _when(before["timestamp"]).timestamp() + before["seconds"]
    assert abs(_when(newest["timestamp"]).timestamp() - ended) < 0.002
    assert (datetime.now(UTC) - _when(newest["timestamp"])).total_seconds() >= newest["seconds"]
    worker = await (await client.get("/api/v1/analytics/worker-metrics")).get_json()
    assert worker["timeSeries"][0]["timestamp"] == newest["timestamp"]
    system = await (await client.get("/api/v1/analytics/system-metrics")).get_json()
    [replica] = system["replicas"]
    assert replica["timeSeries"][-1]["timestamp"] == newest["timestamp"]


async def _push(client: Any, queue: str, partition: str, count: int) -> None:
    items = [
        {"queue": queue, "partition": partition, "transactionId": f"{partition}-{n}", "payload": {}}
        for n in range(count)
    ]
    assert (await client.post("/api/v1/push", json={"items": items})).status_code == 201


async def test_a_groups_members_are_the_partitions_it_has_popped(client: Any, queue: str) -> None:
    """The Consumers page shows ``members`` as the group's partitions: the original counts
    those it has popped (its partition consumers), not every partition it will read."""
    for partition in ("p1", "p2", "p3", "p4"):
        await _push(client, queue, partition, 3)
    got = await client.get(
        f"/api/v1/pop/queue/{queue}/partition/p2?batch=3&wait=false&consumerGroup=audit"
    )
    assert got.status_code == 200
    got = await client.get(f"/api/v1/pop/queue/{queue}?batch=3&wait=false&consumerGroup=billing")
    assert got.status_code == 200
    groups = await (await client.get("/api/v1/consumer-groups")).get_json()
    mine = {g["name"]: g for g in groups if g["queueName"] == queue}
    assert mine["audit"]["members"] == 1
    assert mine["billing"]["members"] == 1
    # every partition it will read still counts in its lag (leased messages too)
    assert mine["audit"]["partitionsWithLag"] == 4 and mine["audit"]["totalLag"] == 12
    assert mine["audit"]["state"] == "Stable"  # popped here, nothing older than 5 minutes

"""Figures the original broker's dashboard (its Vue app) reads, with the meaning it gives them:
found by running the built app against this broker (``scripts/original-dashboard.sh``) and
reading the original's routes and SQL for each."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from queen.admin.history import RatePoint, Rates, bucket_minutes, buckets


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_history_answers_in_minute_buckets_labelled_by_their_start(client: Any) -> None:
    """The app reads a bucket's figures as a minute's (its "now" figures are the newest
    complete bucket's) and drops the bucket whose label is less than a bucket old as still
    filling: for the last hour the original answers one-minute buckets labelled by the
    minute they start, and so must ours."""
    await client.post("/api/v1/stats/refresh")  # a history point ending now
    now = datetime.now(UTC)
    since = (now - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    window = f"from={since}&to={now.isoformat().replace('+00:00', 'Z')}"
    status = await (await client.get(f"/api/v1/status?{window}")).get_json()
    assert status["bucketMinutes"] == 1
    newest = status["throughput"][0]
    started = _when(newest["timestamp"])
    assert started.second == 0 and started.microsecond == 0
    assert 0 <= (datetime.now(UTC) - started).total_seconds() < 60 + 1
    worker = await (await client.get(f"/api/v1/analytics/worker-metrics?{window}")).get_json()
    assert worker["bucketMinutes"] == 1
    assert worker["timeSeries"][0]["timestamp"] == newest["timestamp"]
    system = await (await client.get(f"/api/v1/analytics/system-metrics?{window}")).get_json()
    [replica] = system["replicas"]
    assert replica["timeSeries"][-1]["timestamp"] == newest["timestamp"]
    six_hours = (
        f"from={(now - timedelta(hours=6)).isoformat().replace('+00:00', 'Z')}"
        f"&to={now.isoformat().replace('+00:00', 'Z')}"
    )
    wide = await (await client.get(f"/api/v1/status?{six_hours}")).get_json()
    assert wide["bucketMinutes"] == 5
    assert _when(wide["throughput"][0]["timestamp"]).minute % 5 == 0


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
    # the partitions with lag are, as the original counts them, of those it popped; its lag
    # (ours) counts every partition it will read, leased messages too
    assert mine["audit"]["partitionsWithLag"] == 1 and mine["audit"]["totalLag"] == 12
    assert mine["audit"]["state"] == "Dead"  # popped, never acknowledged


async def _pop(client: Any, queue: str, partition: str, batch: int, group: str) -> list[Any]:
    resp = await client.get(
        f"/api/v1/pop/queue/{queue}/partition/{partition}"
        f"?batch={batch}&wait=false&consumerGroup={group}"
    )
    assert resp.status_code == 200
    return list((await resp.get_json())["messages"])


async def _ack(client: Any, message: Any, group: str, status: str = "completed") -> None:
    body = {
        "transactionId": message["transactionId"],
        "partitionId": message["partitionId"],
        "leaseId": message["leaseId"],
        "status": status,
        "consumerGroup": group,
    }
    assert (await client.post("/api/v1/ack", json=body)).status_code == 200


async def test_a_queues_figures_are_its_furthest_behind_consumers_partition_by_partition(
    client: Any, queue: str
) -> None:
    """The Queues and Queue pages show, per partition, each figure of the consumer furthest
    behind for it among those reading there (the original's statistics: the largest of its
    rows per partition), a message any group dead-lettered not done; a partition no one
    reads counts whole as pending. Queue mode alone (no one here) would count 9 pending and
    nothing done."""
    await _push(client, queue, "p1", 6)
    await _push(client, queue, "p2", 3)
    got = await _pop(client, queue, "p1", 4, "fast")
    for message in got[:3]:
        await _ack(client, message, "fast")
    await _ack(client, got[3], "fast", "dlq")
    await _pop(client, queue, "p1", 2, "slow")  # held: a live lease
    detail = await (await client.get(f"/api/v1/status/queues/{queue}")).get_json()
    parts = {p["name"]: p["messages"] for p in detail["partitions"]}
    # p1: fast has 2 to do (3 done, 1 dead-lettered), slow has all 6 (2 leased)
    assert parts["p1"] == {
        "total": 6,
        "pending": 6,  # the original's pending counts the leased ones too
        "processing": 2,
        "completed": 3,
        "failed": 0,
        "deadLetter": 1,
    }
    assert (parts["p2"]["pending"], parts["p2"]["completed"]) == (3, 0)
    totals = detail["totals"]
    assert (totals["total"], totals["pending"], totals["processing"]) == (9, 9, 2)
    assert (totals["completed"], totals["deadLetter"]) == (3, 1)
    listed = await (await client.get(f"/api/v1/resources/queues?search={queue}")).get_json()
    [mine] = listed["queues"]
    # this list's pending leaves the leased ones out, as the original's does
    assert (mine["messages"]["pending"], mine["messages"]["processing"]) == (7, 2)
    assert mine["messages"]["completed"] == 3


async def test_a_group_is_stable_once_it_acknowledged_not_once_it_popped(
    client: Any, queue: str
) -> None:
    await _push(client, queue, "p1", 3)
    got = await _pop(client, queue, "p1", 2, "g")

    async def state() -> str:
        groups = await (await client.get(f"/api/v1/consumer-groups?queue={queue}")).get_json()
        [mine] = [g for g in groups if g["name"] == "g"]
        return str(mine["state"])

    assert await state() == "Dead"
    await _ack(client, got[0], "g")
    assert await state() == "Stable"


def test_history_buckets_add_up_the_intervals_that_began_in_each_minute() -> None:
    """The app's "now" figures (the DLQ count among them) are the newest complete bucket's:
    a minute's worth of 10-second intervals, not the last 10 seconds."""
    minute = datetime(2026, 4, 26, 10, 0, tzinfo=UTC)

    def point(start_s: float, dlq: int) -> RatePoint:
        return RatePoint(
            at=minute + timedelta(seconds=start_s + 10),
            span_s=10.0,
            rates=Rates(0.0, 0.0, 0.0),
            dead_letter_per_s=dlq / 10,
            push_requests_per_s=0.0,
            ingested=2,
            processed=0,
            cpu_percent=10.0,
            rss_bytes=1,
            deltas={"acks_dlq": dlq, "push_items_queued": 2},
        )

    points = [point(s, dlq) for s, dlq in ((0, 5), (10, 40), (50, 0), (60, 3))]
    first, second = buckets(points, 1)
    assert first.deltas["acks_dlq"] == 45 and first.ingested == 6
    assert first.at - timedelta(seconds=first.span_s) == minute  # labelled by its start
    assert first.rates.ingested_per_s == 0.1  # over the whole minute, as the original's
    assert second.deltas["acks_dlq"] == 3
    assert bucket_minutes(3600) == 1 and bucket_minutes(3601) == 5
    assert bucket_minutes(86400) == 15 and bucket_minutes(7 * 86400) == 60

"""``retentionEnabled`` and ``maxWaitTimeSeconds`` through HTTP, on the real PostgreSQL.

Queues are configured, fed, popped and acked through the routes; time is moved by ageing rows
in SQL, and the periodic pass is run at once (``broker.run_retention_pass``), never waited for.
A pass works on every queue of the database (other tests' queues too), so each test judges
what its own queue still holds; counts are checked as "at least".
"""

from __future__ import annotations

from typing import Any

from queen.broker import Broker
from tests.conftest import Db
from tests.consuming import Api, age_messages, data_of, expire_leases


async def stored(db: Db, queue: str, partition: str = "p") -> list[Any]:
    return [f["transaction_id"] for f in await db.frames(queue, partition)]


async def push(api: Api, queue: str, *txids: str) -> None:
    results = await api.push(queue, "p", *({"tx": t} for t in txids), tx=list(txids))
    assert [r["status"] for r in results] == ["queued"] * len(txids)


async def metric(api: Api, name: str) -> float:
    resp = await api.client.get("/metrics")
    for line in (await resp.get_data(as_text=True)).splitlines():
        if line.startswith(f"queen_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_retention_times_remove_nothing_without_retention_enabled(
    api: Api, broker: Broker, queue: str, db: Db
) -> None:
    await api.configure(queue, retentionEnabled=False, retentionSeconds=3)
    status, held = await api.get(f"/api/v1/resources/queues/{queue}")
    assert status == 200
    assert held["options"]["retentionEnabled"] is False
    assert held["options"]["retentionSeconds"] == 3
    await push(api, queue, "a", "b")
    await age_messages(db, queue, 60)
    await broker.run_retention_pass()
    assert await stored(db, queue) == ["a", "b"]
    assert data_of(await api.messages(queue, batch=10)) == [{"tx": "a"}, {"tx": "b"}]

    # The same with completed retention: consumed and old, still kept.
    other = f"{queue}-c"
    await api.configure(other, completedRetentionSeconds=3)  # retentionEnabled defaults to false
    await push(api, other, "x")
    (message,) = await api.messages(other, batch=10)
    assert (await api.ack(message))["success"]
    await age_messages(db, other, 60)
    await broker.run_retention_pass()
    assert await stored(db, other) == ["x"]

    # Turning it on applies both at the next pass (once the pop's lease is over).
    assert await expire_leases(db, queue) == 1
    await api.configure(queue, retentionEnabled=True, retentionSeconds=3)
    await api.configure(other, retentionEnabled=True, completedRetentionSeconds=3)
    outcome = await broker.run_retention_pass()
    assert outcome.segments >= 2 and outcome.messages >= 3
    assert await stored(db, queue) == [] and await stored(db, other) == []


async def test_messages_nobody_consumed_in_time_are_evicted_and_counted(
    api: Api, broker: Broker, queue: str, db: Db
) -> None:
    await api.configure(queue, maxWaitTimeSeconds=10)  # no retentionEnabled needed
    status, held = await api.get(f"/api/v1/resources/queues/{queue}")
    assert (status, held["options"]["maxWaitTimeSeconds"]) == (200, 10)
    await push(api, queue, "old-1", "old-2")
    await push(api, queue, "fresh")
    await age_messages(db, queue, 11, first_offset_below=2)
    before = await metric(api, "eviction_messages_removed_total")

    outcome = await broker.run_retention_pass()
    assert outcome.evicted_segments >= 1 and outcome.evicted_messages >= 2
    assert await stored(db, queue) == ["fresh"]
    assert data_of(await api.messages(queue, batch=10)) == [{"tx": "fresh"}]
    assert await metric(api, "eviction_messages_removed_total") >= before + 2
    total = "SELECT value FROM queen.retention_totals WHERE name = 'evicted_messages'"
    assert await db.value(total) >= 2  # shared by every broker process


async def test_a_queue_without_max_wait_keeps_old_unconsumed_messages(
    api: Api, broker: Broker, queue: str, db: Db
) -> None:
    await api.configure(queue, maxWaitTimeSeconds=0)
    await push(api, queue, "a")
    await age_messages(db, queue, 86_400)
    await broker.run_retention_pass()
    assert await stored(db, queue) == ["a"]


async def test_eviction_with_several_consumer_groups(
    api: Api, broker: Broker, queue: str, db: Db
) -> None:
    await api.configure(queue, maxWaitTimeSeconds=10)
    await push(api, queue, "both")  # offset 0: consumed by both groups in time
    await push(api, queue, "one")  # offset 1: consumed by "fast" only
    for group in ("fast", "slow"):  # both groups subscribe from the beginning
        popped = await api.messages(queue, batch=1, consumerGroup=group)
        assert data_of(popped) == [{"tx": "both"}]
        assert (await api.ack(popped[0], group=group))["success"]
    popped = await api.messages(queue, batch=10, consumerGroup="fast")
    assert data_of(popped) == [{"tx": "one"}]
    assert (await api.ack(popped[0], group="fast"))["success"]
    await age_messages(db, queue, 11)

    await broker.run_retention_pass()
    # "one" waited too long for "slow": evicted; "both" was consumed by every group: kept.
    assert await stored(db, queue) == ["both"]
    assert await api.messages(queue, batch=10, consumerGroup="slow") == []
    await push(api, queue, "next")
    for group in ("fast", "slow"):
        assert data_of(await api.messages(queue, batch=10, consumerGroup=group)) == [{"tx": "next"}]


async def test_a_group_that_never_popped_counts_as_not_consumed(
    api: Api, broker: Broker, queue: str, db: Db
) -> None:
    await api.configure(queue, maxWaitTimeSeconds=10)
    await push(api, queue, "a")
    # The queue mode consumer takes and acks it; the named group "late" subscribed (popped
    # another partition) but never read partition p.
    (message,) = await api.messages(queue, batch=10)
    assert (await api.ack(message))["success"]
    await api.push(queue, "elsewhere", {"tx": "e"})
    assert len(await api.messages(queue, "elsewhere", batch=10, consumerGroup="late")) == 1
    await age_messages(db, queue, 11)
    await broker.run_retention_pass()
    assert await stored(db, queue) == []


async def test_eviction_never_breaks_a_live_lease(
    api: Api, broker: Broker, queue: str, db: Db
) -> None:
    await api.configure(queue, maxWaitTimeSeconds=10, leaseTime=300)
    await push(api, queue, "held")
    await age_messages(db, queue, 11)
    (leased,) = await api.messages(queue, batch=10, consumerGroup="worker")
    # "audit" lags, so the message is due for eviction, but "worker" holds it under a lease.
    await api.push(queue, "other", {"tx": "o"})
    assert len(await api.messages(queue, "other", batch=10, consumerGroup="audit")) == 1

    await broker.run_retention_pass()
    assert await stored(db, queue) == ["held"]
    assert (await api.ack(leased, group="worker"))["success"]

    await broker.run_retention_pass()  # now it may go
    assert await stored(db, queue) == []
    assert await api.messages(queue, batch=10, consumerGroup="audit") == []


async def test_an_expired_lease_does_not_protect_a_message(
    api: Api, broker: Broker, queue: str, db: Db
) -> None:
    await api.configure(queue, maxWaitTimeSeconds=10)
    await push(api, queue, "a")
    await age_messages(db, queue, 11)
    (leased,) = await api.messages(queue, batch=10)
    assert await expire_leases(db, queue) == 1
    await broker.run_retention_pass()
    assert await stored(db, queue) == []
    answer = await api.ack(leased)
    assert answer["success"] is False  # the lease had expired: nothing to acknowledge
    assert await api.messages(queue, batch=10) == []

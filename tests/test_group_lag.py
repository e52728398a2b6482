"""Consumer-group lag counts every message a group will still receive: partitions it has never
popped count from where its subscription starts (the beginning, ``new``, a timestamp), in
``GET /api/v1/consumer-groups``, a group's detail and ``queen_consumer_group_lag``. Messages a
clear removed are not counted, in the lag nor in the queue's figures, even while a lease kept
a write below them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import trio

from queen.storage.postgres import migrate_sync
from tests.conftest import Db
from tests.consuming import Api, age_messages, data_of, expire_leases


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
    wanted = f'queen_consumer_group_lag{{consumer_group="{group}",queue="{queue}"}} '
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


async def queue_figures(api: Api, queue: str) -> dict[str, int]:
    """The totals of the queue's detail (its consumers furthest behind; pending counts the
    leased messages too, as the original's) and its Prometheus depth (queue mode's)."""
    status, detail = await api.get(f"/api/v1/resources/queues/{queue}")
    assert status == 200
    status, _ = await api.post("/api/v1/stats/refresh")
    assert status == 200
    resp = await api.client.get("/metrics/prometheus")
    text = (await resp.get_data()).decode()
    wanted = f'queen_queue_depth{{queue="{queue}"}} '
    [line] = [x for x in text.splitlines() if x.startswith(wanted)]
    totals = detail["totals"]
    return {
        "total": totals["total"],
        "pending": totals["pending"],
        "processing": totals["processing"],
        "depth": int(float(line.removeprefix(wanted))),
    }


async def test_what_a_clear_removed_is_not_counted_though_a_lease_kept_a_write_below_it(
    api: Api, queue: str, db: Db
) -> None:
    await api.configure(queue, leaseTime=15)
    for n in range(10):  # ten writes of ten messages: 0..99
        await api.push(queue, "p", *range(n * 10, n * 10 + 10))
    await api.push(queue, "r", *range(20))
    taken = await api.messages(queue, "r", batch=5, consumerGroup="g")  # then g stops
    assert data_of(taken) == list(range(5))
    await api.ack_batch(taken, group="g")
    assert len(await api.messages(queue, "p", batch=10)) == 10  # queue mode holds 0..9

    status, body = await api.delete(f"/api/v1/queues/{queue}/clear")
    assert (status, body["cleared"], body["kept"]) == (200, 110, 10)
    figures = await queue_figures(api, queue)
    assert figures == {"total": 10, "pending": 10, "processing": 10, "depth": 10}
    assert (await standing(api, queue, "g"))["totalLag"] == 10  # p's kept write only
    assert await prometheus_lag(api, queue, "g") == 10

    await expire_leases(db, queue)
    assert await drain(api, queue) == list(range(10))  # all there is
    figures = await queue_figures(api, queue)
    assert figures == {"total": 10, "pending": 0, "processing": 0, "depth": 0}
    assert await prometheus_lag(api, queue, "__QUEUE_MODE__") == 0
    status, detail = await api.get("/api/v1/consumer-groups/__QUEUE_MODE__")
    assert status == 200
    assert [p["offsetLag"] for p in detail[queue]["partitions"]] == [0, 0]

    await api.push(queue, "p", "after")  # exactly what is left
    assert (await queue_figures(api, queue))["depth"] == 1
    assert await prometheus_lag(api, queue, "__QUEUE_MODE__") == 1
    assert await drain(api, queue) == ["after"]


async def test_a_pop_moves_a_cursor_past_what_was_removed_after_it(
    api: Api, queue: str, db: Db
) -> None:
    await api.configure(queue, leaseTime=15)
    for n in range(3):
        await api.push(queue, "p", *range(n * 10, n * 10 + 10))
    assert len(await api.messages(queue, "p", batch=10)) == 10
    status, body = await api.delete(f"/api/v1/queues/{queue}/clear")
    assert (status, body["kept"]) == (200, 10)
    await expire_leases(db, queue)
    assert len(await drain(api, queue)) == 10
    # nothing is stored past the cursor: the pop that found nothing moved it to the end, so
    # the partition is not pending (a waiting pop would otherwise look at it again and again)
    cursor, end = (
        await db.rows(
            """SELECT c.next_offset, p.next_offset FROM queen.cursors c
               JOIN queen.partitions p ON p.id = c.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
               WHERE q.name = %s AND p.name = 'p' AND c.consumer_group = '__QUEUE_MODE__'""",
            queue,
        )
    )[0]
    assert (cursor, end) == (30, 30)


async def test_a_deleted_message_and_gaps_from_before_they_were_booked_are_not_counted(
    api: Api, queue: str, db: Db
) -> None:
    await api.configure(queue, leaseTime=15)
    await api.push(queue, "p", "a", "b", "c", tx=["a", "b", "c"])
    await api.push(queue, "p", "d", "e", tx=["d", "e"])
    await api.push(queue, "p", "f", tx=["f"])
    pid = (await api.messages(queue, "p", batch=1, autoAck=True))[0]["partitionId"]  # "a"
    status, _ = await api.delete(f"/api/v1/messages/{pid}/c")
    assert status == 200
    assert data_of(await api.messages(queue, "p", batch=2)) == ["b", "d"]  # leased, past "c"
    status, body = await api.delete(f"/api/v1/queues/{queue}/clear?partition=p")
    assert (status, body["cleared"], body["kept"]) == (200, 1, 4)  # "f" removed
    wanted = {"total": 4, "pending": 3, "processing": 2, "depth": 3}
    assert await queue_figures(api, queue) == wanted

    # a database written before gaps were booked: they are found when the schema is applied
    await db.rows("DROP TABLE queen.gaps")
    await db.rows(  # ... by an earlier build, whose digest it records
        """UPDATE queen.system_state SET value = '{"digest": "earlier"}' WHERE key = 'schema'"""
    )

    def migrate() -> None:
        with psycopg.connect(db.url, autocommit=True) as conn:
            migrate_sync(conn)

    await trio.to_thread.run_sync(migrate)
    assert await queue_figures(api, queue) == wanted
    await expire_leases(db, queue)
    assert await drain(api, queue) == ["b", "d", "e"]
    assert await queue_figures(api, queue) == {**wanted, "pending": 0, "processing": 0, "depth": 0}


async def test_a_partitions_lag_is_written_once_and_inlined_into_the_reads(
    api: Api, queue: str, db: Db
) -> None:
    """queen.stored_lag is the one definition of a group's lag in a partition, read by the
    group list (queen.admin_group_positions) and a group's partitions. The planner must inline
    it into their queries: called once per partition instead (a SET clause, STRICT, a
    security definer stop the inlining), it would look at the partitions with gaps once per
    partition where the inlined form looks once per query."""
    await api.push(queue, "p", 1, 2, 3)
    [[plan]] = await db.rows(
        """EXPLAIN (FORMAT JSON)
           SELECT n.lag FROM queen.partitions p
           CROSS JOIN LATERAL queen.stored_lag(p.id, p.next_offset, 1, '{2}') n"""
    )
    assert "stored_lag" not in json.dumps(plan), plan
    [[lag]] = await db.rows(
        """SELECT n.lag FROM queen.partitions p
           CROSS JOIN LATERAL queen.stored_lag(p.id, p.next_offset, 1, '{2}') n
           WHERE p.queue_id = (SELECT q.id FROM queen.queues q WHERE q.name = %s)""",
        queue,
    )
    assert lag == 1  # offsets 1 and 2 from the start, 2 acked ahead


async def test_the_oldest_waiting_time_is_written_once_and_inlined_into_the_reads(
    api: Api, queue: str, db: Db
) -> None:
    """queen.stored_since is the one definition of when the first message a consumer still has
    to do was stored, read by the queue, group list and group partition reads. Inlined, it is
    the segment probes themselves; called per row it would be a function call per partition."""
    await api.push(queue, "p", 1, 2, 3)
    [[plan]] = await db.rows(
        """EXPLAIN (FORMAT JSON)
           SELECT (SELECT o.at FROM queen.stored_since(p.id, 1) o) FROM queen.partitions p"""
    )
    assert "stored_since" not in json.dumps(plan), plan
    [[at, stored, beyond]] = await db.rows(
        """SELECT (SELECT o.at FROM queen.stored_since(p.id, 1) o),
                  (SELECT min(s.created_at) FROM queen.segments s WHERE s.partition_id = p.id),
                  (SELECT o.at FROM queen.stored_since(p.id, p.next_offset) o)
           FROM queen.partitions p
           WHERE p.queue_id = (SELECT q.id FROM queen.queues q WHERE q.name = %s)""",
        queue,
    )
    assert at == stored and beyond is None

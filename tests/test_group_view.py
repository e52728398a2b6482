"""A consumer group, partition by partition: stuck partitions are marked (a lease that ran out
with messages in it, or messages and no pop for a while), its lag has a history, and the
dashboard's group page shows both with the seek and delete actions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from queen.admin.groups import STUCK_IDLE_S, stuck_reason
from queen.admin.history import LagHistory
from queen.broker import Broker
from tests.conftest import Db
from tests.consuming import Api

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


async def kind(
    db: Db,
    lag: int,
    lease: float | None = None,
    expired: float | None = None,
    last_pop: float | None = None,
    waiting_s: float | None = None,
) -> str | None:
    """``queen.admin_stuck`` on a partition; times in seconds from now (negative: past)."""
    found = await db.value(
        """SELECT queen.admin_stuck(%s, now() + %s * interval '1 s', now() + %s * interval '1 s',
                                    now() - %s * interval '1 s', now() + %s * interval '1 s',
                                    %s)""",
        lag,
        lease,
        expired,
        waiting_s,
        last_pop,
        STUCK_IDLE_S,
    )
    return None if found is None else str(found)


async def test_a_partition_is_stuck_when_its_lease_ran_out_or_no_pop_came_for_a_while(
    broker: Broker, db: Db
) -> None:
    """The one rule (``queen.admin_stuck``) the page, its sort and the overview read."""
    recent, idle, long = -10.0, -(STUCK_IDLE_S + 60), STUCK_IDLE_S + 60
    assert await kind(db, 0, expired=-180, waiting_s=long) is None  # nothing due
    assert await kind(db, 5, lease=30, last_pop=idle, waiting_s=long) is None  # leased now
    assert await kind(db, 5, last_pop=recent, waiting_s=long) is None  # popped a moment ago
    assert await kind(db, 5, last_pop=idle, waiting_s=20.0) is None  # the messages just came
    assert await kind(db, 5, waiting_s=20.0) is None  # a group that just started
    assert await kind(db, 5, expired=-180, last_pop=recent, waiting_s=20.0) == "lease_expired"
    assert await kind(db, 5, last_pop=idle, waiting_s=long) == "idle"
    assert await kind(db, 5, waiting_s=long) == "never_popped"


def test_a_stuck_partition_says_why_in_words() -> None:
    def reason(
        found: str | None,
        expired: datetime | None = None,
        last_pop: datetime | None = None,
        waiting_s: float = 0.0,
    ) -> str | None:
        return stuck_reason(
            found, lease_expired=expired, last_pop=last_pop, waiting_s=waiting_s, now=NOW
        )

    said = reason("lease_expired", expired=NOW - timedelta(minutes=3))
    assert said == "lease expired 3 min ago, not popped since"
    idle = NOW - timedelta(seconds=STUCK_IDLE_S + 60)
    assert reason("idle", last_pop=idle) == "no pop for 6 min"
    assert (
        reason("never_popped", waiting_s=STUCK_IDLE_S + 60)
        == "never popped, oldest message waiting 6 min"
    )
    assert reason(None, last_pop=idle, waiting_s=STUCK_IDLE_S + 60) is None


def test_lag_history_keeps_each_pairs_samples_and_forgets_pairs_gone_for_its_span() -> None:
    history = LagHistory(step_s=30, span_s=60)
    history.record(0, {("g", "q"): 5, ("h", "q"): 1})
    history.record(30, {("g", "q"): 7})
    history.record(61, {("g", "q"): 9})
    assert [lag for _, lag in history.series("g", "q")] == [5, 7, 9]
    assert history.series("h", "q") == []  # not seen for longer than the span


async def test_the_group_detail_marks_stuck_partitions_and_the_page_shows_them(
    api: Api, client: object, broker: Broker, db: Db, queue: str
) -> None:
    group = f"g-{queue}"  # groups are shared by the session's database
    await api.push(queue, "a", 1, 2)
    await api.push(queue, "b", 3)
    await api.push(queue, "c", 4)
    [held] = [await api.messages(queue, "a", batch=2, consumerGroup=group)]
    assert len(held) == 2  # g's consumer takes a's messages ... and goes away
    for m in await api.messages(queue, "c", batch=1, consumerGroup=group):
        await api.ack(m, group=group)  # c: caught up
    # a's lease runs out (moved into the past rather than waited for)
    await db.rows(
        """UPDATE queen.cursors SET lease_expires_at = now() - interval '3 minutes'
           WHERE consumer_group = %s AND partition_id =
                 (SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                  WHERE q.name = %s AND p.name = 'a') RETURNING 1""",
        group,
        queue,
    )
    status, detail = await api.get(f"/api/v1/consumer-groups/{group}")
    assert status == 200
    parts = {p["partition"]: p for p in detail[queue]["partitions"]}
    assert parts["a"]["stuck"] is not None and parts["a"]["stuck"].startswith("lease expired")
    assert parts["a"]["leaseExpiredAt"] is not None and parts["a"]["leaseActive"] is False
    assert parts["b"]["stuck"] is None  # never popped, but its message only just came
    # b's message has waited long (its segment moved into the past)
    await db.rows(
        """UPDATE queen.segments SET created_at = now() - interval '1 hour'
           WHERE partition_id = (SELECT p.id FROM queen.partitions p
                                 JOIN queen.queues q ON q.id = p.queue_id
                                 WHERE q.name = %s AND p.name = 'b') RETURNING 1""",
        queue,
    )
    status, detail = await api.get(f"/api/v1/consumer-groups/{group}")
    parts = {p["partition"]: p for p in detail[queue]["partitions"]}
    assert parts["b"]["stuck"] == "never popped, oldest message waiting 60 min"
    assert parts["c"]["stuck"] is None and parts["c"]["offsetLag"] == 0

    await broker.admin.consumer_groups.sample_lag()
    await broker.admin.consumer_groups.sample_lag()
    samples = broker.admin.consumer_groups.lag_history.series(group, queue)
    assert [lag for _, lag in samples] == [3, 3]  # a's two and b's one

    page = await client.get(f"/dashboard/view/group/{group}")  # type: ignore[attr-defined]
    html = await page.get_data(as_text=True)
    assert page.status_code == 200
    assert html.count('class="stuck"') == 2
    assert "lease expired" in html and "never popped" in html
    assert "<polyline" in html  # the lag history
    assert 'data-fields="timestamp"' in html and "/queues/" + queue + "/seek" in html
    assert 'data-method="DELETE"' in html  # delete the group on every queue
    missing = await client.get("/dashboard/view/group/nobody")  # type: ignore[attr-defined]
    assert missing.status_code == 404


async def test_a_group_seeks_to_a_time_given_as_the_dashboard_sends_it(
    api: Api, db: Db, queue: str
) -> None:
    group = f"g-{queue}"  # groups are shared by the session's database
    await api.push(queue, "a", 1, 2, 3)
    await db.rows(
        """UPDATE queen.segments SET created_at = '2026-01-01T00:00:00Z'
           WHERE partition_id = (SELECT p.id FROM queen.partitions p
                                 JOIN queen.queues q ON q.id = p.queue_id
                                 WHERE q.name = %s AND p.name = 'a') RETURNING 1""",
        queue,
    )
    await api.push(queue, "a", 4)
    for m in await api.messages(queue, "a", batch=10, consumerGroup=group):
        await api.ack(m, group=group)
    # the page's datetime-local value, read as UTC: "2026-06-01T00:00" + ":00Z"
    seek = f"/api/v1/consumer-groups/{group}/queues/{queue}/seek"
    status, _ = await api.post(seek, {"timestamp": "2026-06-01T00:00:00Z"})
    assert status == 200
    status, detail = await api.get(f"/api/v1/consumer-groups/{group}")
    [part] = detail[queue]["partitions"]
    assert part["offset"] == 3 and part["offsetLag"] == 1  # before the time: skipped

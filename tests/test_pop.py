"""Pops on the real database: answer shape, ordering, queue mode and fan-out, leases and their
expiry, subscriptions, delayed processing, window buffer, autoAck, multi-partition and
namespace pops, autopilot, the pop maintenance switch and the byte budget of one answer. Time
moves by SQL, never by sleeping.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import trio

from queen import open_broker
from queen.broker import Broker
from queen.consume.policy import iso_of_uuid7
from queen.settings import Settings
from tests.conftest import Db
from tests.consuming import Api, age_messages, data_of, expire_leases


async def test_a_pop_answers_the_contract_shape(api: Api, queue: str) -> None:
    pushed = await api.push(queue, "p7", {"a": 1}, [2], tx=["t1", "t2"])
    status, body = await api.pop(queue, batch=10)
    assert status == 200
    assert body["success"] is True
    assert (body["queue"], body["partition"], body["consumerGroup"]) == (
        queue,
        "p7",
        "__QUEUE_MODE__",
    )
    assert body["partitionsClaimed"] == 1
    assert uuid.UUID(body["leaseId"]).version == 7
    assert "autopilot" not in body
    first, second = body["messages"]
    assert first == {
        "id": pushed[0]["message_id"],
        "transactionId": "t1",
        "partitionId": body["partitionId"],
        "leaseId": body["leaseId"],
        "data": {"a": 1},
        "createdAt": iso_of_uuid7(pushed[0]["message_id"]),
        "producerSub": None,
        "traceId": None,
        "partition": "p7",
        "queue": queue,
        "consumerGroup": "__QUEUE_MODE__",
        "retryCount": 0,
        "offset": 0,
    }
    assert first["createdAt"].endswith("Z") and first["partitionId"]
    assert (second["data"], second["offset"]) == ([2], 1)


async def test_nothing_to_deliver_is_204(api: Api, queue: str) -> None:
    assert (await api.pop("never-pushed-" + queue))[0] == 204
    assert (await api.pop(queue, "nope"))[0] == 204
    await api.push(queue, "p", 1)
    assert len(await api.messages(queue)) == 1
    assert (await api.pop(queue))[0] == 204  # leased
    assert (await api.pop(queue, wait=True, timeout=0))[0] == 204


async def test_order_is_kept_per_partition_for_every_group(api: Api, queue: str) -> None:
    for start in range(0, 30, 10):
        await api.push(queue, "p", *range(start, start + 10))
    for group in (None, "g1", "g2"):
        seen: list[int] = []
        while batch := await api.messages(queue, "p", batch=7, consumerGroup=group):
            seen.extend(data_of(batch))
            results = await api.ack_batch(batch, group=group)
            assert all(r["success"] for r in results)
        assert seen == list(range(30)), group


async def test_pops_take_a_large_write_in_turn_and_skip_what_was_acked_out_of_order(
    api: Api, queue: str
) -> None:
    await api.push(queue, "p", *range(40))  # one write of 40 frames
    first = await api.messages(queue, "p", batch=10)
    assert data_of(first) == list(range(10))
    for done in (first[2], first[5]):
        assert (await api.ack(done))["success"]
    assert (await api.ack(first[0], "retry"))["success"]  # the lease handed back
    again = await api.messages(queue, "p", batch=10)
    assert [(m["data"], m["offset"]) for m in again] == [
        (n, n) for n in (0, 1, 3, 4, 6, 7, 8, 9, 10, 11)
    ]
    assert all(r["success"] for r in await api.ack_batch(again))
    rest: list[int] = []
    while batch := await api.messages(queue, "p", batch=7):
        rest.extend(m["offset"] for m in batch)
        assert all(r["success"] for r in await api.ack_batch(batch))
    assert rest == list(range(12, 40))


async def test_queue_mode_consumers_share_one_cursor(api: Api, queue: str) -> None:
    await api.push(queue, "a", "a0", "a1")
    await api.push(queue, "b", "b0", "b1")
    first = await api.messages(queue, batch=10)
    second = await api.messages(queue, batch=10, consumerGroup="")  # empty group: queue mode
    assert {m["partition"] for m in first} != {m["partition"] for m in second}
    assert sorted(data_of(first) + data_of(second)) == ["a0", "a1", "b0", "b1"]
    assert await api.messages(queue) == []
    await api.ack_batch(first)
    await api.ack_batch(second)
    assert await api.messages(queue) == []


async def test_each_group_gets_every_message(api: Api, queue: str) -> None:
    await api.push(queue, "p", 1, 2, 3)
    got = {}
    for group in ("g1", "g2", None):
        got[group] = data_of(await api.messages(queue, batch=10, consumerGroup=group))
    assert got == {"g1": [1, 2, 3], "g2": [1, 2, 3], None: [1, 2, 3]}


async def test_a_live_lease_keeps_the_partition_for_its_consumer(api: Api, queue: str) -> None:
    await api.push(queue, "p", *range(5))
    mine = await api.messages(queue, "p", batch=2, consumerGroup="g")
    assert data_of(mine) == [0, 1]
    assert await api.messages(queue, "p", batch=2, consumerGroup="g") == []
    assert await api.messages(queue, batch=2, consumerGroup="g") == []
    assert data_of(await api.messages(queue, "p", batch=2, consumerGroup="other")) == [0, 1]
    await api.ack_batch(mine, group="g")
    assert data_of(await api.messages(queue, "p", batch=2, consumerGroup="g")) == [2, 3]


async def test_an_expired_lease_redelivers_the_batch(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", "x", "y", "z")
    first = await api.messages(queue, batch=2)
    assert await api.messages(queue, batch=2) == []
    assert await expire_leases(db, queue) == 1
    again = await api.messages(queue, batch=2)
    assert [m["id"] for m in again] == [m["id"] for m in first]
    assert again[0]["leaseId"] != first[0]["leaseId"]
    stale = await api.ack(first[0])
    assert (stale["success"], stale["error"]) == (False, "Invalid or expired lease")
    assert all(r["success"] for r in await api.ack_batch(again))
    assert data_of(await api.messages(queue, batch=2)) == ["z"]


async def test_subscription_new_starts_at_the_first_pop(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", "old")
    await age_messages(db, queue, 10)
    assert await api.messages(queue, consumerGroup="fresh", subscriptionMode="new") == []
    assert await api.messages(queue, consumerGroup="now", subscriptionFrom="now") == []
    await api.push(queue, "p", "new")
    assert data_of(await api.messages(queue, consumerGroup="fresh", subscriptionMode="new")) == [
        "new"
    ]
    assert data_of(await api.messages(queue, consumerGroup="now")) == ["new"]
    everything = await api.messages(queue, batch=5, consumerGroup="all", subscriptionMode="all")
    assert data_of(everything) == ["old", "new"]
    # the start is fixed at the first pop: a later "all" does not rewind the group
    await api.messages(queue, consumerGroup="late", subscriptionMode="new")
    assert await api.messages(queue, consumerGroup="late", subscriptionMode="all") == []


@pytest.mark.parametrize("mode", ["from_beginning", "FROM_BEGINNING", "earliest", "all"])
async def test_any_other_subscription_mode_reads_from_the_beginning(
    api: Api, queue: str, db: Db, mode: str
) -> None:
    await api.push(queue, "p", "old")
    await age_messages(db, queue, 10)
    for wait in ("false", "true"):
        status, body = await api.pop(
            queue, batch=5, consumerGroup=f"g-{wait}", subscriptionMode=mode, wait=wait, timeout=0
        )
        assert status == 200 and data_of(body["messages"]) == ["old"], wait
    stored = await db.value(
        "SELECT subscription_mode FROM queen.consumer_groups g JOIN queen.queues q "
        "ON q.id = g.queue_id WHERE q.name = %s AND g.consumer_group = 'g-false'",
        queue,
    )
    assert stored == "all"


async def test_subscription_from_a_timestamp(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", "hour-old")
    await age_messages(db, queue, 3600)
    await api.push(queue, "p", "recent")
    since = (datetime.now(UTC) - timedelta(minutes=30)).isoformat()
    got = await api.messages(queue, batch=5, consumerGroup="ts", subscriptionFrom=since)
    assert data_of(got) == ["recent"]


async def test_delayed_processing_holds_messages_until_old_enough(
    api: Api, queue: str, db: Db
) -> None:
    await api.configure(queue, delayedProcessing=60)
    await api.push(queue, "p", "first")
    assert await api.messages(queue) == []
    await age_messages(db, queue, 61)
    await api.push(queue, "p", "second")
    got = await api.messages(queue, batch=5)
    assert data_of(got) == ["first"]
    await api.ack_batch(got)
    assert await api.messages(queue, batch=5) == []
    await age_messages(db, queue, 61)
    assert data_of(await api.messages(queue, batch=5)) == ["second"]


async def test_window_buffer_waits_for_a_quiet_partition(api: Api, queue: str, db: Db) -> None:
    await api.configure(queue, windowBuffer=30)
    await api.push(queue, "p", 1)
    await api.push(queue, "p", 2)
    assert await api.messages(queue, batch=10) == []
    await age_messages(db, queue, 31)
    await api.push(queue, "q", 9)  # another partition does not hold this one back
    assert data_of(await api.messages(queue, "p", batch=10)) == [1, 2]
    assert await api.messages(queue, "q", batch=10) == []
    await api.push(queue, "p", 3)
    assert await api.messages(queue, "p", batch=10, consumerGroup="g") == []  # busy again
    await age_messages(db, queue, 31)
    assert data_of(await api.messages(queue, "p", batch=10, consumerGroup="g")) == [1, 2, 3]


async def test_auto_ack_commits_on_delivery(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", 1, 2, 3)
    status, body = await api.pop(queue, batch=2, autoAck=True)
    assert status == 200 and body["leaseId"] == ""
    assert [m["leaseId"] for m in body["messages"]] == ["", ""]
    assert data_of(await api.messages(queue, batch=2, autoAck=True)) == [3]
    assert await api.messages(queue) == []
    leases = await db.value(
        """SELECT count(*) FROM queen.cursors c JOIN queen.queues q ON q.id = c.queue_id
           WHERE q.name = %s AND c.lease_id IS NOT NULL""",
        queue,
    )
    assert leases == 0


async def test_one_pop_claims_several_partitions_under_one_lease(api: Api, queue: str) -> None:
    for name in ("p1", "p2", "p3"):
        await api.push(queue, name, f"{name}-0", f"{name}-1")
    status, body = await api.pop(queue, batch=10, partitions=3)
    assert status == 200 and body["partitionsClaimed"] == 3
    assert len(body["messages"]) == 6
    assert {m["leaseId"] for m in body["messages"]} == {body["leaseId"]}
    per_partition: dict[str, list[str]] = {}
    for m in body["messages"]:
        per_partition.setdefault(m["partition"], []).append(m["data"])
    assert per_partition == {p: [f"{p}-0", f"{p}-1"] for p in ("p1", "p2", "p3")}
    capped = await api.messages(queue, batch=3, partitions=3, consumerGroup="g")
    assert len(capped) == 3  # the batch is one budget for all claimed partitions


async def test_namespace_and_task_pop_spans_queues_by_priority(api: Api, queue: str) -> None:
    low, high, other = f"{queue}-low", f"{queue}-high", f"{queue}-other"
    ns = f"ns-{queue}"
    await api.post(
        "/api/v1/configure",
        {"queue": low, "namespace": ns, "task": "a", "options": {"priority": 1}},
    )
    await api.post(
        "/api/v1/configure",
        {"queue": high, "namespace": ns, "task": "b", "options": {"priority": 9}},
    )
    await api.post("/api/v1/configure", {"queue": other, "namespace": "elsewhere", "task": "a"})
    for name in (low, high, other):
        await api.push(name, "p", name)
    first = await api.messages(None, namespace=ns, batch=10, partitions=1)
    assert data_of(first) == [high]
    rest = await api.messages(None, namespace=ns, batch=10)
    assert data_of(rest) == [low]
    assert data_of(
        await api.messages(None, task="a", batch=10, partitions=5, consumerGroup="g")
    ) in (
        [low, other],
        [other, low],
    )
    assert (await api.pop(None))[0] == 400


async def test_path_parameters_are_percent_decoded(api: Api, queue: str) -> None:
    name, partition = f"orders eu:{queue}", "cust 42%"
    await api.push(name, partition, "hello")
    assert data_of(await api.messages(name, partition)) == ["hello"]
    status, body = await api.delete(f"/api/v1/resources/queues/orders%20eu%3A{queue}")
    assert status == 200 and body["existed"] is True


async def test_a_pop_without_batch_delivers_one_message_unless_autopilot(
    api: Api, queue: str, broker: Broker
) -> None:
    await api.push(queue, "p", *range(150))
    status, body = await api.pop(queue)
    assert status == 200 and data_of(body["messages"]) == [0]
    assert "autopilot" not in body
    await api.ack(body["messages"][0])
    assert [m.data for m in (await broker.pop(queue)).messages] == [1]
    auto = await broker.pop(queue, consumer_group="lib", autopilot=True)
    assert len(auto.messages) == 100


async def test_default_batch_and_autopilot_echo(api: Api, queue: str) -> None:
    await api.push(queue, "p", *range(150))
    status, body = await api.pop(queue, autopilot=True)
    assert status == 200
    assert len(body["messages"]) == 100
    assert body["autopilot"] == {"partitions": 32, "batch": 100, "waitMs": 0}
    pinned = await api.pop(queue, batch=5, partitions=1, consumerGroup="g", autopilot=True)
    assert pinned[1]["autopilot"] == {"partitions": 1, "batch": 5, "waitMs": 0}


async def test_autopilot_fills_a_batch_from_as_many_partitions_as_it_needs(
    api: Api, queue: str
) -> None:
    for n in range(12):
        await api.push(queue, f"p{n}", n)
    # without autopilot the client pinned one partition: one message
    status, plain = await api.pop(queue, batch=10, consumerGroup="plain")
    assert status == 200 and len(plain["messages"]) == 1
    # batch set, partitions left to the broker: the batch fills from ten partitions
    status, body = await api.pop(queue, batch=10, autopilot=True)
    assert status == 200
    assert body["autopilot"]["partitions"] == 10
    assert body["partitionsClaimed"] == 10
    assert len({m["partitionId"] for m in body["messages"]}) == 10
    # two partitions are left, fewer than QUEEN_POP_AUTOPILOT_SPREAD: one to a pop
    left = set(range(12)) - {m["data"] for m in body["messages"]}
    status, second = await api.pop(queue, batch=10, autopilot=True)
    assert status == 200 and second["partitionsClaimed"] == 1
    status, third = await api.pop(queue, batch=10, autopilot=True)
    assert status == 200 and third["partitionsClaimed"] == 1
    assert sorted(m["data"] for m in second["messages"] + third["messages"]) == sorted(left)


async def test_autopilot_leaves_a_few_ready_partitions_one_to_each_consumer(
    api: Api, queue: str, settings: Settings
) -> None:
    for n in range(4):
        await api.push(queue, f"p{n}", *(f"{n}.{m}" for m in range(5)))
    # four partitions ready, fewer than 8: the first pop takes one, the others stay claimable
    status, first = await api.pop(queue, batch=100, autopilot=True, consumerGroup="g")
    assert status == 200 and first["partitionsClaimed"] == 1
    assert data_of(first["messages"]) == [f"{first['partition'][1]}.{m}" for m in range(5)]
    status, second = await api.pop(queue, batch=100, autopilot=True, consumerGroup="g")
    assert status == 200 and second["partitionsClaimed"] == 1
    assert second["partition"] != first["partition"]
    # a count the client sets is used as it is
    status, pinned = await api.pop(queue, batch=100, partitions=4, consumerGroup="h")
    assert status == 200 and pinned["partitionsClaimed"] == 4
    # with the spread at 1 the broker's width applies whatever is ready
    async with open_broker(dataclasses.replace(settings, pop_autopilot_spread=1)) as wide:
        taken = await wide.pop(queue, consumer_group="k", batch=100, autopilot=True)
    assert len({m.partition for m in taken.messages}) == 4 and len(taken.messages) == 20


async def test_pop_maintenance_answers_204_at_once_in_every_process(
    api: Api, queue: str, db: Db, settings: Settings
) -> None:
    await api.push(queue, "p", 1)
    status, body = await api.post("/api/v1/system/maintenance/pop", {"enabled": True})
    try:
        assert status == 200 and body["popMaintenanceMode"] is True
        assert (await api.get("/api/v1/system/maintenance/pop"))[1]["popMaintenanceMode"]
        assert await db.value(
            "SELECT value FROM queen.system_state WHERE key = 'pop_maintenance_mode'"
        ) == {"enabled": True}
        with trio.fail_after(5):  # a 30 s long poll answers at once
            assert (await api.pop(queue, wait=True, timeout=30000))[0] == 204
        async with open_broker(settings.with_changes(system_state_cache_ms=0)) as other:
            assert not await other.pop(queue)
        bad = await api.post("/api/v1/system/maintenance/pop", {"enabled": "yes"})
        assert bad == (400, {"error": "enabled (boolean) is required"})
    finally:
        status, body = await api.post("/api/v1/system/maintenance/pop", {"enabled": False})
    assert body["popMaintenanceMode"] is False
    assert data_of(await api.messages(queue)) == [1]


async def test_embedding_api_pops_and_acks(broker: Broker, queue: str) -> None:
    await broker.push([{"queue": queue, "partition": "p", "payload": {"n": n}} for n in range(3)])
    result = await broker.pop(queue, batch=2, consumer_group="lib")
    assert [m.data for m in result.messages] == [{"n": 0}, {"n": 1}]
    assert result.lease_id and result.partitions_claimed == 1
    answers = await broker.ack(result.messages)
    assert [a.success for a in answers] == [True, True]
    assert answers[-1].lease_released is True
    rest = await broker.pop(queue, consumer_group="lib", auto_ack=True)
    assert [m.data for m in rest.messages] == [{"n": 2}]
    assert not await broker.pop(queue, consumer_group="lib", wait=True, timeout_ms=0)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("batch=0", "batch must be between 1 and 10000"),
        ("batch=10001", "batch must be between 1 and 10000"),
        ("batch=99999999999999999999", "batch must be between 1 and 10000"),
        (f"batch={'9' * 400}", "batch must be between 1 and 10000"),
        ("timeout=-99999999999999999999", "timeout must be between 0 and 3600000"),
        ("timeout=3600001", "timeout must be between 0 and 3600000"),
        ("batch=lots", "batch must be an integer"),
        ("wait=sometimes", "wait must be true or false"),
        ("timeout=-5", "timeout must be between"),
        ("partitions=0", "partitions must be between"),
        ("autoAck=2", "autoAck must be true or false"),
        ("subscriptionFrom=tomorrow", "subscriptionFrom must be"),
        ("consumerGroup=a%01b", "consumerGroup must not contain control characters"),
    ],
)
async def test_bad_pop_parameters_are_a_400_and_lease_nothing(
    api: Api, queue: str, db: Db, query: str, message: str
) -> None:
    await api.push(queue, "p", 1)
    for path in (
        f"/api/v1/pop/queue/{queue}",
        f"/api/v1/pop/queue/{queue}/partition/p",
        "/api/v1/pop?namespace=x&task=y",
    ):
        status, answer = await api.get(f"{path}{'&' if '?' in path else '?'}{query}")
        assert status == 400 and message in answer["error"], path
    assert (
        await db.value(
            "SELECT count(*) FROM queen.cursors c JOIN queen.queues q ON q.id = c.queue_id "
            "WHERE q.name = %s",
            queue,
        )
        == 0
    )
    assert data_of(await api.messages(queue)) == [1]


async def test_pops_and_acks_are_counted_in_metrics(api: Api, client: Any, queue: str) -> None:
    await api.push(queue, "p", 1)
    await api.ack_batch(await api.messages(queue))
    await api.pop(queue)
    text = (await (await client.get("/metrics")).get_data()).decode()
    for name in ("pop_requests", "pop_empty", "pop_messages", "acks"):
        line = next(x for x in text.splitlines() if x.startswith(f"queen_{name}_total "))
        assert float(line.split()[1]) >= 1, name


async def _drain(broker: Broker, queue: str, group: str | None) -> list[Any]:
    got: list[Any] = []
    while result := await broker.pop(queue, batch=100, partitions=100, consumer_group=group):
        got += [m.data for m in result.messages]
        await broker.ack(result.messages)
    return got


@pytest.mark.parametrize("group", [None, "marks"])
async def test_partitions_created_after_a_groups_first_look_are_found(
    broker: Broker, queue: str, db: Db, group: str | None
) -> None:
    """A pop looks only at partitions created since its group's mark; partitions created
    later, or seen while still empty, or created by a transaction that was still open when a
    pop looked, are all found."""
    await broker.push([{"queue": queue, "partition": "a", "payload": 1}])
    assert await _drain(broker, queue, group) == [1]  # the group's first look sets its mark

    # 'open' is created by a transaction still open while pops look and the mark moves on
    conn = await trio.to_thread.run_sync(lambda: psycopg.connect(broker_url(broker)))
    try:
        await trio.to_thread.run_sync(
            lambda: conn.execute("SELECT queen.ensure_partition(%s, 'open')", (queue,))
        )
        await broker.push([{"queue": queue, "partition": "b", "payload": 2}])
        assert await _drain(broker, queue, group) == [2]
        # 'empty' exists, empty, when a pop looks
        await broker.push([{"queue": queue, "partition": "c", "payload": 3}])
        await db.rows("SELECT queen.ensure_partition(%s, 'empty')", queue)
        assert await _drain(broker, queue, group) == [3]
        await trio.to_thread.run_sync(conn.commit)
    finally:
        await trio.to_thread.run_sync(conn.close)
    await broker.push([{"queue": queue, "partition": "d", "payload": 4}])
    assert await _drain(broker, queue, group) == [4]
    await broker.push(
        [
            {"queue": queue, "partition": "open", "payload": 5},
            {"queue": queue, "partition": "empty", "payload": 6},
        ]
    )
    assert sorted(await _drain(broker, queue, group)) == [5, 6]


async def test_a_deleted_group_starts_over_on_every_partition(broker: Broker, queue: str) -> None:
    await broker.push([{"queue": queue, "partition": f"p{n}", "payload": n} for n in range(3)])
    assert sorted(await _drain(broker, queue, "again")) == [0, 1, 2]
    await broker.consume.delete_consumer_group_on_queue("again", queue, True)
    assert sorted(await _drain(broker, queue, "again")) == [0, 1, 2]
    await broker.consume.delete_consumer_group("again", True)
    assert sorted(await _drain(broker, queue, "again")) == [0, 1, 2]


def broker_url(broker: Broker) -> str:
    url = broker.settings.database_url
    assert url is not None
    return url


# --- the byte budget of one answer ---------------------------------------------------------

KIB = 1024


def _kib(tag: int) -> str:
    """A payload whose stored JSON text is exactly 1 KiB (a string: its quotes and digits
    included)."""
    head = f"{tag:04d}"
    return head + "x" * (KIB - 2 - len(head))


@pytest.fixture
async def tight(settings: Settings) -> AsyncIterator[Broker]:
    """A broker whose answers carry 2.5 KiB of payloads at most: two of ``_kib``'s."""
    async with open_broker(settings.with_changes(pop_max_bytes=5 * KIB // 2)) as b:
        yield b


async def _lease_end(db: Db, queue: str, partition: str, group: str = "__QUEUE_MODE__") -> Any:
    return await db.value(
        """SELECT c.lease_end FROM queen.cursors c
           JOIN queen.partitions p ON p.id = c.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
           WHERE q.name = %s AND p.name = %s AND c.consumer_group = %s
             AND c.lease_expires_at > now()""",
        queue,
        partition,
        group,
    )


async def test_a_pop_stops_at_its_byte_budget_and_leases_only_what_it_delivers(
    tight: Broker, db: Db, queue: str
) -> None:
    await tight.push([{"queue": queue, "partition": "p", "payload": _kib(n)} for n in range(5)])
    seen: list[str] = []
    sizes: list[int] = []
    while result := await tight.pop(queue, batch=5):
        assert await _lease_end(db, queue, "p") == result.messages[-1].offset + 1
        sizes.append(len(result.messages))
        seen.extend(m.data for m in result.messages)
        assert all(a.success for a in await tight.ack(result.messages))
    assert sizes == [2, 2, 1]
    assert seen == [_kib(n) for n in range(5)]  # in order, each once


async def test_an_auto_ack_pop_moves_the_cursor_only_past_what_fit(
    tight: Broker, queue: str
) -> None:
    await tight.push([{"queue": queue, "partition": "p", "payload": _kib(n)} for n in range(3)])
    first = await tight.pop(queue, batch=3, consumer_group="g", auto_ack=True)
    assert [m.data for m in first.messages] == [_kib(0), _kib(1)]
    rest = await tight.pop(queue, batch=3, consumer_group="g", auto_ack=True)
    assert [m.data for m in rest.messages] == [_kib(2)]


async def test_a_message_larger_than_the_byte_budget_is_delivered_alone(
    tight: Broker, queue: str
) -> None:
    big = "y" * (10 * KIB)
    await tight.push([{"queue": queue, "partition": "p", "payload": p} for p in (big, 1, 2)])
    alone = await tight.pop(queue, batch=3)
    assert [m.data for m in alone.messages] == [big]
    await tight.ack(alone.messages)
    after = await tight.pop(queue, batch=3)
    assert [m.data for m in after.messages] == [1, 2]


async def test_the_byte_budget_is_shared_by_the_partitions_of_one_pop(
    tight: Broker, db: Db, queue: str
) -> None:
    for name in ("a", "b"):
        await tight.push([{"queue": queue, "partition": name, "payload": _kib(n)} for n in (0, 1)])
    first = await tight.pop(queue, batch=4, partitions=2)
    assert first.partitions_claimed == 1 and len(first.messages) == 2
    taken = first.messages[0].partition
    other = "b" if taken == "a" else "a"
    assert await _lease_end(db, queue, other) is None  # not leased: the next pop takes it
    second = await tight.pop(queue, batch=4, partitions=2)
    assert [(m.partition, m.data) for m in second.messages] == [
        (other, _kib(0)),
        (other, _kib(1)),
    ]

"""Pops on a queue of many partitions read what changed, not every partition: the wake-ups
remember which partitions fired, a look of a waiting pop reads those since its kind's last
look found nothing (its baseline), and a pop's cost does not grow with idle partitions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from trio_util import RepeatedEvent

from queen import open_broker
from queen.broker import Broker
from queen.consume.looks import HINTED_AT_MOST
from queen.consume.results import PopResult
from queen.consume.service import ConsumeService
from queen.consume.wakeups import _FORGET_AT_ONCE, REMEMBERED, Wakeups
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.model import PartitionKey
from queen.records import PopRequest
from queen.settings import Settings
from queen.storage.base import SegmentWrite
from queen.storage.consume import PENDING_NONE
from queen.storage.listener import parse
from tests.consuming import idle_partitions, pop_blocks_read
from tests.fakes import MemoryConsumeStore, idle_push_service

NO_RECHECK = 60_000  # ms: only a wake-up can deliver within a test's time limit

# --- the wake-ups remember which partitions fired ------------------------------------------


def test_fired_since_names_the_partitions_fired_after_a_position_latest_first() -> None:
    wakeups = Wakeups()
    wakeups.fire_partitions([("q", "a")])
    seen = wakeups.position()
    wakeups.fire_partitions([("q", "b")])
    wakeups.fire_partitions([("other", "x")])
    wakeups.fire_partitions([("q", "c")])
    wakeups.fire_partitions([("q", "b")])  # again: it counts once, as the latest
    assert wakeups.fired_since("q", seen, limit=10) == ["b", "c"]
    assert wakeups.fired_since("q", wakeups.position(), limit=10) == []
    assert wakeups.fired_since("q", seen, limit=1) is None  # more than asked for


def test_a_queue_fired_as_a_whole_changes_its_wide_epoch_a_partition_does_not() -> None:
    wakeups = Wakeups()
    before = wakeups.wide_epoch("q")
    wakeups.fire_partitions([("q", "a")])
    assert wakeups.wide_epoch("q") == before
    wakeups.fire(["other"])
    assert wakeups.wide_epoch("q") == before
    wakeups.fire(["q"])
    assert wakeups.wide_epoch("q") != before


def test_partitions_fired_before_the_remembered_ones_are_not_named() -> None:
    wakeups = Wakeups()
    seen = wakeups.position()
    fired = REMEMBERED + _FORGET_AT_ONCE + 1  # one past the point where the oldest are dropped
    wakeups.fire_partitions([("q", f"p{i}") for i in range(fired)])
    dropped = fired - REMEMBERED  # the oldest, dropped together; the latest REMEMBERED kept
    everything = fired + 10
    assert wakeups.fired_since("q", seen, limit=everything) is None  # p0 was forgotten
    assert wakeups.fired_since("q", seen + dropped - 1, limit=everything) is None
    kept = wakeups.fired_since("q", seen + dropped, limit=everything)
    assert kept is not None and len(kept) == REMEMBERED
    assert kept[0] == f"p{fired - 1}" and kept[-1] == f"p{dropped}"


def test_fires_of_a_queue_below_the_batch_of_forgetting_stay_named() -> None:
    wakeups = Wakeups()
    seen = wakeups.position()
    wakeups.fire_partitions([("q", f"p{i}") for i in range(REMEMBERED + _FORGET_AT_ONCE)])
    named = wakeups.fired_since("q", seen, limit=REMEMBERED + _FORGET_AT_ONCE)
    assert named is not None and named[-1] == "p0"


def test_a_notification_names_its_queue_and_the_partitions_written() -> None:
    assert parse(json.dumps(["orders", "p1", "p/2"]).encode()) == ("orders", ["p1", "p/2"])
    assert parse(json.dumps(["orders"]).encode()) == ("orders", [])  # the queue as a whole
    assert parse(b"orders") == ("orders", [])  # a bare name (an earlier build's trigger)
    assert parse(b'{"x": 1}') == ('{"x": 1}', [])


# --- a waiting pop's look reads what fired since its kind's baseline -------------------------


@pytest.fixture
async def service(tmp_path: object) -> AsyncIterator[tuple[ConsumeService, MemoryConsumeStore]]:
    store = MemoryConsumeStore(ripe_in_s=PENDING_NONE, listener_connected=True)
    settings = Settings(
        database_url="memory://", file_buffer_dir=str(tmp_path), pop_recheck_ms=NO_RECHECK
    )
    switches = MaintenanceSwitch(store, refresh_s=1.0, changed=RepeatedEvent())  # type: ignore[arg-type]
    consume = ConsumeService(
        store,  # type: ignore[arg-type]
        settings,
        Metrics(),
        switches=switches,
        push=idle_push_service(settings),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(consume.run)
        yield consume, store
        nursery.cancel_scope.cancel()


def _commit(consume: ConsumeService, *partitions: str) -> None:
    consume.on_commit(
        [SegmentWrite(1, ["m"], ["t"], [b"1"], [0], key=PartitionKey("q", p)) for p in partitions],
        [],
    )


async def test_a_woken_pop_reads_only_the_partitions_committed_since_its_baseline(
    service: tuple[ConsumeService, MemoryConsumeStore],
    autojump_clock: trio.testing.MockClock,
) -> None:
    consume, store = service
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(consume.pop, PopRequest(queue="q", wait=True, timeout_ms=30_000))
        await consume.wakeups.until_waiting(3)
        assert store.hints[0] is None  # the first look of the kind reads the whole queue
        looked = len(store.hints)
        _commit(consume, "p7", "p9")
        await trio.testing.wait_all_tasks_blocked()
        # one look for the three (nothing found: the others share it), of those two only
        assert store.hints[looked:] == [["p7", "p9"]]
        _commit(consume, "p3")
        await trio.testing.wait_all_tasks_blocked()
        assert store.hints[looked + 1 :] == [["p3"]]  # not p7 and p9 again: they were read
        # a new pop's first look reads what fired since the baseline too: nothing
        nursery.start_soon(consume.pop, PopRequest(queue="q", wait=True, timeout_ms=30_000))
        await consume.wakeups.until_waiting(4)
        assert store.hints[-1] == []
        nursery.cancel_scope.cancel()


async def test_a_fire_of_the_whole_queue_or_too_many_partitions_reads_the_whole_queue(
    service: tuple[ConsumeService, MemoryConsumeStore],
    autojump_clock: trio.testing.MockClock,
) -> None:
    consume, store = service
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume.pop, PopRequest(queue="q", wait=True, timeout_ms=30_000))
        await consume.wakeups.until_waiting(1)
        store.notify("q")  # another process said "the queue as a whole" (a seek, a deletion)
        await trio.testing.wait_all_tasks_blocked()
        assert store.hints[-1] is None
        _commit(consume, *[f"p{i}" for i in range(HINTED_AT_MOST + 1)])
        await trio.testing.wait_all_tasks_blocked()
        assert store.hints[-1] is None
        _commit(consume, "p1")
        await trio.testing.wait_all_tasks_blocked()
        assert store.hints[-1] == ["p1"]
        nursery.cancel_scope.cancel()


async def test_a_look_that_delivered_leaves_the_baseline_so_the_next_reads_the_same_again(
    service: tuple[ConsumeService, MemoryConsumeStore],
    autojump_clock: trio.testing.MockClock,
) -> None:
    consume, store = service
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume.pop, PopRequest(queue="q", wait=True, timeout_ms=30_000))
        await consume.wakeups.until_waiting(1)
        store.add("q")
        _commit(consume, "Default", "p2")
        await trio.testing.wait_all_tasks_blocked()
        assert store.hints[-1] == ["Default", "p2"]  # and it delivered
        # the partition it took may hold more than it took: the next look reads it again
        got = await consume.pop(PopRequest(queue="q", wait=True, timeout_ms=0))
        assert not got and store.hints[-1] == ["Default", "p2"]
        nursery.cancel_scope.cancel()


async def test_a_pop_that_does_not_wait_always_reads_the_whole_queue(
    service: tuple[ConsumeService, MemoryConsumeStore],
    autojump_clock: trio.testing.MockClock,
) -> None:
    consume, store = service
    assert not await consume.pop(PopRequest(queue="q", wait=True, timeout_ms=0))
    assert not await consume.pop(PopRequest(queue="q"))
    assert store.hints == [None, None]


# --- on PostgreSQL ---------------------------------------------------------------------------


async def test_a_hinted_pop_reads_as_much_beside_10_or_400_idle_partitions(
    broker: Broker, pg_url: str, queue: str
) -> None:
    read: dict[int, tuple[int, int]] = {}
    for idle in (10, 400):
        name = f"{queue}-{idle}"
        await idle_partitions(broker, name, "g", idle)
        hinted = await trio.to_thread.run_sync(pop_blocks_read, pg_url, name, "g", ["idle-3"])
        whole = await trio.to_thread.run_sync(pop_blocks_read, pg_url, name, "g", None)
        read[idle] = (hinted, whole)
    (hinted_10, whole_10), (hinted_400, whole_400) = read[10], read[400]
    assert whole_400 > whole_10 + 390, read  # (a look at the whole queue reads every cursor)
    # deeper indexes and bigger tables cost a few blocks more; the idle partitions, which
    # the whole queue's look reads one by one, cost the hinted look nothing
    assert hinted_400 - hinted_10 < (whole_400 - whole_10) / 20, read


async def test_a_whole_queue_look_reaches_each_partition_by_its_key_under_a_generic_plan(
    broker: Broker, pg_url: str, queue: str
) -> None:
    # A cached generic plan once joined the group's cursors against a scan of the queue's
    # partitions (cursors x partitions rows compared); each cursor now reaches its partition
    # through the key, whatever the plan.
    await idle_partitions(broker, queue, "g", 1000)
    # a partition served once, like the others: the walk meets it among them
    await broker.push([{"queue": queue, "partition": "idle-500", "payload": "x"}])

    def plans() -> list[str]:
        notes: list[str] = []
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
            conn.execute("ANALYZE queen.partitions, queen.cursors")  # as the broker does
            for setting in (
                "LOAD 'auto_explain'",
                "SET auto_explain.log_min_duration = 0",
                "SET auto_explain.log_nested_statements = on",
                "SET auto_explain.log_analyze = on",
                "SET auto_explain.log_timing = off",
                "SET plan_cache_mode = force_generic_plan",
                "SET client_min_messages = log",
                "SET jit = off",
            ):
                conn.execute(setting)
            for _ in range(2):
                conn.execute("BEGIN")
                conn.execute(
                    "SELECT * FROM queen.pop(%s, NULL, '', '', 'g', 10, 1, false, 'all', NULL,"
                    " gen_random_uuid(), true, 1048576, NULL, 1)",
                    (queue,),
                )
                conn.execute("ROLLBACK")
        return [n for n in notes if "FROM queen.cursors cu" in n]

    walks = await trio.to_thread.run_sync(plans)
    assert walks
    for plan in walks:
        assert "Seq Scan on partitions" not in plan, plan
        compared = sum(
            int(line.split(":")[1]) for line in plan.splitlines() if "Rows Removed by" in line
        )
        assert compared < 3000, plan  # the walk's cursors, each with its own partition


async def _wait_for_pop(
    broker: Broker, queue: str, into: trio.MemorySendChannel[PopResult]
) -> None:
    await into.send(await broker.pop(queue, consumer_group="g", wait=True, timeout_ms=30_000))


async def test_a_push_to_one_partition_is_looked_for_there_and_the_other_pops_wait_on(
    settings: Settings, queue: str
) -> None:
    async with open_broker(settings.with_changes(pop_recheck_ms=NO_RECHECK)) as broker:
        await idle_partitions(broker, queue, "g", 300)
        store = broker.consume.store
        hints: list[Any] = []
        pop = store.pop

        async def spy(*args: Any) -> Any:
            hints.append(args[4] if len(args) > 4 else None)
            return await pop(*args)

        store.pop = spy  # type: ignore[method-assign]
        send, receive = trio.open_memory_channel[PopResult](5)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(_wait_for_pop, broker, queue, send)
                await broker.consume.wakeups.until_waiting(5)
                looked = len(hints)
                await broker.push([{"queue": queue, "partition": "idle-7", "payload": "one"}])
                first = await receive.receive()
                assert [m.data for m in first.messages] == ["one"]
                await broker.consume.wakeups.until_waiting(4)  # the others wait on
                # every look after the push read that partition only
                assert hints[looked:] and all(h == ["idle-7"] for h in hints[looked:]), hints
                looked = len(hints)
                await broker.push([{"queue": queue, "partition": "idle-9", "payload": "two"}])
                second = await receive.receive()
                assert [m.data for m in second.messages] == ["two"]
                assert hints[looked:] and all(
                    h in (["idle-9"], ["idle-7", "idle-9"]) for h in hints[looked:]
                ), hints
                nursery.cancel_scope.cancel()


async def test_a_groups_scan_passes_an_empty_partition_and_looks_at_it_again(
    broker: Broker, queue: str, pg_url: str
) -> None:
    # The queue's "Default" partition stays empty: the mark pops look from passes it, and
    # keeps it listed, so a look reads only the partitions created since, and the listed one.
    await broker.configure(queue)
    await broker.push([{"queue": queue, "partition": f"p{i}", "payload": i} for i in range(3)])
    got = await broker.pop(queue, consumer_group="g", batch=10, partitions=10, auto_ack=True)
    assert len(got.messages) == 3

    def mark() -> tuple[Any, ...]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT m.scanned > d.created_xid, m.covered <= d.created_xid,"
                " m.empties = ARRAY[d.id]"
                " FROM queen.cursor_marks m JOIN queen.queues q ON q.id = m.queue_id"
                " JOIN queen.partitions d ON d.queue_id = q.id AND d.name = 'Default'"
                " WHERE q.name = %s AND m.consumer_group = 'g'",
                (queue,),
            ).fetchone()
        assert row is not None
        return tuple(row)

    scanned_past, covered_held, listed = await trio.to_thread.run_sync(mark)
    assert scanned_past and covered_held and listed
    await broker.push([{"queue": queue, "payload": "at last"}])  # into "Default"
    got = await broker.pop(queue, consumer_group="g", batch=10, partitions=10, auto_ack=True)
    assert [m.data for m in got.messages] == ["at last"]
    _, _, listed = await trio.to_thread.run_sync(mark)
    assert not listed  # it holds messages now: it has its cursor, and is no longer listed

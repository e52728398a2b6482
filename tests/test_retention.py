"""Retention of segments and pruning of the dedup sidecar, on the real PostgreSQL.

Time is moved by ageing rows in SQL (``created_at`` back by some seconds), never by sleeping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import trio
import trio.lowlevel
import trio.testing

from queen import open_broker
from queen.broker import Broker
from queen.ids import NIL_UUID
from queen.metrics import Metrics
from queen.retention import RetentionLoop, pause_after
from queen.settings import Settings
from queen.storage.retention import PassOutcome, PgRetentionStore
from tests.conftest import Db, scratch_database
from tests.consuming import age_messages

QUEUE_MODE = "__QUEUE_MODE__"


async def configure(broker: Broker, queue: str, **options: Any) -> None:
    await broker.configure(queue, options=options)


async def push(broker: Broker, queue: str, *txids: str, partition: str = "p") -> list[dict]:
    return await broker.push(
        [
            {"queue": queue, "partition": partition, "payload": {"tx": t}, "transactionId": t}
            for t in txids
        ]
    )


async def age_sidecar(db: Db, queue: str, seconds: int) -> None:
    await db.rows(
        """UPDATE queen.dedup d SET created_at = d.created_at - make_interval(secs => %s)
           FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
           WHERE d.partition_id = p.id AND q.name = %s""",
        seconds,
        queue,
    )


async def sidecar_rows(db: Db, queue: str) -> int:
    return int(
        await db.value(
            """SELECT count(*) FROM queen.dedup d JOIN queen.partitions p ON p.id = d.partition_id
           JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s""",
            queue,
        )
    )


async def test_a_key_is_new_again_after_its_window(broker: Broker, queue: str, db: Db) -> None:
    await configure(broker, queue, dedupWindowSeconds=60)
    first = await push(broker, queue, "k")
    inside = await push(broker, queue, "k")
    assert inside[0].status == "duplicate"
    assert inside[0].message_id == first[0].message_id
    await age_sidecar(db, queue, 61)
    after = await push(broker, queue, "k")
    assert after[0].status == "queued"
    assert after[0].message_id != first[0].message_id


async def test_window_zero_stores_every_repeat_and_changes_apply_at_once(
    broker: Broker, queue: str, db: Db
) -> None:
    await configure(broker, queue, dedupWindowSeconds=0)
    results = await push(broker, queue, "k", "k") + await push(broker, queue, "k")
    assert [r.status for r in results] == ["queued"] * 3
    assert await sidecar_rows(db, queue) == 0
    await configure(broker, queue, dedupWindowSeconds=3600)  # the next push dedups again
    assert (await push(broker, queue, "x"))[0].status == "queued"
    assert (await push(broker, queue, "x"))[0].status == "duplicate"


async def test_retention_removes_old_segments_and_keeps_newer_ones(
    broker: Broker, queue: str, db: Db
) -> None:
    await configure(broker, queue, retentionEnabled=True, retentionSeconds=60)
    old = await push(broker, queue, "old-1", "old-2")  # one segment, offsets 0-1
    await push(broker, queue, "new-1")  # offset 2
    await age_messages(db, queue, 120, first_offset_below=2)

    outcome = await broker.run_retention_pass()
    assert outcome.ran and outcome.segments == 1 and outcome.messages == 2
    frames = await db.frames(queue, "p")
    assert [f["transaction_id"] for f in frames] == ["new-1"]

    # The sidecar still remembers old-1 (its window is an hour): a duplicate whose original
    # was removed names the all-zero id.
    again = await push(broker, queue, "old-1")
    assert again[0].status == "duplicate"
    assert again[0].message_id == NIL_UUID != old[0].message_id

    held = await broker.queue_holdings(queue)
    assert held is not None
    assert (held.segments, held.messages, held.sidecar_entries) == (1, 1, 3)
    assert broker.metrics.retention_segments_removed == 1
    assert broker.metrics.retention_messages_removed == 2


async def test_retention_settings_take_effect_at_the_next_pass(
    broker: Broker, queue: str, db: Db
) -> None:
    await push(broker, queue, "a")
    await age_messages(db, queue, 120, first_offset_below=1)
    assert (await broker.run_retention_pass()).segments == 0  # no retention configured
    await configure(broker, queue, retentionEnabled=True, retentionSeconds=60)
    assert (await broker.run_retention_pass()).segments == 1


async def test_completed_retention_waits_for_every_consumer_group(
    broker: Broker, queue: str, db: Db
) -> None:
    await configure(broker, queue, retentionEnabled=True, completedRetentionSeconds=60)
    await push(broker, queue, "a", "b")
    await age_messages(db, queue, 120, first_offset_below=10)

    async def consume_all(group: str | None) -> None:
        popped = await broker.pop(queue, consumer_group=group, batch=10, wait=False)
        assert popped is not None
        results = await broker.ack(popped.messages)
        assert all(r.success for r in results)

    await consume_all(None)
    others = await broker.pop(queue, consumer_group="audit", batch=1, wait=False)
    assert others is not None  # the "audit" group exists and has not finished
    assert (await broker.run_retention_pass()).segments == 0
    await db.rows(
        "UPDATE queen.cursors SET lease_expires_at = now() - interval '1 second' "
        "WHERE consumer_group = 'audit'"
    )
    await consume_all("audit")
    assert (await broker.run_retention_pass()).segments == 1
    assert await db.frames(queue, "p") == []


async def test_retention_never_breaks_a_live_lease(broker: Broker, queue: str, db: Db) -> None:
    await configure(broker, queue, retentionEnabled=True, retentionSeconds=60)
    await push(broker, queue, "leased")
    await push(broker, queue, "free", partition="q")
    await age_messages(db, queue, 120, first_offset_below=10)
    popped = await broker.pop(queue, partition="p", batch=10, wait=False)
    assert popped is not None and [m.transaction_id for m in popped.messages] == ["leased"]

    outcome = await broker.run_retention_pass()
    assert outcome.segments == 1  # the segment of partition q only
    assert [f["transaction_id"] for f in await db.frames(queue, "p")] == ["leased"]
    (message,) = popped.messages
    acked = await broker.ack([message])
    assert acked[0].success
    assert (await broker.run_retention_pass()).segments == 1  # now it may go


async def test_pruning_keeps_the_sidecar_to_one_window(broker: Broker, queue: str, db: Db) -> None:
    await configure(broker, queue, dedupWindowSeconds=60)
    for window in range(4):
        keys = [f"w{window}-{i}" for i in range(150)]
        results = await push(broker, queue, *keys)
        assert {r.status for r in results} == {"queued"}
        await broker.run_retention_pass()
        assert await sidecar_rows(db, queue) == 150  # only the current window is kept
        await age_sidecar(db, queue, 61)  # the window passes
    assert broker.metrics.dedup_rows_pruned == 3 * 150
    await broker.run_retention_pass()
    assert await sidecar_rows(db, queue) == 0
    held = await broker.queue_holdings(queue)
    assert held is not None and held.messages == 600 and held.sidecar_entries == 0


async def test_pruning_removes_the_sidecar_of_deleted_queues(
    broker: Broker, queue: str, db: Db
) -> None:
    await push(broker, queue, *(f"k{i}" for i in range(20)))
    assert await sidecar_rows(db, queue) == 20
    partition_ids = [
        r[0]
        for r in await db.rows(
            "SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id "
            "WHERE q.name = %s",
            queue,
        )
    ]
    await broker.delete_queue(queue)
    count = "SELECT count(*) FROM queen.dedup WHERE partition_id = ANY(%s)"
    assert await db.value(count, partition_ids) == 20
    await broker.run_retention_pass()
    assert await db.value(count, partition_ids) == 0
    assert (
        await db.value(
            "SELECT count(*) FROM queen.dropped_partitions WHERE id = ANY(%s)", partition_ids
        )
        == 0
    )


def test_the_pause_between_passes_follows_the_shortest_time_a_queue_asks_for() -> None:
    assert pause_after(PassOutcome(shortest_s=None), 10.0) == 10.0
    assert pause_after(PassOutcome(shortest_s=3600), 10.0) == 10.0
    assert pause_after(PassOutcome(shortest_s=10), 10.0) == 2.5  # a quarter of it
    assert pause_after(PassOutcome(shortest_s=2), 10.0) == 1.0  # never below a second
    assert pause_after(PassOutcome(shortest_s=2), 0.5) == 0.5  # nor above the interval


async def test_a_pass_reports_the_shortest_time_a_queue_asks_for(
    pg_url: str, tmp_path: Path
) -> None:
    with scratch_database(pg_url, "retention") as url:
        settings = Settings(database_url=url, file_buffer_dir=str(tmp_path / "spool"))
        async with open_broker(settings) as broker:
            assert (await broker.run_retention_pass()).shortest_s is None
            await configure(broker, "off", retentionSeconds=30)  # retention off: not counted
            await configure(
                broker,
                "on",
                retentionEnabled=True,
                retentionSeconds=600,
                completedRetentionSeconds=120,
            )
            assert (await broker.run_retention_pass()).shortest_s == 120
            await configure(broker, "wait", maxWaitTimeSeconds=45)  # eviction: always counted
            assert (await broker.run_retention_pass()).shortest_s == 45


class _Passes(PgRetentionStore):
    """Records when each pass runs; every pass finds a queue asking for 10 s."""

    def __init__(self) -> None:
        self.at: list[float] = []

    async def run_pass(self, batch_limit: int, max_batches: int) -> PassOutcome:
        self.at.append(trio.current_time())
        return PassOutcome(ran=True, shortest_s=10)


async def test_the_loop_passes_again_within_a_quarter_of_a_queues_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = _Passes()
    loop = RetentionLoop(store, Metrics(), interval_s=10.0, batch_limit=10, max_batches=1)
    start = trio.current_time()
    with trio.move_on_after(16):
        await loop.run()
    assert [round(t - start, 1) for t in store.at] == [10.0, 12.5, 15.0]


async def test_one_pass_at_a_time_across_processes(broker: Broker, pg_url: str) -> None:
    def hold_the_lock_and_try() -> None:
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", (0x5155_4545_4E01,))
            try:
                outcome = trio.from_thread.run(broker.run_retention_pass)
                assert outcome.ran is False
            finally:
                other.execute("SELECT pg_advisory_unlock(%s)", (0x5155_4545_4E01,))

    await trio.to_thread.run_sync(hold_the_lock_and_try)
    assert (await broker.run_retention_pass()).ran is True


async def test_retention_during_live_traffic_loses_nothing_in_its_time(
    broker: Broker, queue: str, db: Db
) -> None:
    await configure(
        broker, queue, retentionEnabled=True, retentionSeconds=3600, completedRetentionSeconds=3600
    )
    total = 300
    received: list[str] = []
    done = trio.Event()

    async def producer() -> None:
        for i in range(0, total, 10):
            await push(broker, queue, *(f"m{j:04d}" for j in range(i, i + 10)))

    async def consumer() -> None:
        while len(received) < total:
            popped = await broker.pop(queue, batch=25, wait=True, timeout_ms=2000)
            if not popped:
                continue
            received.extend(m.transaction_id for m in popped.messages)
            assert all(r.success for r in await broker.ack(popped.messages))
        done.set()

    async def retention() -> None:
        while not done.is_set():
            outcome = await broker.run_retention_pass()
            assert outcome.segments == 0  # everything is inside its retention time
            await trio.lowlevel.checkpoint()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            nursery.start_soon(consumer)
            nursery.start_soon(retention)
    assert received == [f"m{j:04d}" for j in range(total)]
    assert len(await db.frames(queue, "p")) == total


async def test_queue_resources_route(client: Any, broker: Broker, queue: str) -> None:
    await push(broker, queue, "a", "b", "c")
    resp = await client.get(f"/api/v1/resources/queues/{queue}")
    assert resp.status_code == 200
    body = await resp.get_json()
    assert (body["segments"], body["messages"], body["sidecarEntries"]) == (1, 3, 3)
    assert body["options"]["dedupWindowSeconds"] == 3600
    missing = await client.get("/api/v1/resources/queues/no-such-queue-anywhere")
    assert missing.status_code == 404
    assert "error" in await missing.get_json()

"""Long polls: woken by a committed push (in this process at once, from another broker process
through NOTIFY), answered by the deadline, cancelled when the client goes away, and released at
shutdown. Nothing here sleeps to wait for an event: tests wait on the waiter count itself.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

import trio

from queen import open_broker
from queen.broker import Broker
from queen.consume.results import PopResult
from queen.consume.wakeups import Wakeups
from queen.http.app import create_app
from queen.ids import mint_id
from queen.model import PartitionKey
from queen.records import QUEUE_MODE, AckItem, PopRequest, SeekTarget, Sizing
from queen.server import listen_socket
from queen.serving import serve_app
from queen.settings import Settings
from queen.storage.base import SegmentWrite
from queen.storage.consume import PENDING_NONE, PopOutcome

NO_RECHECK = 60_000  # ms: only a wake-up can deliver within a test's time limit


async def test_a_ticket_taken_before_the_query_never_misses_a_fire() -> None:
    wakeups = Wakeups()
    ticket = wakeups.ticket("q")
    wakeups.fire(["q"])  # the push committed between the query and the wait
    assert await wakeups.wait(ticket, trio.current_time() + 5) is True
    later = wakeups.ticket("q")
    assert later is not ticket and not later.is_set()
    spanning = wakeups.ticket(None)
    wakeups.fire(["other"])
    assert spanning.is_set() and not later.is_set()


async def test_a_wait_ends_at_its_deadline_and_forgets_its_ticket(
    autojump_clock: trio.abc.Clock,
) -> None:
    wakeups = Wakeups()
    start = trio.current_time()
    assert await wakeups.wait(wakeups.ticket("q"), start + 30) is False
    assert trio.current_time() - start == 30
    assert wakeups.waiting == 0 and not wakeups._tickets


async def test_commit_listener_fires_the_queues_written(broker: Broker) -> None:
    consume = broker.consume
    ticket, other = consume.wakeups.ticket("orders"), consume.wakeups.ticket("billing")
    segment = SegmentWrite(1, ["m"], ["t"], [b"1"], [0], key=PartitionKey("orders", "p"))
    consume.on_commit([segment], [])
    assert ticket.is_set() and not other.is_set()


async def wait_for_pop(broker: Broker, queue: str, into: list[PopResult], **kw: object) -> None:
    into.append(await broker.pop(queue, wait=True, **kw))  # type: ignore[arg-type]


async def test_a_waiting_pop_wakes_when_a_push_commits(settings: Settings, queue: str) -> None:
    async with open_broker(settings.with_changes(pop_recheck_ms=NO_RECHECK)) as broker:
        got: list[PopResult] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(wait_for_pop, broker, queue, got, timeout_ms=30_000))
                await broker.consume.wakeups.until_waiting(1)
                pushed_at = trio.current_time()
                await broker.push([{"queue": queue, "payload": "wake up"}])
        assert [m.data for m in got[0].messages] == ["wake up"]
        assert trio.current_time() - pushed_at < 5  # far from the 30 s deadline


async def test_a_push_in_another_broker_process_wakes_a_waiting_pop(
    settings: Settings, queue: str
) -> None:
    quiet = settings.with_changes(pop_recheck_ms=NO_RECHECK)
    async with open_broker(quiet) as waiting, open_broker(quiet) as pushing:
        assert waiting.consume.listener is not None and waiting.consume.listener.connected
        got: list[PopResult] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(wait_for_pop, waiting, queue, got, timeout_ms=30_000))
                await waiting.consume.wakeups.until_waiting(1)
                await pushing.push([{"queue": queue, "payload": "from elsewhere"}])
        assert [m.data for m in got[0].messages] == ["from elsewhere"]


async def test_an_empty_long_poll_answers_at_its_deadline(broker: Broker, queue: str) -> None:
    start = trio.current_time()
    with trio.fail_after(10):
        result = await broker.pop(queue, wait=True, timeout_ms=300)
    elapsed = trio.current_time() - start
    assert not result
    assert 0.3 <= elapsed < 3


async def _lease_ends_soon(broker: Broker, lease_id: str | None) -> None:
    """The lease ``lease_id`` expires 300 ms from now instead of at the queue's lease time."""
    await broker.store.pool.run(  # type: ignore[attr-defined]
        lambda conn: conn.execute(
            "UPDATE queen.cursors SET lease_expires_at = now() + interval '300 ms'"
            " WHERE lease_id = %s",
            (lease_id,),
        )
    )


async def test_a_waiting_pop_rechecks_for_expired_leases(settings: Settings, queue: str) -> None:
    async with open_broker(settings.with_changes(pop_recheck_ms=50)) as broker:
        await broker.push([{"queue": queue, "payload": "held"}])
        held = await broker.pop(queue)
        await _lease_ends_soon(broker, held.lease_id)
        with trio.fail_after(10):
            again = await broker.pop(queue, wait=True, timeout_ms=8000)
        assert [m.id for m in again.messages] == [m.id for m in held.messages]


async def test_stop_waiting_answers_every_waiting_pop(broker: Broker, queue: str) -> None:
    got: list[PopResult] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(partial(wait_for_pop, broker, queue, got, timeout_ms=60_000))
            await broker.consume.wakeups.until_waiting(3)
            broker.consume.stop_waiting()
    assert len(got) == 3 and not any(got)
    assert not await broker.pop(queue, wait=True, timeout_ms=60_000)


async def test_a_client_that_disconnects_cancels_its_long_poll(broker: Broker, queue: str) -> None:
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(
                serve_app,
                create_app(broker),
                broker.settings,
                sock,
                shutdown_trigger=trio.sleep_forever,
            )
        )
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(
                f"GET /api/v1/pop/queue/{queue}?wait=true&timeout=60000 HTTP/1.1\r\n"
                "Host: test\r\n\r\n".encode()
            )
            await broker.consume.wakeups.until_waiting(1)
            await stream.aclose()
            await broker.consume.wakeups.until_waiting(0)
        nursery.cancel_scope.cancel()


# --- when a waiting pop looks again: what PostgreSQL says is pending --------------------------


async def _look(
    broker: Broker, queue: str, group: str = QUEUE_MODE, lease_id: str | None = None
) -> PopOutcome:
    request = PopRequest(queue=queue, consumer_group=group, wait=True)
    return await broker.consume.store.pop(
        request, Sizing(10, 10), lease_id or mint_id(), broker.settings.pop_max_bytes
    )


async def test_postgres_says_when_the_earliest_pending_partition_ripens(
    broker: Broker, queue: str
) -> None:
    await broker.push([{"queue": queue, "partition": "a", "payload": 1}])
    nothing_yet = await _look(broker, f"{queue}-none")  # no such queue: not known
    assert nothing_yet.delivered == [] and nothing_yet.ripe_in_s is None
    lease = mint_id()
    first = await _look(broker, queue, lease_id=lease)
    assert len(first.delivered) == 1 and first.ripe_in_s is None  # delivered: not asked
    leased = await _look(broker, queue)  # pending behind the lease (queue lease time 300 s)
    assert leased.delivered == [] and leased.ripe_in_s is not None
    assert 250 < leased.ripe_in_s <= 300
    [done] = await broker.ack(
        AckItem(
            first.delivered[0].transaction_id,
            first.delivered[0].partition_id,
            "completed",
            lease_id=lease,
        )
    )
    assert done.success, done
    drained = await _look(broker, queue)
    assert drained.delivered == [] and drained.ripe_in_s == PENDING_NONE
    other_group = await _look(broker, queue, "g-" + queue)  # a group still has it pending
    assert len(other_group.delivered) == 1


async def test_a_waiting_pop_takes_a_lease_at_its_expiry_not_at_the_recheck(
    settings: Settings, queue: str
) -> None:
    async with open_broker(settings.with_changes(pop_recheck_ms=NO_RECHECK)) as broker:
        await broker.push([{"queue": queue, "payload": "held"}])
        held = await broker.pop(queue)
        await _lease_ends_soon(broker, held.lease_id)
        start = trio.current_time()
        with trio.fail_after(10):
            again = await broker.pop(queue, wait=True, timeout_ms=30_000)
        assert [m.id for m in again.messages] == [m.id for m in held.messages]
        assert trio.current_time() - start < 5  # the lease's end, far before the re-check


async def test_a_seek_in_another_process_wakes_a_pop_that_had_nothing_pending(
    settings: Settings, queue: str
) -> None:
    group = f"g-{queue}"
    quiet = settings.with_changes(pop_recheck_ms=NO_RECHECK)
    async with open_broker(quiet) as waiting, open_broker(quiet) as seeking:
        await seeking.push([{"queue": queue, "payload": "again"}])
        first = await waiting.pop(queue, consumer_group=group, auto_ack=True)
        assert [m.data for m in first.messages] == ["again"]
        got: list[PopResult] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(
                        wait_for_pop,
                        waiting,
                        queue,
                        got,
                        consumer_group=group,
                        auto_ack=True,
                        timeout_ms=30_000,
                    )
                )
                await waiting.consume.wakeups.until_waiting(1)
                at = datetime.now(UTC) - timedelta(hours=1)
                await seeking.consume.seek(group, queue, SeekTarget(to_end=False, at=at))
        assert [m.data for m in got[0].messages] == ["again"]


def test_a_partition_ticket_is_set_by_its_partition_or_its_whole_queue() -> None:
    wakeups = Wakeups()
    mine, whole = wakeups.ticket("q", "a"), wakeups.ticket("q")
    before = wakeups.epoch("q", "a")
    wakeups.fire_partitions([("q", "b")])  # another partition: a pop of "a" sleeps on
    assert not mine.is_set() and whole.is_set()
    assert wakeups.epoch("q", "a") != before  # (counted: a look after it is not shared)
    wakeups.fire_partitions([("q", "a")])
    assert mine.is_set()
    again = wakeups.ticket("q", "a")
    assert again is not mine and not again.is_set()
    wakeups.fire(["q"])  # the queue as a whole: a NOTIFY, a released lease, a seek
    assert again.is_set()


async def test_a_lease_handed_back_in_another_process_wakes_a_pop_waiting_behind_it(
    settings: Settings, queue: str
) -> None:
    quiet = settings.with_changes(pop_recheck_ms=NO_RECHECK)
    async with open_broker(quiet) as waiting, open_broker(quiet) as acking:
        await acking.push([{"queue": queue, "payload": n} for n in ("first", "second")])
        held = await acking.pop(queue, batch=1)
        assert [m.data for m in held.messages] == ["first"]
        got: list[PopResult] = []
        with trio.fail_after(10):  # the lease would end in 300 s, the pop's own wait in 30 s
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(wait_for_pop, waiting, queue, got, timeout_ms=30_000))
                await waiting.consume.wakeups.until_waiting(1)
                [done] = await acking.ack(
                    AckItem(
                        held.messages[0].transaction_id,
                        held.messages[0].partition_id,
                        "retry",
                        lease_id=held.lease_id,
                    )
                )
                assert done.success and done.lease_released
        assert [m.data for m in got[0].messages] == ["first"]  # handed back: delivered again

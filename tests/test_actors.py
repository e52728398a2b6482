"""Partition actors, batcher and supervisor against the in-memory store, in virtual time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from queen import open_broker
from queen.actors.messages import PushRequest
from queen.actors.policy import may_spread, spread_count
from queen.actors.resolver import PartitionResolver
from queen.broker import Broker
from queen.ids import NIL_UUID, mint_ids
from queen.model import PartitionKey, Status
from queen.primitives import Parking, Reply, ReplyGroup
from queen.settings import Settings
from tests.fakes import MemoryStore

IDLE_S = 30.0


def item(partition: str, tx: str | None = None, payload: object = 1, queue: str = "q") -> dict:
    body: dict = {"queue": queue, "partition": partition, "payload": payload}
    if tx is not None:
        body["transactionId"] = tx
    return body


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def broker(store: MemoryStore, tmp_path) -> AsyncIterator[Broker]:
    settings = Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path),
        actor_idle_timeout_s=IDLE_S,
        write_concurrency=1,
    )
    async with open_broker(settings, store=store, spool=False) as b:
        yield b


@pytest.fixture
async def wide_broker(store: MemoryStore, tmp_path) -> AsyncIterator[Broker]:
    """A broker whose batcher runs several transactions at once, so only the partition actor
    keeps a partition to one write in flight."""
    settings = Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path),
        actor_idle_timeout_s=IDLE_S,
        write_concurrency=4,
    )
    async with open_broker(settings, store=store, spool=False) as b:
        yield b


async def test_one_write_in_flight_per_partition(wide_broker: Broker, store: MemoryStore) -> None:
    gate = store.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wide_broker.push, [item("p1", "first")])
        await trio.testing.wait_all_tasks_blocked()  # p1's first write is held at the gate
        for i in range(20):
            nursery.start_soon(wide_broker.push, [item("p1", f"t{i}"), item("p2", f"t{i}")])
        await trio.testing.wait_all_tasks_blocked()
        # The batcher had room for more transactions and used it (p2 is written beside p1),
        # yet p1 never had a second write in flight.
        assert store.writes_started >= 2
        assert sum(store.in_flight.values()) >= 2
        assert all(n <= 1 for n in store.max_in_flight.values())
        gate.set()
    assert set(store.max_in_flight.values()) == {1}
    total = sum(len(s.message_ids) for s in store.segments)
    assert total == 41
    stored_p1 = [t for s in store.segments_of("p1") for t in s.transaction_ids]
    assert stored_p1[0] == "first"
    assert sorted(stored_p1[1:]) == sorted(f"t{i}" for i in range(20))


async def test_hand_offs_to_actors_take_no_checkpoint(broker: Broker) -> None:
    """Queuing a request with an actor (new or running) never yields to another task, so all
    partitions of a body are queued before any actor runs, and the registry is never seen
    between look-up and registration."""
    supervisor = broker.supervisor
    requests = [
        PushRequest(message_ids=mint_ids(1), transaction_ids=[f"t{i}"], payloads=[b"1"])
        for i in range(6)
    ]
    with trio.testing.assert_no_checkpoints():
        for i, request in enumerate(requests):
            await supervisor.submit(PartitionKey("q", f"p{i % 3}"), request)
    assert supervisor.active_partitions == 3
    for request in requests:
        assert (await request.reply.wait()).status is Status.QUEUED


async def test_submitting_to_a_busy_actor_never_waits(broker: Broker, store: MemoryStore) -> None:
    """A partition's inbox has no bound of its own: while its write is held, thousands of
    requests are handed over without a checkpoint (each producer's request is held by its
    producer until answered, wherever it waits; see "Backpressure and memory")."""
    store.gate = trio.Event()
    supervisor = broker.supervisor
    key = PartitionKey("q", "p")
    first = PushRequest(message_ids=mint_ids(1), transaction_ids=["first"], payloads=[b"1"])
    await supervisor.submit(key, first)
    await trio.testing.wait_all_tasks_blocked()  # its write is held at the gate
    requests = [
        PushRequest(message_ids=mint_ids(1), transaction_ids=[f"t{i}"], payloads=[b"1"])
        for i in range(5_000)
    ]
    with trio.CancelScope() as scope:
        scope.cancel()  # a submit that would wait (or take a checkpoint) is cancelled at once
        for request in requests:
            await supervisor.submit(key, request)
    assert not scope.cancelled_caught
    actor = supervisor.actor(key)
    assert actor is not None and actor.pending == 5_000
    store.gate.set()
    for request in [first, *requests]:
        assert (await request.reply.wait()).status is Status.QUEUED


async def test_a_flood_on_one_partition_is_written_in_full_segments_in_arrival_order(
    store: MemoryStore, tmp_path
) -> None:
    """One write in flight; the requests that arrived meanwhile are packed into the next
    segments, each at most ``segment_max_items`` items, oldest first."""
    settings = Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path),
        segment_max_items=100,
        write_concurrency=1,
    )
    async with open_broker(settings, store=store, spool=False) as broker:
        gate = store.gate = trio.Event()
        answers: dict[str, str] = {}

        async def push(tx: str) -> None:
            [answer] = await broker.push([item("p", tx)])
            answers[tx] = answer.status

        async with trio.open_nursery() as nursery:
            nursery.start_soon(push, "first")
            await trio.testing.wait_all_tasks_blocked()  # its write is held at the gate
            for i in range(250):  # they arrive in this order
                nursery.start_soon(push, f"t{i:03}")
                await trio.testing.wait_all_tasks_blocked()
            gate.set()
    segments = store.segments_of("p")
    assert [s.request_count for s in segments] == [1, 100, 100, 50]
    assert [t for s in segments[1:] for t in s.transaction_ids] == [f"t{i:03}" for i in range(250)]
    assert set(answers.values()) == {"queued"} and len(answers) == 251


async def test_parking_wakes_without_a_checkpoint_and_leaves_when_cancelled() -> None:
    parking = Parking()
    with trio.testing.assert_no_checkpoints():
        parking.wake()  # nobody parked: nothing happens
    woken: list[str] = []

    async def parked(name: str) -> None:
        await parking.park()
        woken.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parked, "first")
        await trio.testing.wait_all_tasks_blocked()
        assert parking.task is not None
        with trio.testing.assert_no_checkpoints():
            parking.wake()
        assert parking.task is None and woken == []  # rescheduled, not run yet
    assert woken == ["first"]
    with trio.move_on_after(1) as scope:
        scope.cancel()
        await parking.park()
    assert scope.cancelled_caught and parking.task is None


async def test_a_reply_group_wakes_its_waiter_once_every_reply_is_set() -> None:
    group = ReplyGroup(2)
    first, second = Reply[int](group), Reply[int](group)
    woken: list[int] = []

    async def waiter() -> None:
        await group.wait()
        woken.append(first.result() + second.result())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        first.set(1)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == []  # one reply still missing
        second.set(2)
    assert woken == [3]
    with trio.testing.assert_checkpoints():
        await ReplyGroup(0).wait()  # nothing to wait for: a checkpoint all the same


async def test_requests_arriving_during_a_write_are_coalesced(
    broker: Broker, store: MemoryStore
) -> None:
    gate = store.gate = trio.Event()
    results: dict[int, list] = {}

    async def push(i: int) -> None:
        results[i] = await broker.push([item("p", f"t{i}a"), item("p", f"t{i}b")])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(push, 0)
        await trio.testing.wait_all_tasks_blocked()  # first write is held at the gate
        for i in range(1, 6):  # five more wait in the inbox, in this order
            nursery.start_soon(push, i)
            await trio.testing.wait_all_tasks_blocked()
        gate.set()
    segments = store.segments_of("p")
    assert [s.request_count for s in segments] == [1, 5]
    assert segments[1].transaction_ids == [f"t{i}{s}" for i in range(1, 6) for s in "ab"]
    assert [s.first_offset for s in segments] == [0, 2]
    assert all(r.status == "queued" for rs in results.values() for r in rs)


async def test_body_order_is_kept_at_consecutive_offsets(
    broker: Broker, store: MemoryStore
) -> None:
    txs = [f"k{i}" for i in range(20)]
    results = await broker.push([item("p", tx, payload=i) for i, tx in enumerate(txs)])
    (segment,) = store.segments_of("p")
    assert segment.transaction_ids == txs
    assert segment.payloads == [str(i).encode() for i in range(20)]
    assert segment.message_ids == [r.message_id for r in results]
    assert segment.message_ids == sorted(segment.message_ids)


async def test_first_wins_inside_a_body(broker: Broker, store: MemoryStore) -> None:
    results = await broker.push([item("p", "x"), item("p", "y"), item("p", "x"), item("q", "x")])
    assert [r.status for r in results] == ["queued", "queued", "duplicate", "queued"]
    assert results[2].message_id == results[0].message_id
    assert results[3].message_id != results[0].message_id
    (segment,) = store.segments_of("p")
    assert segment.transaction_ids == ["x", "y"]


async def test_first_wins_inside_a_coalesced_segment(broker: Broker, store: MemoryStore) -> None:
    gate = store.gate = trio.Event()
    results: dict[str, list] = {}

    async def push(name: str, tx: str) -> None:
        results[name] = await broker.push([item("p", tx)])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(push, "warmup", "w")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(push, "first", "same")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(push, "second", "same")
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert results["first"][0].status == "queued"
    assert results["second"][0].status == "duplicate"
    assert results["second"][0].message_id == results["first"][0].message_id
    assert [s.request_count for s in store.segments_of("p")] == [1, 2]


async def test_duplicate_of_stored_history_names_the_original(
    broker: Broker, store: MemoryStore
) -> None:
    first = await broker.push([item("p", "order-1")])
    again = await broker.push([item("p", "order-1")])
    assert again[0].status == "duplicate"
    assert again[0].message_id == first[0].message_id
    store.segments.clear()  # "retention" removed the original's segment
    third = await broker.push([item("p", "order-1")])
    assert third[0].status == "duplicate"
    assert third[0].message_id == NIL_UUID


async def test_idle_actor_stops_and_a_new_one_starts(
    broker: Broker, store: MemoryStore, autojump_clock: trio.testing.MockClock
) -> None:
    key = PartitionKey("q", "p")
    await broker.push([item("p", "a")])
    first_actor = broker.supervisor.actor(key)
    assert first_actor is not None
    await trio.sleep(IDLE_S / 2)
    assert broker.supervisor.actor(key) is first_actor  # still inside its idle time
    await trio.sleep(IDLE_S)
    assert broker.supervisor.actor(key) is None
    assert broker.metrics.actors_stopped_idle == 1
    assert broker.metrics.actors_active == 0

    results = await broker.push([item("p", "b")])
    assert results[0].status == "queued"
    second_actor = broker.supervisor.actor(key)
    assert second_actor is not None and second_actor is not first_actor
    assert broker.metrics.actors_started == 2
    assert [s.first_offset for s in store.segments_of("p")] == [0, 1]


async def _pushed_then_stopped_idle(broker: Broker, partition: str) -> None:
    """One push to ``partition`` of "q", then its actor's idle time passes and it stops."""
    await broker.push([item(partition, "a")])
    await trio.sleep(IDLE_S * 2)
    assert broker.supervisor.actor(PartitionKey("q", partition)) is None


async def test_an_actor_started_again_takes_its_partition_id_from_memory(
    broker: Broker, store: MemoryStore, autojump_clock: trio.testing.MockClock
) -> None:
    await _pushed_then_stopped_idle(broker, "p")
    asked = store.resolve_calls
    [answer] = await broker.push([item("p", "b")])
    assert answer.status == "queued"
    assert broker.metrics.actors_started == 2
    assert store.resolve_calls == asked  # the id came from the resolver's memory
    assert [s.first_offset for s in store.segments_of("p")] == [0, 1]


async def test_a_remembered_id_whose_partition_was_deleted_is_asked_for_again(
    broker: Broker, store: MemoryStore, autojump_clock: trio.testing.MockClock
) -> None:
    key = PartitionKey("q", "p")
    await _pushed_then_stopped_idle(broker, "p")
    old_id = store.partitions[key]
    store.vanishing["p"] = 1  # its queue was deleted meanwhile
    asked = store.resolve_calls
    [answer] = await broker.push([item("p", "b")])
    assert answer.status == "queued"
    assert store.resolve_calls == asked + 1  # the remembered id was not trusted twice
    new_id = store.partitions[key]
    assert new_id != old_id
    assert [(s.partition_id, s.transaction_ids) for s in store.segments] == [
        (old_id, ["a"]),
        (new_id, ["b"]),
    ]
    [again] = await broker.push([item("p", "c")])  # and the new id is the one remembered
    assert again.status == "queued"
    assert store.resolve_calls == asked + 1


async def test_the_resolver_remembers_a_bounded_number_of_ids() -> None:
    asked: list[list[str]] = []

    async def ensure(keys) -> list[int]:
        await trio.lowlevel.checkpoint()
        asked.append([k.partition for k in keys])
        return [ord(k.partition) for k in keys]

    resolver = PartitionResolver(ensure, remembered=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(resolver.run)
        for name in "abca":  # a, b, c asked; "a", the oldest learned, is forgotten for "c"
            assert await resolver.resolve(PartitionKey("q", name)) == ord(name)
        assert await resolver.resolve(PartitionKey("q", "c")) == ord("c")  # remembered
        assert await resolver.resolve(PartitionKey("q", "c"), fresh=True) == ord("c")
        nursery.cancel_scope.cancel()
    assert asked == [["a"], ["b"], ["c"], ["a"], ["c"]]


async def test_push_racing_an_idle_stop_is_not_lost(
    broker: Broker, store: MemoryStore, autojump_clock: trio.testing.MockClock
) -> None:
    await broker.push([item("p", "a")])
    # Land exactly on the idle deadline: the push and the stop decision meet.
    await trio.sleep(IDLE_S)
    results = await broker.push([item("p", "b")])
    assert results[0].status == "queued"
    assert [t for s in store.segments_of("p") for t in s.transaction_ids] == ["a", "b"]


async def test_reaper_spares_an_actor_just_handed_a_request(
    broker: Broker, store: MemoryStore
) -> None:
    key = PartitionKey("q", "p")
    await broker.push([item("p", "a")])
    actor = broker.supervisor.actor(key)
    assert actor is not None
    await trio.testing.wait_all_tasks_blocked()  # parked on its empty inbox
    later = trio.current_time() + IDLE_S
    request = PushRequest(message_ids=mint_ids(1), transaction_ids=["b"], payloads=[b"2"])
    await actor.submit(request)  # handed straight to the parked actor, which has not run yet
    assert not actor.stop_if_idle(later)
    assert (await request.reply.wait()).status is Status.QUEUED
    assert broker.supervisor.actor(key) is actor
    await trio.testing.wait_all_tasks_blocked()
    now = trio.current_time()
    assert not actor.stop_if_idle(now + IDLE_S / 2)  # parked, but not for long enough
    assert broker.supervisor.reap_idle(now + IDLE_S) == 1
    assert broker.supervisor.actor(key) is None
    assert broker.metrics.actors_stopped_idle == 1
    with pytest.raises(trio.BrokenResourceError):
        await actor.submit(request)
    assert [t for s in store.segments_of("p") for t in s.transaction_ids] == ["a", "b"]


class TaskSteps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps: dict[str, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] = self.steps.get(task.name, 0) + 1


async def test_a_stored_write_is_answered_from_its_transaction_without_waking_its_actor(
    broker: Broker,
) -> None:
    await broker.push([item("p", "warm")])  # actor up, partition known
    await trio.testing.wait_all_tasks_blocked()
    counter = TaskSteps()
    trio.lowlevel.add_instrument(counter)
    try:
        for i in range(5):
            [answer] = await broker.push([item("p", f"t{i}")])
            assert answer.status == "queued"
            await trio.testing.wait_all_tasks_blocked()
    finally:
        trio.lowlevel.remove_instrument(counter)
    # one step per write: to take the request; the answer came from the batcher's task
    assert counter.steps["actor:q/p"] == 5


@pytest.mark.parametrize(("vanishing", "status"), [(1, "queued"), (2, "failed")])
async def test_a_write_whose_partition_was_deleted_creates_it_again_and_retries_once(
    broker: Broker, store: MemoryStore, vanishing: int, status: str
) -> None:
    await broker.push([item("p", "a")])
    store.vanishing["p"] = vanishing  # its queue is deleted under the next write(s)
    [answer] = await broker.push([item("p", "b")])
    assert answer.status == status
    stored = [t for s in store.segments_of("p") for t in s.transaction_ids]
    assert stored == (["b"] if status == "queued" else [])
    [again] = await broker.push([item("p", "c")])  # the actor goes on
    assert again.status == "queued"
    assert broker.metrics.actor_crashes == 0


async def test_a_full_batcher_queue_makes_actors_wait_for_room(
    store: MemoryStore, tmp_path
) -> None:
    settings = Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path),
        write_concurrency=1,
        batch_queue_size=1,
    )
    async with open_broker(settings, store=store, spool=False) as broker:
        for i in range(4):  # actors up and partitions known
            await broker.push([item(f"p{i}", "warm")])
        gate = store.gate = trio.Event()
        before = len(store.transactions)
        results: list = []

        async def push(body: list) -> None:
            results.extend(await broker.push(body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(push, [item("p0", "held")])
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(push, [item(f"p{i}", "waiting") for i in range(1, 4)])
            await trio.testing.wait_all_tasks_blocked()
            # one write held, one queued (the bound), two waiting for room
            assert store.writes_started == before + 1
            assert broker.supervisor.batcher.queued == 1
            gate.set()
    assert [r.status for r in results] == ["queued"] * 4
    written = [pid for t in store.transactions[before:] for pid in t]
    assert len(written) == len(set(written)) == 4  # every write stored, once


async def test_failing_partition_does_not_affect_another(
    broker: Broker, store: MemoryStore
) -> None:
    store.failing.add("bad")
    gate = store.gate = trio.Event()
    results: dict[str, list] = {}

    async def push(name: str, body: list) -> None:
        results[name] = await broker.push(body)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(push, "warmup", [item("warm", "w")])
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(push, "mixed", [item("good", "g1"), item("bad", "b1")])
        nursery.start_soon(push, "good", [item("good2", "g2")])
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert [r.status for r in results["mixed"]] == ["queued", "failed"]
    assert results["good"][0].status == "queued"
    assert broker.metrics.push_transaction_failures >= 1
    assert not store.segments_of("bad")
    # the failed partition's actor lives on and writes again once the store recovers
    store.failing.clear()
    again = await broker.push([item("bad", "b1")])
    assert again[0].status == "queued"


async def test_crashing_actor_is_contained(broker: Broker, store: MemoryStore) -> None:
    store.crash_on_resolve.add("boom")
    results = await broker.push([item("boom", "x"), item("fine", "y")])
    assert [r.status for r in results] == ["failed", "queued"]
    assert broker.metrics.actor_crashes == 1
    assert broker.supervisor.actor(PartitionKey("q", "boom")) is None
    assert broker.supervisor.actor(PartitionKey("q", "fine")) is not None
    store.crash_on_resolve.clear()
    again = await broker.push([item("boom", "x")])
    assert again[0].status == "queued"
    assert broker.metrics.actors_started == 3


async def test_without_spool_an_unavailable_store_fails_items(
    broker: Broker, store: MemoryStore
) -> None:
    await broker.push([item("p", "a")])
    store.unavailable = True
    results = await broker.push([item("p", "b"), item("other", "c")])
    assert [r.status for r in results] == ["failed", "failed"]
    assert broker.metrics.actor_crashes == 0
    store.unavailable = False
    results = await broker.push([item("p", "b"), item("other", "c")])
    assert [r.status for r in results] == ["queued", "queued"]


async def test_many_partitions_share_one_transaction(broker: Broker, store: MemoryStore) -> None:
    for i in range(10):  # actors up and partitions known
        await broker.push([item(f"p{i}", "warm")])
    gate = store.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.push, [item("p0", "held")])
        await trio.testing.wait_all_tasks_blocked()
        for i in range(1, 10):
            nursery.start_soon(broker.push, [item(f"p{i}", "together")])
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert len(store.transactions[-1]) == 9
    assert broker.metrics.max_partitions_per_transaction == 9


@pytest.mark.parametrize(
    ("max_items", "max_bytes", "sizes"), [(3, 1000, [3, 2]), (100, 2, [2, 2, 1])]
)
async def test_a_transaction_stops_growing_at_its_item_or_byte_limit(
    store: MemoryStore, tmp_path, max_items: int, max_bytes: int, sizes: list[int]
) -> None:
    settings = Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path),
        write_concurrency=1,
        batch_max_items=max_items,
        batch_max_bytes=max_bytes,
    )
    async with open_broker(settings, store=store, spool=False) as broker:
        for i in range(6):  # actors up and partitions known
            await broker.push([item(f"p{i}", "warm")])
        gate = store.gate = trio.Event()
        before = len(store.transactions)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.push, [item("p0", "held")])
            await trio.testing.wait_all_tasks_blocked()
            for i in range(1, 6):  # one-byte payloads, one item each
                nursery.start_soon(broker.push, [item(f"p{i}", "ready")])
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert [len(t) for t in store.transactions[before:]] == [1, *sizes]


@pytest.mark.parametrize(("spread", "sizes"), [(0, [12]), (2, [4, 4, 4])])
async def test_ready_writes_are_spread_over_free_slots_when_asked(
    store: MemoryStore, tmp_path, spread: int, sizes: list[int]
) -> None:
    settings = Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path),
        write_concurrency=4,
        batch_spread_min_items=spread,
    )
    async with open_broker(settings, store=store, spool=False) as broker:
        for i in range(13):  # actors up and partitions known
            await broker.push([item(f"p{i}", "warm")])
        gate = store.gate = trio.Event()
        before = len(store.transactions)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.push, [item("p0", "held")])  # one slot taken
            await trio.testing.wait_all_tasks_blocked()
            for i in range(1, 13):
                nursery.start_soon(broker.push, [item(f"p{i}", "together")])
            await trio.testing.wait_all_tasks_blocked()
            # with spreading, the 12 ready writes went out as three transactions at once
            assert sum(store.in_flight.values()) == 13
            gate.set()
        assert sorted(len(t) for t in store.transactions[before:]) == sorted([1, *sizes])
        assert len(store.segments) == 26  # every write stored once


def test_spread_policy() -> None:
    assert spread_count([1] * 64, 3, min_items=16) == 16
    assert spread_count([10] * 32, 1, min_items=16) == 16
    assert spread_count([160] * 10, 3, min_items=16) == 3
    assert spread_count([1] * 31, 3, min_items=16) == 31  # not enough for two shares
    assert spread_count([1] * 40, 3, min_items=16) == 16  # never smaller than the minimum
    assert spread_count([1] * 64, 0, min_items=16) == 64  # no free slot
    assert spread_count([1] * 64, 3, min_items=0) == 64  # off
    assert spread_count([5000, 1, 1], 3, min_items=16) == 1
    assert spread_count([], 3, min_items=16) == 0
    # many small writes, too few frames to share by frames: shared by count
    assert spread_count([1] * 64, 3, min_items=800, min_writes=32) == 32
    assert spread_count([1] * 63, 3, min_items=800, min_writes=32) == 63
    assert spread_count([1] * 200, 3, min_items=800, min_writes=32) == 50
    assert spread_count([1] * 64, 0, min_items=800, min_writes=32) == 64
    # writes of several frames (multi-partition pushes) are not shared by count
    assert spread_count([3] * 100, 3, min_items=800, min_writes=32) == 100
    # enough frames: the frame rule decides
    assert spread_count([10] * 160, 3, min_items=800, min_writes=32) == 80
    # may_spread is necessary: where it says no, spread_count keeps every write
    for sizes in ([1] * 63, [1] * 64, [12] * 66, [3] * 100, [800, 800], [5000, 1], [9] * 20):
        for min_items, min_writes in ((800, 32), (16, 0), (0, 32), (0, 0)):
            rules = {"min_items": min_items, "min_writes": min_writes}
            if not may_spread(sum(sizes), len(sizes), **rules):
                assert spread_count(sizes, 3, **rules) == len(sizes), (sizes, rules)
    assert may_spread(1600, 2, min_items=800, min_writes=32)
    assert may_spread(64, 64, min_items=800, min_writes=32)


async def test_dedup_window_zero_stores_every_repeat(tmp_path) -> None:
    store = MemoryStore(window_s=0)
    settings = Settings(database_url="memory://", file_buffer_dir=str(tmp_path))
    async with open_broker(settings, store=store) as broker:
        results = await broker.push([item("p", "x"), item("p", "x")])
        again = await broker.push([item("p", "x")])
    assert [r.status for r in results + again] == ["queued"] * 3
    assert len({r.message_id for r in results + again}) == 3


async def release_later(gate: trio.Event) -> None:
    await trio.sleep(1)
    gate.set()


async def test_shutdown_lets_accepted_pushes_finish(
    store: MemoryStore, tmp_path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = Settings(database_url="memory://", file_buffer_dir=str(tmp_path))
    gate = store.gate = trio.Event()
    results: list = []

    async def push(broker: Broker) -> None:
        results.extend(await broker.push([item("p", "late")]))

    async with trio.open_nursery() as outer:
        async with open_broker(settings, store=store) as broker:
            outer.start_soon(push, broker)
            await trio.testing.wait_all_tasks_blocked()
            outer.start_soon(release_later, gate)  # released while the broker is closing
        assert broker.closing
    assert [r.status for r in results] == ["queued"]


async def test_commit_listeners_see_every_committed_segment(
    broker: Broker, store: MemoryStore
) -> None:
    seen: list[tuple[str, int]] = []

    def listener(segments, results) -> None:
        seen.extend((s.key.partition, len(s)) for s in segments if s.key is not None)

    def broken(segments, results) -> None:
        raise RuntimeError("a listener bug must not break pushes")

    broker.supervisor.batcher.add_commit_listener(broken)
    broker.supervisor.batcher.add_commit_listener(listener)
    results = await broker.push([item("a", "1"), item("a", "2"), item("b", "3")])
    assert [r.status for r in results] == ["queued"] * 3
    assert sorted(seen) == [("a", 2), ("b", 1)]


async def test_partitions_becoming_active_together_are_resolved_in_one_call(
    broker: Broker, store: MemoryStore
) -> None:
    gate = store.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker.push, [item("first", "a")])
        await trio.testing.wait_all_tasks_blocked()  # "first" resolved, its write held
        calls_before = store.resolve_calls
        for i in range(20):
            nursery.start_soon(broker.push, [item(f"new-{i}", "x")])
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert store.resolve_calls - calls_before <= 2  # not one per partition
    assert all(store.segments_of(f"new-{i}") for i in range(20))


@pytest.mark.parametrize("reaper_first", [True, False])
async def test_reaper_and_a_producer_meet_in_either_order(
    broker: Broker, store: MemoryStore, reaper_first: bool
) -> None:
    key = PartitionKey("q", "p")
    await broker.push([item("p", "a")])
    await trio.testing.wait_all_tasks_blocked()  # the actor is parked on its empty inbox
    first = broker.supervisor.actor(key)
    assert first is not None
    idle_deadline = trio.current_time() + IDLE_S
    request = PushRequest(message_ids=mint_ids(1), transaction_ids=["b"], payloads=[b"2"])
    sequencer = trio.testing.Sequencer()
    reaped: list[int] = []

    async def reaper() -> None:
        async with sequencer(0 if reaper_first else 1):
            reaped.append(broker.supervisor.reap_idle(idle_deadline))

    async def producer() -> None:
        async with sequencer(1 if reaper_first else 0):
            await broker.supervisor.submit(key, request)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reaper)
        nursery.start_soon(producer)
    assert (await request.reply.wait()).status is Status.QUEUED
    serving = broker.supervisor.actor(key)
    if reaper_first:  # stopped while idle; the producer started a fresh actor
        assert reaped == [1] and serving is not None and serving is not first
    else:  # handed a request before the reaper looked: spared
        assert reaped == [0] and serving is first
    assert [t for s in store.segments_of("p") for t in s.transaction_ids] == ["a", "b"]

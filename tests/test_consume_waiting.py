"""The consume service's waiting logic on virtual time, over the in-memory consume store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing
from trio_util import RepeatedEvent

from queen.consume.results import PopResult
from queen.consume.service import ConsumeService
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.model import PartitionKey
from queen.records import PopRequest
from queen.settings import Settings
from queen.storage.base import SegmentWrite
from queen.storage.consume import PENDING_NONE
from tests.fakes import MemoryConsumeStore, idle_push_service

TIMEOUT_MS = 30_000


@pytest.fixture
def store() -> MemoryConsumeStore:
    return MemoryConsumeStore()


async def _service(
    store: MemoryConsumeStore, tmp_path: object, recheck_ms: float, linger_ms: float = 0.0
) -> AsyncIterator[ConsumeService]:
    settings = Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path),
        pop_recheck_ms=recheck_ms,
        pop_linger_ms=linger_ms,
    )
    switches = MaintenanceSwitch(store, refresh_s=1.0, changed=RepeatedEvent())  # type: ignore[arg-type]
    service = ConsumeService(
        store,  # type: ignore[arg-type]
        settings,
        Metrics(),
        switches=switches,
        push=idle_push_service(settings),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        yield service
        nursery.cancel_scope.cancel()


@pytest.fixture
async def service(store: MemoryConsumeStore, tmp_path: object) -> AsyncIterator[ConsumeService]:
    """Re-checks rarer than any pop's timeout: only a wake-up can end a wait early."""
    async for s in _service(store, tmp_path, recheck_ms=10 * TIMEOUT_MS):
        yield s


@pytest.fixture
async def rechecking(store: MemoryConsumeStore, tmp_path: object) -> AsyncIterator[ConsumeService]:
    """Re-checks every second and is never woken."""
    async for s in _service(store, tmp_path, recheck_ms=1000):
        yield s


def _waiting_pop(queue: str) -> PopRequest:
    return PopRequest(queue=queue, wait=True, timeout_ms=TIMEOUT_MS)


async def _finds_unannounced(service: ConsumeService, store: MemoryConsumeStore) -> None:
    """A waiting pop of "q" delivers a message stored while it waits that nobody announced
    (it ripened, or another process pushed it unheard)."""
    results = []

    async def pop() -> None:
        results.append(await service.pop(_waiting_pop("q")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pop)
        await trio.testing.wait_all_tasks_blocked()
        pushed = store.add("q")  # nobody is told
    assert [d.message_id for d in results[0].delivered] == [pushed.message_id]


async def test_a_waiting_pop_is_woken_by_a_push_of_another_process(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        results = []

        async def pop() -> None:
            results.append(await service.pop(_waiting_pop("q")))

        nursery.start_soon(pop)
        await trio.testing.wait_all_tasks_blocked()
        assert service.wakeups.waiting == 1 and store.pop_calls == 1
        pushed = store.add("q")
        store.notify("q")
    assert [d.message_id for d in results[0].delivered] == [pushed.message_id]
    assert trio.current_time() < TIMEOUT_MS / 1000  # answered on the wake-up, not the deadline


async def test_a_push_on_another_queue_does_not_end_the_wait(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        results = []

        async def pop() -> None:
            results.append(await service.pop(_waiting_pop("q")))

        nursery.start_soon(pop)
        await trio.testing.wait_all_tasks_blocked()
        store.add("other")
        store.notify("other")
        await trio.testing.wait_all_tasks_blocked()
        assert service.wakeups.waiting == 1 and not results
    assert not results[0]
    assert store.pop_calls == 2  # one query at the start, one at the deadline: none in between
    assert store.messages["other"]  # never delivered to a pop of "q"


async def test_an_unannounced_message_is_found_at_the_next_recheck(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    await _finds_unannounced(rechecking, store)
    assert store.pop_calls == 2


async def test_a_waiting_pop_answers_nothing_at_its_deadline(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    result = await rechecking.pop(_waiting_pop("q"))
    assert not result
    assert trio.current_time() >= TIMEOUT_MS / 1000
    assert store.pop_calls > 1  # it kept re-checking while it waited


async def test_stop_waiting_answers_every_waiting_pop_at_once(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        results = []

        async def pop(queue: str) -> None:
            results.append(await service.pop(_waiting_pop(queue)))

        nursery.start_soon(pop, "a")
        nursery.start_soon(pop, "b")
        await trio.testing.wait_all_tasks_blocked()
        assert service.wakeups.waiting == 2
        service.stop_waiting()
    assert len(results) == 2 and not any(results)
    assert trio.current_time() < TIMEOUT_MS / 1000
    store.add("a")
    assert not await service.pop(_waiting_pop("a"))  # new pops find nothing
    assert store.pop_calls == 2


async def test_pop_maintenance_answers_nothing_without_querying(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    store.add("q")
    await service.set_pop_maintenance(True)
    assert store.state["pop_maintenance_mode"] == {"enabled": True}
    assert not await service.pop(PopRequest(queue="q"))
    assert store.pop_calls == 0
    await service.set_pop_maintenance(False)
    assert await service.pop(PopRequest(queue="q"))


async def test_pop_maintenance_wakes_the_waiting_pops_to_answer_nothing(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        results = []

        async def pop() -> None:
            results.append(await service.pop(_waiting_pop("q")))

        nursery.start_soon(pop)
        await trio.testing.wait_all_tasks_blocked()
        store.add("q")  # unannounced: only the re-check at the deadline would find it
        await service.set_pop_maintenance(True)
    assert not results[0]
    assert trio.current_time() < TIMEOUT_MS / 1000
    assert store.pop_calls == 1


async def test_one_cache_holds_both_switches_set_by_another_process(
    store: MemoryConsumeStore,
) -> None:
    switches = MaintenanceSwitch(store, refresh_s=1.0, changed=RepeatedEvent())  # type: ignore[arg-type]
    store.state["pop_maintenance_mode"] = {"enabled": True}
    store.state["maintenance_mode"] = {"enabled": True}
    assert not switches.pop_enabled and not switches.enabled  # no read on the way
    await switches.load()
    assert switches.pop_enabled and switches.enabled
    store.state["pop_maintenance_mode"] = {"enabled": False}
    await switches.load()
    assert not switches.pop_enabled and switches.enabled


async def _wait_many(service: ConsumeService, requests: list[PopRequest]) -> list[object]:
    results: list[object] = []
    async with trio.open_nursery() as nursery:
        for request in requests:

            async def pop(request: PopRequest = request) -> None:
                results.append(await service.pop(request))

            nursery.start_soon(pop)
    return results


async def test_like_waiting_pops_share_their_rechecks(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    pops = 10
    results = await _wait_many(rechecking, [_waiting_pop("q") for _ in range(pops)])
    assert len(results) == pops and not any(results)
    seconds = TIMEOUT_MS // 1000
    # each pop's first query, then about one query a second between them all (and a last
    # look at the deadline); not one a second for each of them
    assert store.pop_calls <= pops + 2 * (seconds + 1), store.pop_calls
    assert rechecking.metrics.pop_rechecks_shared >= (pops - 2) * (seconds - 1)


async def test_pops_of_different_kinds_do_not_share_their_rechecks(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    kinds = [
        _waiting_pop("q"),
        PopRequest(queue="q", partition="p1", wait=True, timeout_ms=TIMEOUT_MS),
        PopRequest(queue="q", consumer_group="g", wait=True, timeout_ms=TIMEOUT_MS),
    ]
    await _wait_many(rechecking, kinds)
    seconds = TIMEOUT_MS // 1000
    assert rechecking.metrics.pop_rechecks_shared == 0
    assert store.pop_calls >= len(kinds) * seconds  # each re-checked every second itself


def _start_timed_pops(
    nursery: trio.Nursery,
    service: ConsumeService,
    count: int,
    answered: list[tuple[float, object]],
) -> None:
    """``count`` waiting pops of "q"; each adds (when it answered, its result) to ``answered``."""

    async def pop() -> None:
        result = await service.pop(_waiting_pop("q"))
        answered.append((trio.current_time(), result))

    for _ in range(count):
        nursery.start_soon(pop)


async def test_an_unannounced_message_reaches_one_of_many_sharing_pops_within_a_recheck(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    answered: list[tuple[float, object]] = []
    async with trio.open_nursery() as nursery:
        _start_timed_pops(nursery, rechecking, 8, answered)
        await trio.sleep(7.25)  # several shared re-checks have happened
        assert rechecking.metrics.pop_rechecks_shared > 0
        added_at = trio.current_time()
        pushed = store.add("q")  # nobody is told
    [(at, got)] = [(t, r) for t, r in answered if r]
    assert [d.message_id for d in got.delivered] == [pushed.message_id]  # type: ignore[attr-defined]
    assert at - added_at <= 1.0 + 1e-6


async def test_a_push_wakes_pops_that_share_their_rechecks(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    answered: list[tuple[float, object]] = []
    async with trio.open_nursery() as nursery:
        _start_timed_pops(nursery, rechecking, 4, answered)
        await trio.sleep(5.5)
        await trio.testing.wait_all_tasks_blocked()
        assert rechecking.metrics.pop_rechecks_shared > 0
        pushed_at = trio.current_time()
        pushed = store.add("q")
        store.notify("q")
    [(at, got)] = [(t, r) for t, r in answered if r]
    assert [d.message_id for d in got.delivered] == [pushed.message_id]  # type: ignore[attr-defined]
    assert at == pushed_at  # on the wake-up, not at a re-check


async def test_a_push_of_one_message_costs_two_queries_however_many_pops_wait(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    answered: list[object] = []
    async with trio.open_nursery() as nursery:
        for _ in range(10):

            async def pop() -> None:
                request = PopRequest(
                    queue="q", batch=10, partitions=10, wait=True, timeout_ms=TIMEOUT_MS
                )
                answered.append(await service.pop(request))

            nursery.start_soon(pop)
        await trio.testing.wait_all_tasks_blocked()
        before = store.pop_calls
        store.add("q")
        store.notify("q")
        await trio.testing.wait_all_tasks_blocked()
        # one woken pop takes the message (less than it could take: no other pop looks beside
        # it); the next one to look finds nothing, which answers for the other eight
        assert store.pop_calls - before == 2
        assert len([r for r in answered if r]) == 1
        assert service.wakeups.waiting == 9
        nursery.cancel_scope.cancel()


# --- when to look again: what the last look said was pending ---------------------------------


async def test_a_pop_with_nothing_pending_does_not_recheck_while_it_waits(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    store.ripe_in_s = PENDING_NONE  # the look says: nothing pending, only a push can change it
    result = await rechecking.pop(_waiting_pop("q"))
    assert not result
    assert trio.current_time() >= TIMEOUT_MS / 1000
    # its first look and one at the deadline: the 29 re-checks due in between were not made
    assert store.pop_calls == 2


async def test_a_pop_with_nothing_pending_is_still_woken_by_a_push(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    store.ripe_in_s = PENDING_NONE
    async with trio.open_nursery() as nursery:
        results = []

        async def pop() -> None:
            results.append(await rechecking.pop(_waiting_pop("q")))

        nursery.start_soon(pop)
        await trio.sleep(5)
        pushed = store.add("q")
        store.notify("q")
    assert [d.message_id for d in results[0].delivered] == [pushed.message_id]
    assert trio.current_time() == pytest.approx(5)
    assert store.pop_calls == 2


async def test_like_pops_with_nothing_pending_share_the_one_look(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    store.ripe_in_s = PENDING_NONE
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(rechecking.pop, _waiting_pop("q"))
    # each pop's first look, then one look at their common deadline answers them all: none
    # of the 290 re-checks due in between was made
    assert store.pop_calls == 11


async def test_a_pop_looks_again_when_its_pending_partition_ripens(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    store.ripe_in_s = 0.25  # a lease or a retry delay ends in 250 ms, before the 1 s re-check
    await _finds_unannounced(rechecking, store)
    assert 0.25 <= trio.current_time() < 0.3
    assert store.pop_calls == 2


async def test_a_pop_whose_pending_partition_ripens_late_still_rechecks_on_time(
    rechecking: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    # a lease that ends in a minute: what nobody announces meanwhile (its batch completed in
    # another process, or handed back by a broker of an earlier build) is found at the re-check
    store.ripe_in_s = 60.0
    await _finds_unannounced(rechecking, store)
    assert trio.current_time() == pytest.approx(1.0)


async def test_without_the_push_listener_a_pop_with_nothing_pending_keeps_rechecking(
    store: MemoryConsumeStore, tmp_path: object, autojump_clock: trio.testing.MockClock
) -> None:
    # the listener is down: another process's push would go unheard, so the re-check stays
    store.ripe_in_s = PENDING_NONE
    store.listener_connected = False
    async for service in _service(store, tmp_path, recheck_ms=1000):
        await _finds_unannounced(service, store)
    assert trio.current_time() == pytest.approx(1.0)


async def test_a_commit_to_one_partition_leaves_pops_of_other_partitions_asleep(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    def committed(partition: str) -> None:
        segment = SegmentWrite(1, ["m"], ["t"], [b"1"], [0], key=PartitionKey("q", partition))
        service.on_commit([segment], [])

    async with trio.open_nursery() as nursery:
        results = []

        async def pop(partition: str) -> None:
            request = PopRequest(queue="q", partition=partition, wait=True, timeout_ms=TIMEOUT_MS)
            results.append((partition, await service.pop(request)))

        for partition in ("a", "b", "c"):
            nursery.start_soon(pop, partition)
        await service.wakeups.until_waiting(3)
        assert store.pop_calls == 3
        committed("b")
        await trio.testing.wait_all_tasks_blocked()
        assert store.pop_calls == 4  # only the pop of "b" looked again
        store.add("q")
        committed("a")
        await trio.testing.wait_all_tasks_blocked()
        assert [p for p, r in results if r] == ["a"]
        nursery.cancel_scope.cancel()


async def _woken_at(
    service: ConsumeService, store: MemoryConsumeStore, batch: int
) -> tuple[PopResult, float]:
    """What the answer of a pop of ``batch`` woken by a push at t=5 carried, and when."""
    answers: list[tuple[PopResult, float]] = []
    async with trio.open_nursery() as nursery:

        async def pop() -> None:
            request = PopRequest(queue="q", batch=batch, wait=True, timeout_ms=TIMEOUT_MS)
            answers.append((await service.pop(request), trio.current_time()))

        nursery.start_soon(pop)
        await trio.sleep(5)
        store.add("q")
        store.notify("q")
        await trio.sleep(0.001)  # a second message, a millisecond behind the first
        store.add("q")
        store.notify("q")
    return answers[0]


@pytest.fixture
async def lingering(store: MemoryConsumeStore, tmp_path: object) -> AsyncIterator[ConsumeService]:
    """Waiting pops of a batch linger 20 ms once woken (``QUEEN_POP_LINGER_MS=20``)."""
    async for s in _service(store, tmp_path, recheck_ms=10 * TIMEOUT_MS, linger_ms=20):
        yield s


async def test_a_pop_woken_for_one_message_of_a_batch_lingers_for_more(
    lingering: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    result, answered_at = await _woken_at(lingering, store, batch=10)
    assert len(result.delivered) == 2  # both, in one answer
    assert answered_at == pytest.approx(5.02)


async def test_a_lingering_service_answers_a_pop_of_one_message_at_once(
    lingering: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    result, answered_at = await _woken_at(lingering, store, batch=1)
    assert len(result.delivered) == 1
    assert answered_at == pytest.approx(5)


async def test_by_default_a_woken_pop_looks_at_once(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    result, answered_at = await _woken_at(service, store, batch=10)
    assert len(result.delivered) == 1  # what woke it; the second comes with its next pop
    assert answered_at == pytest.approx(5)


# --- first come, first served: waiting pops take turns -------------------------------------


async def test_waiting_pops_are_served_in_the_order_they_arrived(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    pops = 6
    served: list[tuple[int, str]] = []  # (which pop, the message it got)
    async with trio.open_nursery() as nursery:
        for n in range(pops):

            async def pop(n: int = n) -> None:
                result = await service.pop(_waiting_pop("q"))
                served.append((n, result.delivered[0].message_id))

            nursery.start_soon(pop)
            await service.wakeups.until_waiting(n + 1)  # pop n arrives after pop n - 1
        pushed = []
        for _ in range(pops):
            pushed.append(store.add("q").message_id)
            store.notify("q")  # wakes every waiting pop
            await trio.testing.wait_all_tasks_blocked()
    assert served == list(enumerate(pushed))


async def test_a_new_pop_takes_its_turn_behind_the_pops_already_waiting(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    got: dict[str, list[str]] = {"waiting": [], "new": []}

    async def pop(who: str) -> None:
        result = await service.pop(_waiting_pop("q"))
        got[who].extend(d.message_id for d in result.delivered)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pop, "waiting")
        await service.wakeups.until_waiting(1)
        pushed = store.add("q").message_id
        store.notify("q")
        nursery.start_soon(pop, "new")  # arrives with the wake-up, before the woken pop runs
        await trio.testing.wait_all_tasks_blocked()
        assert got == {"waiting": [pushed], "new": []}
        assert service.wakeups.waiting == 1  # the new pop waits in its turn
        nursery.cancel_scope.cancel()


async def test_busy_consumers_each_wait_about_as_long_as_the_line_ahead_of_them(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    """Fifty consumers popping again as soon as they are answered, a message every 2 ms, each
    look taking 5 ms of the database: every message is taken as it comes, and no pop waits
    much longer than the 49 ahead of it take (0.1 s), where a pop left to chance could lose
    every race for seconds."""
    consumers, every_s, messages = 50, 0.002, 2000
    store.pop_latency_s = 0.005
    waited: list[float] = []

    async def consume() -> None:
        while True:
            began = trio.current_time()
            if await service.pop(_waiting_pop("q")):
                waited.append(trio.current_time() - began)

    async with trio.open_nursery() as nursery:
        for _ in range(consumers):
            nursery.start_soon(consume)
        await service.wakeups.until_waiting(consumers)
        for _ in range(messages):
            store.add("q")
            store.notify("q")
            await trio.sleep(every_s)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert len(waited) == messages
    assert max(waited) <= 5 * consumers * every_s, max(waited)


async def test_a_burst_goes_to_the_oldest_pops_with_more_of_them_looking_at_once(
    service: ConsumeService, store: MemoryConsumeStore, autojump_clock: trio.testing.MockClock
) -> None:
    store.pop_latency_s = 0.003
    served: dict[int, float] = {}  # which pop, when (one message each)
    async with trio.open_nursery() as nursery:
        for n in range(10):

            async def pop(n: int = n) -> None:
                if await service.pop(_waiting_pop("q")):
                    served[n] = trio.current_time()

            nursery.start_soon(pop)
            await service.wakeups.until_waiting(n + 1)
        began = trio.current_time()
        for _ in range(7):
            store.add("q")
        store.notify("q")
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert sorted(served) == list(range(7))  # the seven that waited longest
    # each look that took all it could lets one more pop look beside the next: one look, then
    # two at once, then four, 3 ms each, rather than seven in a row
    assert max(served.values()) - began <= 3 * 0.003 + 1e-6, sorted(served.items())

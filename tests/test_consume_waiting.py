"""The consume service's waiting logic on virtual time, over the in-memory consume store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from queen.broadcast import Signal
from queen.consume.service import ConsumeService
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.records import PopRequest
from queen.settings import Settings
from tests.fakes import MemoryConsumeStore

TIMEOUT_MS = 30_000


@pytest.fixture
def store() -> MemoryConsumeStore:
    return MemoryConsumeStore()


async def _service(
    store: MemoryConsumeStore, tmp_path: object, recheck_ms: float
) -> AsyncIterator[ConsumeService]:
    settings = Settings(
        database_url="memory://", file_buffer_dir=str(tmp_path), pop_recheck_ms=recheck_ms
    )
    switches = MaintenanceSwitch(store, refresh_s=1.0, changed=Signal())  # type: ignore[arg-type]
    service = ConsumeService(store, settings, Metrics(), switches=switches)  # type: ignore[arg-type]
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
    async with trio.open_nursery() as nursery:
        results = []

        async def pop() -> None:
            results.append(await rechecking.pop(_waiting_pop("q")))

        nursery.start_soon(pop)
        await trio.testing.wait_all_tasks_blocked()
        pushed = store.add("q")  # nobody is told
    assert [d.message_id for d in results[0].delivered] == [pushed.message_id]
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
    switches = MaintenanceSwitch(store, refresh_s=1.0, changed=Signal())  # type: ignore[arg-type]
    store.state["pop_maintenance_mode"] = {"enabled": True}
    store.state["maintenance_mode"] = {"enabled": True}
    assert not switches.pop_enabled and not switches.enabled  # no read on the way
    await switches.load()
    assert switches.pop_enabled and switches.enabled
    store.state["pop_maintenance_mode"] = {"enabled": False}
    await switches.load()
    assert not switches.pop_enabled and switches.enabled

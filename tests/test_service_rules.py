"""The consume service checks its own rules, whoever calls it.

An embedding program may call ``broker.consume`` directly with typed values, past the HTTP
routes and the ``Broker`` shortcuts: a pop's batch above ``pop_max_batch``, a timeout out of
range, a bad name to configure or delete, a lease extension out of range are refused there
with :class:`InvalidRequest` (what HTTP answers 400) before anything reaches the store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_util import RepeatedEvent

from queen.consume.errors import InvalidRequest
from queen.consume.service import ConsumeService
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.records import PopRequest, QueueOptions
from queen.settings import Settings
from tests.fakes import MemoryConsumeStore, idle_push_service

MAX_BATCH = 50
LEASE = "0190a000-0000-7000-8000-000000000000"


@pytest.fixture
def store() -> MemoryConsumeStore:
    return MemoryConsumeStore()


@pytest.fixture
async def service(store: MemoryConsumeStore, tmp_path: Path) -> AsyncIterator[ConsumeService]:
    settings = Settings(
        database_url="memory://", file_buffer_dir=str(tmp_path), pop_max_batch=MAX_BATCH
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


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"batch": MAX_BATCH + 1}, f"batch must be between 1 and {MAX_BATCH}"),
        ({"batch": 10**7}, f"batch must be between 1 and {MAX_BATCH}"),
        ({"batch": 0}, f"batch must be between 1 and {MAX_BATCH}"),
        ({"timeout_ms": 3_600_001}, "timeout must be between 0 and 3600000"),
        ({"timeout_ms": -1}, "timeout must be between 0 and 3600000"),
        ({"partitions": 1001}, "partitions must be between 1 and 1000"),
        ({"queue": "a\nb"}, "queue must not contain control characters"),
        ({"consumer_group": "g\x00"}, "consumerGroup must not contain control characters"),
        ({"queue": None}, "a queue, a namespace or a task is required"),
    ],
)
async def test_a_pop_that_breaks_a_rule_is_refused_by_the_service(
    service: ConsumeService, store: MemoryConsumeStore, fields: dict[str, Any], message: str
) -> None:
    store.add("q")
    request = PopRequest(**{"queue": "q", **fields})
    with pytest.raises(InvalidRequest, match=message):
        await service.pop(request)
    assert store.pop_calls == 0


async def test_a_pop_within_the_rules_reaches_the_store(
    service: ConsumeService, store: MemoryConsumeStore
) -> None:
    store.add("q")
    result = await service.pop(PopRequest(queue="q", batch=MAX_BATCH, timeout_ms=3_600_000))
    assert len(result.delivered) == 1 and store.pop_calls == 1
    result.charge.release()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("",), "queue is required"),
        (("a\nb",), "queue must not contain control characters"),
        (("x" * 1000,), "queue is longer than"),
        (("q", "n\x00"), "namespace must not contain control characters"),
        (("q", None, "t\x1f"), "task must not contain control characters"),
        (("q", None, None, QueueOptions(lease_time_s=0)), "options.leaseTime must be"),
        (("q", None, None, QueueOptions(retry_limit=True)), "options.retryLimit must be"),  # type: ignore[arg-type]
    ],
)
async def test_configure_with_a_bad_name_or_option_is_refused_by_the_service(
    service: ConsumeService, args: tuple[Any, ...], message: str
) -> None:
    """(The in-memory store models no configure: reaching it would raise something else.)"""
    with pytest.raises(InvalidRequest, match=message):
        await service.configure(*args)


async def test_a_good_configure_reaches_the_store(service: ConsumeService) -> None:
    with pytest.raises(NotImplementedError, match="configure"):
        await service.configure("q", None, None, QueueOptions(lease_time_s=60))


async def test_delete_queue_and_lease_extension_are_checked_by_the_service(
    service: ConsumeService,
) -> None:
    with pytest.raises(InvalidRequest, match="queue must not contain control characters"):
        await service.delete_queue("a\nb")
    with pytest.raises(InvalidRequest, match="leaseId must be a UUID"):
        await service.extend_lease("not-a-lease", None)
    with pytest.raises(InvalidRequest, match="seconds must be between 1 and 604800"):
        await service.extend_lease(LEASE, 0)
    with pytest.raises(NotImplementedError, match="extend_lease"):
        await service.extend_lease(LEASE, 60)

"""A pop's answer in the process's byte budget (``QUEEN_MAX_DECODING_BYTES``), shared with
request bodies: what a pop may read, waiting for room, 503 without leasing, the answer charged
until sent; and a real broker's memory under four concurrent pops of big messages."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from hypercorn.typing import ASGIReceiveEvent, ASGISendEvent, HTTPScope
from trio_util import RepeatedEvent

from queen.broker import Broker
from queen.budget import ByteBudget
from queen.consume import AnswersBusy
from queen.consume import service as consume_service
from queen.consume.service import ConsumeService
from queen.http.app import create_app
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.records import PopRequest
from queen.settings import Settings
from tests.conftest import Db
from tests.consuming import Api
from tests.fakes import MemoryConsumeStore, idle_push_service
from tests.procs import BrokerProcess

MIB = 1024 * 1024


@pytest.fixture
def store() -> MemoryConsumeStore:
    return MemoryConsumeStore()


@pytest.fixture
def budget() -> ByteBudget:
    return ByteBudget(10_000)


@pytest.fixture
async def service(
    store: MemoryConsumeStore, budget: ByteBudget, tmp_path: Path
) -> AsyncIterator[ConsumeService]:
    """Pops read 6,000 payload bytes at most, in a process whose budget is 10,000."""
    settings = Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path),
        pop_max_bytes=6_000,
        max_body_bytes=10_000,
        max_decoding_bytes=10_000,
    )
    switches = MaintenanceSwitch(store, refresh_s=1.0, changed=RepeatedEvent())  # type: ignore[arg-type]
    service = ConsumeService(
        store,  # type: ignore[arg-type]
        settings,
        Metrics(),
        switches=switches,
        push=idle_push_service(settings),
        budget=budget,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        yield service
        nursery.cancel_scope.cancel()


def _payload(size: int) -> str:
    return '"' + "x" * (size - 2) + '"'


async def test_a_pop_reads_no_more_than_the_room_left_in_the_budget(
    service: ConsumeService, store: MemoryConsumeStore, budget: ByteBudget
) -> None:
    for _ in range(4):
        store.add("q", _payload(1_000))
    assert budget.try_charge(7_500)  # a request body in progress
    result = await service.pop(PopRequest(queue="q", batch=4))
    assert store.max_bytes_asked == [2_500]
    assert len(result.delivered) == 2
    budget.release(7_500)
    result.charge.release()
    rest = await service.pop(PopRequest(queue="q", batch=4))
    assert store.max_bytes_asked[-1] == 6_000  # QUEEN_POP_MAX_BYTES, with room for it
    assert len(rest.delivered) == 2


async def test_concurrent_pops_share_the_room_instead_of_each_counting_on_all_of_it(
    service: ConsumeService, store: MemoryConsumeStore
) -> None:
    for queue in ("a", "b"):
        store.add(queue)
    async with trio.open_nursery() as nursery:
        for queue in ("a", "b"):
            nursery.start_soon(service.pop, PopRequest(queue=queue))
    # the first reserves its 6,000 while it reads; the second may read what is left
    assert sorted(store.max_bytes_asked) == [4_000, 6_000]


async def test_an_answer_stays_charged_until_it_is_released(
    service: ConsumeService, store: MemoryConsumeStore, budget: ByteBudget
) -> None:
    store.add("q", _payload(1_234))
    result = await service.pop(PopRequest(queue="q"))
    assert budget.in_use_bytes == 1_234
    result.charge.release()
    result.charge.release()  # only the first release counts
    assert budget.in_use_bytes == 0


async def test_a_pop_with_no_room_waits_until_some_is_given_back(
    service: ConsumeService,
    store: MemoryConsumeStore,
    budget: ByteBudget,
    autojump_clock: trio.testing.MockClock,
) -> None:
    store.add("q")
    held = budget.charge(10_000)  # an answer being sent
    delivered: list[int] = []

    async def pop() -> None:
        delivered.append(len((await service.pop(PopRequest(queue="q"))).delivered))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pop)
        await trio.sleep(consume_service.ROOM_WAIT_S / 2)
        assert store.pop_calls == 0
        held.release()
    assert delivered == [1]
    assert store.pop_calls == 1


async def test_a_pop_that_finds_no_room_in_time_is_busy_and_reads_nothing(
    service: ConsumeService,
    store: MemoryConsumeStore,
    budget: ByteBudget,
    autojump_clock: trio.testing.MockClock,
) -> None:
    store.add("q")
    held = budget.charge(10_000)
    started = trio.current_time()
    with pytest.raises(AnswersBusy):
        await service.pop(PopRequest(queue="q"))
    assert trio.current_time() - started == pytest.approx(consume_service.ROOM_WAIT_S)
    assert store.pop_calls == 0 and len(store.messages["q"]) == 1
    assert service.metrics.pop_busy == 1
    held.release()
    assert len((await service.pop(PopRequest(queue="q"))).delivered) == 1


# --- over HTTP, on the real database ----------------------------------------------------------


async def test_a_pop_answered_503_for_want_of_room_leases_nothing(
    api: Api, client: Any, broker: Broker, db: Db, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consume_service, "ROOM_WAIT_S", 0.05)
    await api.push(queue, "p", 1, 2)
    held = broker.budget.charge(broker.budget.limit_bytes)
    try:
        answer = await client.get(f"/api/v1/pop/queue/{queue}?batch=2")
        assert answer.status_code == 503
        assert answer.headers["Retry-After"] == "1"
        assert "retry later" in (await answer.get_json())["error"]
        leases = await db.value(
            """SELECT count(*) FROM queen.cursors c JOIN queen.queues q ON q.id = c.queue_id
               WHERE q.name = %s AND c.lease_expires_at > now()""",
            queue,
        )
        assert leases == 0
    finally:
        held.release()
    status, body = await api.pop(queue, batch=2)
    assert status == 200 and [m["data"] for m in body["messages"]] == [1, 2]


async def test_a_pop_answer_is_charged_until_its_last_byte_is_sent(
    broker: Broker, queue: str
) -> None:
    await broker.push([{"queue": queue, "payload": "z" * 5000} for _ in range(3)])
    app = create_app(broker)
    scope: HTTPScope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/api/v1/pop/queue/{queue}",
        "raw_path": f"/api/v1/pop/queue/{queue}".encode(),
        "query_string": b"batch=3",
        "root_path": "",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 6632),
        "state": {},
        "extensions": {},
    }
    requested = False

    async def receive() -> ASGIReceiveEvent:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    charged_while_sent: list[tuple[int, int]] = []

    async def send(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            charged_while_sent.append((broker.budget.in_use_bytes, len(message["body"])))

    await app(scope, receive, send)  # type: ignore[arg-type]
    [(charged, size)] = charged_while_sent
    assert size > 15_000 and charged == size  # the body, as sent
    assert broker.budget.in_use_bytes == 0


# --- a real broker process -----------------------------------------------------------------------


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_four_concurrent_pops_of_big_messages_keep_the_broker_small(
    broker: Broker, pg_url: str, tmp_path: Path
) -> None:
    """150 messages of 1 MB; four consumer groups pop batch=150 at once until each has every
    message (answers of 150 MB each would take the process past 1.5 GB)."""
    count, size = 150, 1_000_000
    queue = f"t-{uuid.uuid4().hex[:12]}"
    for start in range(0, count, 10):  # stored by this process, not the one measured
        await broker.push(
            [
                {"queue": queue, "partition": "p", "payload": {"n": n, "s": "x" * size}}
                for n in range(start, start + 10)
            ]
        )
    groups = ["a", "b", "c", "d"]
    seen: dict[str, list[int]] = {g: [] for g in groups}
    served = BrokerProcess({"DATABASE_URL": pg_url, "FILE_BUFFER_DIR": str(tmp_path / "spool")})

    async def consume(group: str) -> None:
        async with httpx.AsyncClient(base_url=served.base, timeout=60) as http:
            while len(seen[group]) < count:
                answer = await http.get(
                    f"/api/v1/pop/queue/{queue}", params={"batch": count, "consumerGroup": group}
                )
                if answer.status_code == 503:  # no room for now: as the client does
                    await trio.sleep(float(answer.headers["Retry-After"]))
                    continue
                assert answer.status_code == 200, answer.text
                messages = answer.json()["messages"]
                seen[group].extend(m["data"]["n"] for m in messages)
                acks = [
                    {
                        "transactionId": m["transactionId"],
                        "partitionId": m["partitionId"],
                        "leaseId": m["leaseId"],
                        "status": "completed",
                    }
                    for m in messages
                ]
                acked = await http.post(
                    "/api/v1/ack/batch", json={"acknowledgments": acks, "consumerGroup": group}
                )
                assert all(a["success"] for a in acked.json()), acked.text

    async with trio.open_nursery() as nursery:
        await served.start(nursery)
        assert served.proc is not None
        pid = served.proc.pid
        idle = _status_mib(pid, "VmRSS")
        async with trio.open_nursery() as consumers:
            for group in groups:
                consumers.start_soon(consume, group)
        peak = _status_mib(pid, "VmHWM")
        await served.stop()
        nursery.cancel_scope.cancel()
    assert seen == {g: list(range(count)) for g in groups}  # in order, each once per group
    grown = peak - idle
    assert grown < 256, f"the broker grew from {idle:.0f} MiB to {peak:.0f} MiB"

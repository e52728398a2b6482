"""Several broker processes sharing one spool directory and one database, with real outages.

A producer that waits for each answer before its next push, and sends its pushes to the
processes in turn, must find its partition stored in the order its pushes were answered.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from queen.storage.embedded import EmbeddedPostgres
from tests.conftest import Db
from tests.procs import BrokerProcess, spool_files
from tests.test_faults import broker_env, own_pg  # noqa: F401  (own_pg is a fixture)

pytestmark = pytest.mark.slow


async def wait_all_replayed(brokers: list[BrokerProcess], spool: Path) -> None:
    """Poll until no spool file is left and every process counts nothing pending."""
    with trio.fail_after(120):
        while True:
            pending = 0
            for broker in brokers:
                pending += (await broker.get("/health"))["spool"]["pendingItems"]
            if pending == 0 and not spool_files(spool):
                return
            await trio.sleep(0.05)


async def test_two_processes_keep_each_partition_in_answer_order_across_an_outage(
    own_pg: EmbeddedPostgres,  # noqa: F811
    tmp_path: Path,
) -> None:
    partitions, per_partition = 6, 160
    queue = "two-procs"
    spool = tmp_path / "spool"
    env = broker_env(own_pg, spool, QUEEN_SPOOL_HOLD_S="0.3")
    brokers = [BrokerProcess(env), BrokerProcess(env)]
    answered: dict[int, list[str]] = {k: [] for k in range(partitions)}
    statuses: list[str] = []
    total = partitions * per_partition
    one_third, two_thirds = trio.Event(), trio.Event()

    async def producer(k: int, clients: list[httpx.AsyncClient]) -> None:
        for seq in range(per_partition):
            tx = f"p{k}-{seq:05d}"
            item = {"queue": queue, "partition": f"p{k}", "payload": {"seq": seq}}
            body = {"items": [{**item, "transactionId": tx}]}
            resp = await clients[(seq + k) % 2].post("/api/v1/push", json=body)
            assert resp.status_code == 201, resp.text
            status = resp.json()[0]["status"]
            statuses.append(status)
            answered[k].append(tx)
            if len(statuses) >= total // 3:
                one_third.set()
            if len(statuses) >= 2 * total // 3:
                two_thirds.set()

    async def outage() -> None:
        await one_third.wait()
        await trio.to_thread.run_sync(own_pg.stop, "immediate")
        await two_thirds.wait()
        await trio.to_thread.run_sync(own_pg.start)

    async with trio.open_nursery() as nursery:
        for broker in brokers:
            await broker.start(nursery)
        async with (
            httpx.AsyncClient(base_url=brokers[0].base, timeout=60) as first,
            httpx.AsyncClient(base_url=brokers[1].base, timeout=60) as second,
            trio.open_nursery() as load,
        ):
            load.start_soon(outage)
            for k in range(partitions):
                load.start_soon(producer, k, [first, second])
        await wait_all_replayed(brokers, spool)
        for broker in brokers:
            await broker.stop()

    warned = [line for b in brokers for line in b.log if " WARNING " in line or " ERROR " in line]
    assert set(statuses) <= {"queued", "buffered"}, "\n".join(warned[-40:])
    assert "buffered" in statuses and "queued" in statuses
    db = Db(own_pg.conninfo)
    for k in range(partitions):
        stored = [f["transaction_id"] for f in await db.frames(queue, f"p{k}")]
        assert len(stored) == len(set(stored)), f"p{k}: a message is stored twice"
        assert stored == answered[k], f"p{k}: stored order differs from the answer order"


async def test_a_push_waits_for_what_another_process_still_holds_in_an_open_file(
    own_pg: EmbeddedPostgres,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Process B still spools (its maintenance switch is cached on) into a file it keeps
    open; process A already writes to the database. A push answered by A after one answered
    by B must be stored after it."""
    spool = tmp_path / "spool"
    a = BrokerProcess(broker_env(own_pg, spool, QUEEN_SPOOL_HOLD_S="0.3"))
    b = BrokerProcess(
        broker_env(
            own_pg,
            spool,
            QUEEN_SPOOL_FILE_MAX_AGE_S="600",
            QUEEN_SYSTEM_STATE_CACHE_MS="600000",
        )
    )

    def body(tx: str) -> dict[str, object]:
        return {"items": [{"queue": "open-file", "payload": tx, "transactionId": tx}]}

    async with trio.open_nursery() as nursery:
        await a.start(nursery)
        await b.start(nursery)
        async with (
            httpx.AsyncClient(base_url=a.base, timeout=30) as to_a,
            httpx.AsyncClient(base_url=b.base, timeout=30) as to_b,
        ):
            resp = await to_b.post("/api/v1/system/maintenance", json={"enabled": True})
            assert resp.json()["maintenanceMode"] is True
            resp = await to_b.post("/api/v1/push", json=body("first"))
            assert [r["status"] for r in resp.json()] == ["buffered"]
            resp = await to_a.post("/api/v1/system/maintenance", json={"enabled": False})
            assert resp.json()["maintenanceMode"] is False  # B's cached switch stays on
            resp = await to_a.post("/api/v1/push", json=body("second"))
            assert [r["status"] for r in resp.json()] == ["buffered"]
            assert [f.name for f in spool_files(spool)], "B keeps its file open"
            resp = await to_b.post("/api/v1/system/maintenance", json={"enabled": False})
            assert resp.json()["maintenanceMode"] is False
        await wait_all_replayed([a, b], spool)
        await a.stop()
        await b.stop()
    frames = await Db(own_pg.conninfo).frames("open-file", "Default")
    assert [f["transaction_id"] for f in frames] == ["first", "second"]

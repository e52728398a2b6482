"""Fault injection with real processes: PostgreSQL stopped under load, the broker killed in
the middle of a replay, an unwritable spool. Nothing is lost and nothing is stored twice."""

from __future__ import annotations

import resource
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from queen.storage.embedded import EmbeddedPostgres
from tests.conftest import TEST_SERVER_OPTIONS, Db, embedded_pg_dir
from tests.procs import BrokerProcess, spool_files

pytestmark = pytest.mark.slow


@pytest.fixture
async def own_pg() -> AsyncIterator[EmbeddedPostgres]:
    """A PostgreSQL server this test may stop and start."""
    with embedded_pg_dir() as data:
        server = EmbeddedPostgres(data, server_options=TEST_SERVER_OPTIONS)
        await trio.to_thread.run_sync(server.start)
        try:
            yield server
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(server.stop, "immediate")


def broker_env(pg: EmbeddedPostgres, spool: Path, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": pg.conninfo,
        "FILE_BUFFER_DIR": str(spool),
        "QUEEN_LOG_LEVEL": "info",
        "QUEEN_DB_PROBE_MAX_S": "0.5",
        "QUEEN_SPOOL_FILE_MAX_AGE_S": "0.2",
        **extra,
    }


async def check_exactly_once_in_order(
    db: Db, queue: str, partitions: int, per_partition: int
) -> None:
    for k in range(partitions):
        frames = await db.frames(queue, f"p{k}")
        txids = [f["transaction_id"] for f in frames]
        expected = [f"p{k}-{seq:05d}" for seq in range(per_partition)]
        assert len(txids) == len(set(txids)), f"p{k}: a message is stored twice"
        assert txids == expected, f"p{k}: stored {len(txids)} of {per_partition}, or out of order"


async def test_postgres_stopped_under_load_loses_and_duplicates_nothing(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    partitions, per_partition, items = 4, 240, 2
    queue = "outage"
    broker = BrokerProcess(broker_env(own_pg, tmp_path / "spool"))
    statuses: list[str] = []
    total = partitions * per_partition
    one_third, two_thirds = trio.Event(), trio.Event()

    async def producer(k: int, http: httpx.AsyncClient) -> None:
        for seq in range(0, per_partition, items):
            body = {
                "items": [
                    {
                        "queue": queue,
                        "partition": f"p{k}",
                        "payload": {"seq": s},
                        "transactionId": f"p{k}-{s:05d}",
                    }
                    for s in range(seq, seq + items)
                ]
            }
            resp = await http.post("/api/v1/push", json=body)
            assert resp.status_code == 201, resp.text
            statuses.extend(r["status"] for r in resp.json())
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
        await broker.start(nursery)
        async with (
            httpx.AsyncClient(base_url=broker.base, timeout=60) as http,
            trio.open_nursery() as load,
        ):
            load.start_soon(outage)
            for k in range(partitions):
                load.start_soon(producer, k, http)
        await broker.wait_spool_empty()
        await broker.stop()

    assert set(statuses) <= {"queued", "duplicate", "buffered"}
    assert "buffered" in statuses and "queued" in statuses
    await check_exactly_once_in_order(Db(own_pg.conninfo), queue, partitions, per_partition)
    assert spool_files(tmp_path / "spool") == []


async def _counted(http: httpx.AsyncClient, name: str) -> float:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_a_waiting_pop_and_an_ack_wait_out_a_postgres_outage(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    """The official clients' consume loops give up after a few error answers, so a waiting pop
    and an ack sent while PostgreSQL is away wait for it: once it is back, the ack is applied
    and the pop delivers. A pop that does not wait is still told at once (503)."""
    broker = BrokerProcess(broker_env(own_pg, tmp_path / "spool", QUEEN_WORKERS="1"))
    queue = "ride-out"
    answers: dict[str, httpx.Response] = {}
    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        async with httpx.AsyncClient(base_url=broker.base, timeout=60) as http:
            for n in (1, 2):
                body = {"items": [{"queue": queue, "partition": "p", "payload": {"n": n}}]}
                assert (await http.post("/api/v1/push", json=body)).status_code == 201
            popped = await http.get(f"/api/v1/pop/queue/{queue}", params={"batch": 1})
            [first] = popped.json()["messages"]
            ack = {
                "transactionId": first["transactionId"],
                "partitionId": first["partitionId"],
                "leaseId": first["leaseId"],
                "status": "completed",
            }
            pops = await _counted(http, "queen_pop_requests_total")
            acks = await _counted(http, "queen_ack_requests_total")
            down = broker.watch("database unreachable")
            await trio.to_thread.run_sync(own_pg.stop, "immediate")

            async def send_ack() -> None:
                answers["ack"] = await http.post("/api/v1/ack", json=ack)

            async def send_pop() -> None:
                params = {"batch": 1, "wait": "true", "timeout": 60000}
                answers["pop"] = await http.get(f"/api/v1/pop/queue/{queue}", params=params)

            async with trio.open_nursery() as requests:
                requests.start_soon(send_ack)
                requests.start_soon(send_pop)
                with trio.fail_after(30):
                    await down.wait()
                    while (  # noqa: ASYNC110 (a state of the server)
                        await _counted(http, "queen_pop_requests_total") < pops + 1
                        or await _counted(http, "queen_ack_requests_total") < acks + 1
                    ):
                        await trio.sleep(0.01)
                now = await http.get(f"/api/v1/pop/queue/{queue}", params={"batch": 1})
                assert now.status_code == 503, now.text
                assert answers == {}, "answered while PostgreSQL was away"
                await trio.to_thread.run_sync(own_pg.start)
        await broker.stop()
    assert answers["ack"].status_code == 200, answers["ack"].text
    assert [a["success"] for a in answers["ack"].json()] == [True]
    assert answers["pop"].status_code == 200, answers["pop"].text
    assert [m["data"] for m in answers["pop"].json()["messages"]] == [{"n": 2}]


async def test_broker_killed_during_replay_finishes_on_restart(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    partitions, per_partition, items = 8, 4000, 100
    queue = "crash-replay"
    spool = tmp_path / "spool"
    env = broker_env(own_pg, spool, QUEEN_SPOOL_REPLAY_CHUNK_ITEMS="100", QUEEN_LOG_LEVEL="debug")
    db = Db(own_pg.conninfo)

    async with trio.open_nursery() as nursery:
        first = BrokerProcess(env)
        await first.start(nursery)
        async with httpx.AsyncClient(base_url=first.base, timeout=60) as http:
            resp = await http.post("/api/v1/system/maintenance", json={"enabled": True})
            assert resp.json()["maintenanceMode"] is True
            for seq in range(0, per_partition, items):
                body = {
                    "items": [
                        {
                            "queue": queue,
                            "partition": f"p{k}",
                            "payload": {"seq": s},
                            "transactionId": f"p{k}-{s:05d}",
                        }
                        for k in range(partitions)
                        for s in range(seq, seq + items)
                    ]
                }
                resp = await http.post("/api/v1/push", json=body)
                assert {r["status"] for r in resp.json()} == {"buffered"}
            assert await db.count_frames(queue) == 0
            progress = first.watch("committed up to offset")
            resp = await http.post("/api/v1/system/maintenance", json={"enabled": False})
            assert resp.json()["bufferedMessages"] == partitions * per_partition
            with trio.fail_after(60):
                await progress.wait()  # the first chunk of the replay is committed
        first.kill()
        await first.proc.wait()  # type: ignore[union-attr]
        stored_at_kill = await db.count_frames(queue)
        assert 0 < stored_at_kill < partitions * per_partition, "the kill missed the replay"

        second = BrokerProcess(env)
        await second.start(nursery)
        await second.wait_spool_empty()
        await second.stop()

    await check_exactly_once_in_order(db, queue, partitions, per_partition)
    assert spool_files(spool) == []


async def test_a_broker_started_before_its_database_comes_up_with_it(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    """As compose starts them without waiting: the broker on an empty database that does not
    answer yet keeps pushes in its spool, then installs its schema, replays them and serves."""
    queue = "started-first"
    await trio.to_thread.run_sync(own_pg.stop, "fast")
    env = broker_env(own_pg, tmp_path / "spool")
    async with trio.open_nursery() as nursery:
        broker = BrokerProcess(env)
        await broker.start(nursery)
        async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
            health = (await http.get("/health")).json()
            assert health["database"] == "disconnected"
            body = {
                "items": [
                    {
                        "queue": queue,
                        "partition": "p0",
                        "payload": {"seq": s},
                        "transactionId": f"p0-{s:05d}",
                    }
                    for s in range(10)
                ]
            }
            resp = await http.post("/api/v1/push", json=body)
            assert {r["status"] for r in resp.json()} == {"buffered"}

            await trio.to_thread.run_sync(own_pg.start)
            await broker.wait_spool_empty()
            popped = await http.get(f"/api/v1/pop/queue/{queue}?batch=20")
            assert [m["transactionId"] for m in popped.json()["messages"]] == [
                f"p0-{s:05d}" for s in range(10)
            ]
        await broker.stop()
    assert broker.proc is not None and broker.proc.returncode == 0


async def test_maintenance_mode_over_http_holds_everything_until_switched_off(
    client: Any, queue: str, db: Db, broker: Any
) -> None:
    resp = await client.post("/api/v1/system/maintenance", json={"enabled": True})
    assert (await resp.get_json())["maintenanceMode"] is True
    assert (await (await client.get("/api/v1/system/maintenance")).get_json())[
        "maintenanceMode"
    ] is True
    body = {
        "items": [
            {"queue": queue, "partition": "p", "payload": i, "transactionId": f"t{i}"}
            for i in range(20)
        ]
    }
    resp = await client.post("/api/v1/push", json=body)
    assert {r["status"] for r in await resp.get_json()} == {"buffered"}
    assert await db.count_frames(queue) == 0
    assert await db.value("SELECT count(*) FROM queen.queues WHERE name = %s", queue) == 0
    state = await (await client.get("/api/v1/system/maintenance")).get_json()
    assert state["bufferedMessages"] == 20

    resp = await client.post("/api/v1/system/maintenance", json={"enabled": False})
    assert (await resp.get_json())["maintenanceMode"] is False
    with trio.fail_after(30):
        await broker.wait_spool_empty()
    frames = await db.frames(queue, "p")
    assert [f["transaction_id"] for f in frames] == [f"t{i}" for i in range(20)]
    bad = await client.post("/api/v1/system/maintenance", json={"enabled": "yes"})
    assert bad.status_code == 400
    assert (await bad.get_json())["error"] == "enabled (boolean) is required"


def _no_file_writes() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


async def test_unwritable_spool_answers_failed(own_pg: EmbeddedPostgres, tmp_path: Path) -> None:
    with psycopg.connect(own_pg.conninfo, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS queen")
        conn.execute("""CREATE TABLE IF NOT EXISTS queen.system_state (key text PRIMARY KEY,
                        value jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())""")
        conn.execute("""INSERT INTO queen.system_state VALUES
                        ('maintenance_mode', '{"enabled": true}', now())""")
    broker = BrokerProcess(broker_env(own_pg, tmp_path / "spool"), preexec=_no_file_writes)
    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
            resp = await http.post(
                "/api/v1/push",
                json={"items": [{"queue": "full", "payload": 1}, {"queue": "full", "payload": 2}]},
            )
            assert resp.status_code == 201
            assert [r["status"] for r in resp.json()] == ["failed", "failed"]
            health = (await http.get("/health")).json()
            assert health["spool"]["healthy"] is False
            assert health["spool"]["pendingItems"] == 0
        await broker.stop()
    assert any("spool write failed" in line for line in broker.log)
    assert all(f.stat().st_size == 0 for f in (tmp_path / "spool").glob("spool-*"))


def _no_file_writes_until_raised() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))


async def test_spool_health_comes_back_with_the_disk_without_a_push(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    broker = BrokerProcess(broker_env(own_pg, spool), preexec=_no_file_writes_until_raised)
    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
            await http.post("/api/v1/system/maintenance", json={"enabled": True})
            item = {"queue": "disk", "payload": 1, "transactionId": "before"}
            resp = await http.post("/api/v1/push", json={"items": [item]})
            assert [r["status"] for r in resp.json()] == ["failed"]
            assert (await http.get("/health")).json()["spool"]["healthy"] is False
            assert broker.proc is not None
            recovered = broker.watch("takes writes again")
            infinity = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            resource.prlimit(broker.proc.pid, resource.RLIMIT_FSIZE, infinity)  # space again
            with trio.fail_after(30):  # the broker's own probe notices; no push is sent
                await recovered.wait()
            assert (await http.get("/health")).json()["spool"]["healthy"] is True
            assert await broker.metric("queen_spool_appended_items_total") == 0
            item = {**item, "transactionId": "after"}
            resp = await http.post("/api/v1/push", json={"items": [item]})
            assert [r["status"] for r in resp.json()] == ["buffered"]
            await http.post("/api/v1/system/maintenance", json={"enabled": False})
        await broker.wait_spool_empty()
        await broker.stop()
    frames = await Db(own_pg.conninfo).frames("disk", "Default")
    assert [f["transaction_id"] for f in frames] == ["after"]
    assert not list(spool.glob("*.tmp")) and not list(spool.glob("*.new"))


async def test_items_spooled_before_their_queue_was_deleted_are_dropped_not_recreated(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    broker = BrokerProcess(broker_env(own_pg, spool))
    db = Db(own_pg.conninfo)

    def body(*txs: str) -> dict[str, Any]:
        return {"items": [{"queue": "doomed", "payload": t, "transactionId": t} for t in txs]}

    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
            resp = await http.post("/api/v1/push", json=body("live"))
            assert [r["status"] for r in resp.json()] == ["queued"]
            await http.post("/api/v1/system/maintenance", json={"enabled": True})
            resp = await http.post("/api/v1/push", json=body("old-1", "old-2", "old-3"))
            assert {r["status"] for r in resp.json()} == {"buffered"}
            resp = await http.delete("/api/v1/resources/queues/doomed")
            assert resp.status_code == 200, resp.text
            resp = await http.post("/api/v1/push", json=body("new-1"))
            assert [r["status"] for r in resp.json()] == ["buffered"]
            await http.post("/api/v1/system/maintenance", json={"enabled": False})
        await broker.wait_spool_empty()
        dropped = await broker.metric("queen_spool_dropped_deleted_queue_items_total")
        await broker.stop()
    assert dropped == 3
    frames = await db.frames("doomed", "Default")
    assert [f["transaction_id"] for f in frames] == ["new-1"]
    assert any("their queue was deleted after they were spooled" in line for line in broker.log)


async def test_torn_spool_record_is_quarantined_and_reported(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    from queen.model import PartitionKey
    from queen.spool import files
    from queen.spool.format import SpoolRecord, encode

    spool = tmp_path / "spool"
    spool.mkdir()
    ids = [f"0190c7e0-0000-7000-8000-{i:012x}" for i in range(5)]
    records = [
        SpoolRecord(PartitionKey("torn", "p"), 0, [ids[i]], [f"t{i}"], [b'{"i":%d}' % i])
        for i in range(5)
    ]
    whole = b"".join(encode(r) for r in records[:4])
    torn = encode(records[4])[:-5]  # crash mid-write
    name = files.new_name()
    (spool / name).write_bytes(whole + torn)

    broker = BrokerProcess(broker_env(own_pg, spool))
    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        await broker.wait_spool_empty()
        health = await broker.get("/health")
        damaged = await broker.metric("queen_spool_damaged_ranges_total")
        kept_gauge = await broker.metric("queen_spool_quarantined_bytes")
        await broker.stop()
    frames = await Db(own_pg.conninfo).frames("torn", "p")
    assert [f["transaction_id"] for f in frames] == ["t0", "t1", "t2", "t3"]
    assert [f["message_id"] for f in frames] == ids[:4]
    assert any("unreadable bytes" in line and "quarantine" in line for line in broker.log)
    assert spool_files(spool) == []
    stem = f"{name.removesuffix('.log')}.{len(whole)}-{len(whole) + len(torn)}"
    assert (spool / "quarantine" / f"{stem}.bin").read_bytes() == torn
    note = (spool / "quarantine" / f"{stem}.txt").read_text()
    assert name in note and "truncated" in note
    assert health["spool"]["quarantined"] == {"ranges": 1, "bytes": len(torn)}
    assert damaged == 1
    assert kept_gauge == len(torn)


async def test_spool_directory_removed_under_a_running_broker_serves_the_next_outage(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    broker = BrokerProcess(broker_env(own_pg, spool))
    body = {"items": [{"queue": "gone-dir", "payload": 1, "transactionId": "during"}]}
    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
            shutil.rmtree(spool)
            await trio.to_thread.run_sync(own_pg.stop, "immediate")
            resp = await http.post("/api/v1/push", json=body)
            assert [r["status"] for r in resp.json()] == ["buffered"]
            assert len(spool_files(spool)) == 1
            assert (await http.get("/health")).json()["spool"]["healthy"] is True
            await trio.to_thread.run_sync(own_pg.start)
            await broker.wait_spool_empty()
        await broker.stop()
    frames = await Db(own_pg.conninfo).frames("gone-dir", "Default")
    assert [f["transaction_id"] for f in frames] == ["during"]
    assert spool_files(spool) == []

"""High availability: a broker on a multi-host URL follows a promoted streaming standby.

A primary and a streaming standby are started here (the embedded server's binaries, TCP on
127.0.0.1), a ``queen serve`` process is pointed at both with
``target_session_attrs=read-write``, ordered producers push while the primary is stopped
``immediate``, and the standby is promoted. With synchronous replication every item answered
``queued`` or ``buffered`` is stored once and in order on the new primary. With asynchronous
replication only items answered ``queued`` in the primary's last moments may be missing; the
rest holds (nothing twice, order kept, every ``buffered`` item stored).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from queen.storage.embedded import EmbeddedPostgres
from tests.conftest import TEST_SERVER_OPTIONS, Db, embedded_pg_dir
from tests.procs import BrokerProcess

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp_url(*ports: int) -> str:
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"


@dataclass
class Pair:
    primary: EmbeddedPostgres
    standby: EmbeddedPostgres
    primary_port: int
    standby_port: int

    @property
    def url(self) -> str:
        return tcp_url(self.primary_port, self.standby_port)


@pytest.fixture(params=["synchronous", "asynchronous"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    synchronous = request.param == "synchronous"
    with embedded_pg_dir() as primary_dir, embedded_pg_dir() as standby_dir:
        ports = free_port(), free_port()
        options = {**TEST_SERVER_OPTIONS, "listen_addresses": "127.0.0.1"}
        primary = EmbeddedPostgres(
            primary_dir,
            server_options={
                **options,
                "port": str(ports[0]),
                "synchronous_standby_names": "standby1" if synchronous else "",
            },
        )
        standby = EmbeddedPostgres(standby_dir, server_options={**options, "port": str(ports[1])})
        servers = [primary, standby]
        try:
            await trio.to_thread.run_sync(primary.start)
            await trio.to_thread.run_sync(
                lambda: standby.clone("127.0.0.1", ports[0], application_name="standby1")
            )
            await trio.to_thread.run_sync(standby.start)
            pair = Pair(primary, standby, *ports)
            await wait_streaming(pair, "sync" if synchronous else "async")
            yield pair
        finally:
            with trio.CancelScope(shield=True):
                for server in servers:
                    await trio.to_thread.run_sync(server.stop, "immediate")


async def wait_streaming(pair: Pair, sync_state: str) -> None:
    """Until the primary streams to the standby in the wanted mode (asked of the primary:
    nothing else tells us)."""
    db = Db(tcp_url(pair.primary_port))
    with trio.fail_after(60):
        while True:
            state = await db.value(
                "SELECT sync_state FROM pg_stat_replication"
                " WHERE application_name = 'standby1' AND state = 'streaming'"
            )
            if state == sync_state:
                return
            await trio.sleep(0.05)


async def test_a_promoted_standby_takes_over_with_every_item_once_and_in_order(
    pair: Pair, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    synchronous = request.node.callspec.params["pair"] == "synchronous"
    queue, partitions, per_partition = "failover", 4, 120
    spool = tmp_path / "spool"
    broker = BrokerProcess(
        {
            "DATABASE_URL": pair.url,
            "FILE_BUFFER_DIR": str(spool),
            "QUEEN_LOG_LEVEL": "info",
            "QUEEN_DB_PROBE_MAX_S": "0.5",
            "QUEEN_DB_CONNECT_TIMEOUT_S": "2",
            "QUEEN_SPOOL_FILE_MAX_AGE_S": "0.2",
        }
    )
    answers: list[list[str]] = [[] for _ in range(partitions)]
    answered = 0
    third = trio.Event()
    buffered_after_stop = trio.Event()
    stopped = False

    async def producer(k: int, http: httpx.AsyncClient) -> None:
        nonlocal answered
        for seq in range(per_partition):
            body = {
                "items": [
                    {
                        "queue": queue,
                        "partition": f"p{k}",
                        "payload": {"seq": seq},
                        "transactionId": f"p{k}-{seq:05d}",
                    }
                ]
            }
            resp = await http.post("/api/v1/push", json=body)
            assert resp.status_code == 201, resp.text
            status = resp.json()[0]["status"]
            answers[k].append(status)
            answered += 1
            if answered >= partitions * per_partition // 3:
                third.set()
            if stopped and status == "buffered" and answered >= partitions * per_partition // 2:
                buffered_after_stop.set()

    async def fail_over() -> None:
        nonlocal stopped
        await third.wait()
        await trio.to_thread.run_sync(pair.primary.stop, "immediate")
        stopped = True
        await buffered_after_stop.wait()  # the outage is seen, then the standby takes over
        await trio.to_thread.run_sync(pair.standby.promote)

    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        assert broker.proc is not None
        pid = broker.proc.pid
        async with httpx.AsyncClient(base_url=broker.base, timeout=60) as http:
            async with trio.open_nursery() as load:
                load.start_soon(fail_over)
                for k in range(partitions):
                    load.start_soon(producer, k, http)
            await broker.wait_spool_empty()
            # the same process answers queued again, from the new primary
            resp = await http.post(
                "/api/v1/push", json={"items": [{"queue": queue, "partition": "x", "payload": 1}]}
            )
            assert resp.json()[0]["status"] == "queued"
        assert broker.proc.returncode is None and broker.proc.pid == pid
        await broker.stop()

    flat = [s for per in answers for s in per]
    assert set(flat) <= {"queued", "buffered", "duplicate"}
    assert "buffered" in flat and flat.count("queued") > partitions
    db = Db(tcp_url(pair.standby_port))
    lost = 0
    for k in range(partitions):
        stored = [f["transaction_id"] for f in await db.frames(queue, f"p{k}")]
        expected = [f"p{k}-{seq:05d}" for seq in range(per_partition)]
        assert len(stored) == len(set(stored)), f"p{k}: a message is stored twice"
        assert stored == sorted(stored), f"p{k}: out of order"
        buffered = {expected[i] for i, s in enumerate(answers[k]) if s == "buffered"}
        assert buffered <= set(stored), f"p{k}: a buffered item is missing"
        if synchronous:
            assert stored == expected, f"p{k}: stored {len(stored)} of {per_partition}"
        lost += len(expected) - len(stored)
    if not synchronous:
        print(f"asynchronous replication: {lost} items answered queued were lost")

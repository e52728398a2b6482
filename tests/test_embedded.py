"""The embedded PostgreSQL of ``queen serve``: one broker per data directory, a server left by a
killed broker adopted by the next, and a server that dies under load started again without a
broker restart and without losing or doubling anything. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import trio

from queen.storage.embedded import EmbeddedPostgres
from tests.conftest import Db, embedded_pg_dir
from tests.procs import BrokerProcess, spool_files
from tests.test_faults import check_exactly_once_in_order

pytestmark = pytest.mark.slow


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with embedded_pg_dir() as data:
        yield data
        server = EmbeddedPostgres(data)
        if server.is_running():  # a test that failed half-way: leave nothing running
            server.stop("immediate")


def embedded_env(data: Path, spool: Path, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": "",  # unset: the broker starts its own server
        "PG_HOST": "",
        "QUEEN_PG_DATA_DIR": str(data),
        "FILE_BUFFER_DIR": str(spool),
        "QUEEN_LOG_LEVEL": "info",
        "QUEEN_DB_PROBE_MAX_S": "0.5",
        "QUEEN_SPOOL_FILE_MAX_AGE_S": "0.2",
        **extra,
    }


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


async def push_one(http: httpx.AsyncClient, queue: str, partition: str, seq: int) -> str:
    body = {
        "items": [
            {
                "queue": queue,
                "partition": partition,
                "payload": {"seq": seq},
                "transactionId": f"{partition}-{seq:05d}",
            }
        ]
    }
    answer = await http.post("/api/v1/push", json=body)
    assert answer.status_code == 201, answer.text
    status: str = answer.json()[0]["status"]
    return status


async def second_serve(env: dict[str, str]) -> tuple[int, str]:
    """Run another `queen serve`; its exit status and log. One that starts serving instead of
    being refused is stopped at once (SIGTERM: it stops what it thinks it owns) and reported
    with status -1."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "queen.cli", "serve"],
        env={**os.environ, **env, "QUEEN_PORT": "0"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    log = b""
    with trio.fail_after(60):
        async for chunk in proc.stderr:
            log += chunk
            if b"listening on http" in log:
                proc.send_signal(signal.SIGTERM)
                async for rest in proc.stderr:
                    log += rest
                await proc.wait()
                return -1, log.decode(errors="replace")
        await proc.wait()
    return proc.returncode, log.decode(errors="replace")


async def check_first_still_owns(first: BrokerProcess, data: Path, postmaster: int | None) -> None:
    """The first broker's database was left alone: the same postmaster stores its pushes, and
    the first broker stops it when it stops."""
    server = EmbeddedPostgres(data)
    assert server.is_running() and server.postmaster_pid() == postmaster
    async with httpx.AsyncClient(base_url=first.base, timeout=30) as http:
        assert await push_one(http, "owned", "p", 0) == "queued"
    await first.stop()
    assert first.proc is not None and first.proc.returncode == 0
    assert not server.is_running()


async def test_a_second_broker_on_the_same_data_directory_is_refused(
    data_dir: Path, tmp_path: Path, nursery: trio.Nursery
) -> None:
    first = BrokerProcess(embedded_env(data_dir, tmp_path / "spool-1"))
    await first.start(nursery)
    assert first.proc is not None
    postmaster = EmbeddedPostgres(data_dir).postmaster_pid()
    status, log = await second_serve(embedded_env(data_dir, tmp_path / "spool-2"))
    assert status == 2, log
    assert f"{data_dir} is in use by another queen serve (pid {first.proc.pid})" in log
    await check_first_still_owns(first, data_dir, postmaster)


async def test_a_second_broker_through_a_symbolic_link_to_the_data_directory_is_refused(
    data_dir: Path, tmp_path: Path, nursery: trio.Nursery
) -> None:
    first = BrokerProcess(embedded_env(data_dir, tmp_path / "spool-1"))
    await first.start(nursery)
    assert first.proc is not None
    postmaster = EmbeddedPostgres(data_dir).postmaster_pid()
    alias = data_dir.parent / "alias"
    alias.symlink_to(data_dir, target_is_directory=True)
    status, log = await second_serve(embedded_env(alias, tmp_path / "spool-2"))
    assert status == 2, f"a broker through {alias} was not refused:\n{log}"
    assert f"{data_dir} is in use by another queen serve (pid {first.proc.pid})" in log
    assert f"{alias} leads to it" in log
    await check_first_still_owns(first, data_dir, postmaster)


async def test_a_second_broker_is_refused_when_the_lock_file_was_removed(
    data_dir: Path, tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A cleaner removes ``<data dir>.lock`` under a running broker: the next broker makes a
    new lock file and takes it, but the directory itself is still held."""
    first = BrokerProcess(embedded_env(data_dir, tmp_path / "spool-1"))
    await first.start(nursery)
    assert first.proc is not None
    postmaster = EmbeddedPostgres(data_dir).postmaster_pid()
    EmbeddedPostgres(data_dir).lock_file.unlink()
    status, log = await second_serve(embedded_env(data_dir, tmp_path / "spool-2"))
    assert status == 2, f"a broker on {data_dir} was not refused:\n{log}"
    assert f"{data_dir} is in use by another queen serve (pid {first.proc.pid})" in log
    await check_first_still_owns(first, data_dir, postmaster)


async def test_a_server_left_by_a_killed_broker_is_adopted_by_the_next(
    data_dir: Path, tmp_path: Path, nursery: trio.Nursery
) -> None:
    first = BrokerProcess(embedded_env(data_dir, tmp_path / "spool"))
    await first.start(nursery)
    async with httpx.AsyncClient(base_url=first.base, timeout=30) as http:
        assert await push_one(http, "adopted", "p", 0) == "queued"
    first.kill()
    assert first.proc is not None
    await first.proc.wait()
    server = EmbeddedPostgres(data_dir)
    left = server.postmaster_pid()
    assert server.is_running(), "kill -9 of the broker leaves its server running"

    second = BrokerProcess(embedded_env(data_dir, tmp_path / "spool"))
    await second.start(nursery)
    assert any("adopting the PostgreSQL server left running" in x for x in second.log)
    async with httpx.AsyncClient(base_url=second.base, timeout=30) as http:
        assert await push_one(http, "adopted", "p", 1) == "queued"
    assert server.postmaster_pid() == left
    await second.stop()
    assert not server.is_running(), "the adopting broker stops the server it adopted"
    # both pushes are there
    await trio.to_thread.run_sync(server.start)
    try:
        frames = await Db(server.conninfo).frames("adopted", "p")
        assert [f["transaction_id"] for f in frames] == ["p-00000", "p-00001"]
    finally:
        await trio.to_thread.run_sync(server.stop)


async def test_the_embedded_server_killed_under_load_is_started_again_and_nothing_is_lost(
    data_dir: Path, tmp_path: Path, nursery: trio.Nursery
) -> None:
    queue, partitions, per_partition = "restarted", 4, 150
    broker = BrokerProcess(embedded_env(data_dir, tmp_path / "spool"))
    await broker.start(nursery)
    assert broker.proc is not None
    broker_pid = broker.proc.pid
    server = EmbeddedPostgres(data_dir)
    statuses: list[list[str]] = [[] for _ in range(partitions)]
    answered = 0
    killed_at: list[int] = []
    third, two_thirds = trio.Event(), trio.Event()
    exited = broker.watch(r"embedded-postgres failed.*exited; starting it again")
    running_again = broker.watch(r"embedded PostgreSQL is running again")

    async def producer(k: int, http: httpx.AsyncClient) -> None:
        nonlocal answered
        for seq in range(per_partition):
            statuses[k].append(await push_one(http, queue, f"p{k}", seq))
            answered += 1
            if answered >= partitions * per_partition // 3:
                third.set()
            if answered >= 2 * partitions * per_partition // 3:
                two_thirds.set()

    async def kill_postmaster() -> None:
        await third.wait()
        pid = server.postmaster_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed_at.append(answered)

    async with httpx.AsyncClient(base_url=broker.base, timeout=60) as http:
        async with trio.open_nursery() as load:
            load.start_soon(kill_postmaster)
            for k in range(partitions):
                load.start_soon(producer, k, http)
        with trio.fail_after(60):
            await exited.wait()
            await running_again.wait()
        await broker.wait_spool_empty()
        # queued again after the kill, from the same broker process
        after = [s for k in range(partitions) for s in statuses[k][killed_at[0] // partitions :]]
        assert "queued" in after
        health = (await http.get("/health")).json()
        assert health["database"] == "connected"
        assert health["loops"]["embedded-postgres"]["errors"] >= 1
        assert await push_one(http, queue, "after", 0) == "queued"
    assert broker.proc.returncode is None and broker.proc.pid == broker_pid
    # the outage is logged as a change of state, not once a second
    listener = [x for x in broker.log if "WARNING" in x and "push listener" in x]
    assert len(listener) <= 2, listener
    flat = [s for per in statuses for s in per]
    assert set(flat) <= {"queued", "buffered", "duplicate"}, set(flat)
    await check_exactly_once_in_order(Db(server.conninfo), queue, partitions, per_partition)
    await broker.stop()
    assert broker.proc.returncode == 0
    assert spool_files(tmp_path / "spool") == []
    assert not server.is_running()


async def test_with_workers_the_parent_starts_the_embedded_server_again(
    data_dir: Path, tmp_path: Path, nursery: trio.Nursery
) -> None:
    env = embedded_env(data_dir, tmp_path / "spool", QUEEN_WORKERS="2")
    broker = BrokerProcess(env)
    await broker.start(nursery)
    server = EmbeddedPostgres(data_dir)
    running_again = broker.watch(r"embedded PostgreSQL is running again")
    statuses: list[str] = []
    async with httpx.AsyncClient(base_url=broker.base, timeout=60) as http:
        statuses.append(await push_one(http, "workers", "p", 0))
        pid = server.postmaster_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(60):
            await running_again.wait()
            seq = 1
            while True:  # each answer is one more item, stored once whatever it says
                statuses.append(await push_one(http, "workers", "p", seq))
                seq += 1
                if statuses[-1] == "queued":
                    break
        await broker.wait_spool_empty()
    assert statuses[0] == "queued"
    frames = await Db(server.conninfo).frames("workers", "p")
    assert [f["transaction_id"] for f in frames] == [f"p-{s:05d}" for s in range(seq)]
    await broker.stop()
    assert broker.proc is not None and broker.proc.returncode == 0

"""Operating conditions that must not end a real broker process: a full spool disk while the
spool is replayed, the open-file limit reached by idle clients, a PostgreSQL whose processes
stop answering without closing their connections."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from queen.storage.embedded import EmbeddedPostgres
from tests.conftest import Db
from tests.procs import BrokerProcess, spool_files
from tests.test_faults import broker_env, check_exactly_once_in_order, own_pg

pytestmark = pytest.mark.slow
__all__ = ["own_pg"]  # the fixture, used by name


def push_body(queue: str, partition: str, seqs: range) -> dict[str, object]:
    return {
        "items": [
            {
                "queue": queue,
                "partition": partition,
                "payload": {"seq": s},
                "transactionId": f"{partition}-{s:05d}",
            }
            for s in seqs
        ]
    }


async def loop_state(broker: BrokerProcess, name: str) -> dict[str, object]:
    health = await broker.get("/health")
    assert isinstance(health, dict) and "loops" in health, "\n".join([str(health), *broker.log])
    state: dict[str, object] = health["loops"][name]
    return state


async def wait_loop_ok(broker: BrokerProcess, name: str) -> None:
    """Ask /health (the state lives in the broker process) until the loop is ok again."""
    with trio.fail_after(60):
        while True:
            if (await loop_state(broker, name))["state"] == "ok":
                return
            await trio.sleep(0.1)


# --- a full spool disk -------------------------------------------------------------------


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the file system has no block left."""
    with path.open("wb", buffering=0) as out:
        for size in (65536, 4096, 512, 1):
            while True:
                try:
                    out.write(b"\0" * size)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break


async def test_full_spool_disk_during_replay_does_not_end_the_broker(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    queue, per_partition = "disk-full", 200
    with tiny_tmpfs(tmp_path / "spool", "1m") as spool:
        env = broker_env(
            own_pg,
            spool,
            QUEEN_SPOOL_REPLAY_CHUNK_ITEMS="20",  # progress marks are written during the file
            QUEEN_LOOP_RETRY_MAX_S="0.5",
        )
        broker = BrokerProcess(env)
        async with trio.open_nursery() as nursery:
            await broker.start(nursery)
            async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
                await trio.to_thread.run_sync(own_pg.stop, "fast")
                for seq in range(0, per_partition, 20):
                    resp = await http.post(
                        "/api/v1/push", json=push_body(queue, "p0", range(seq, seq + 20))
                    )
                    assert {r["status"] for r in resp.json()} == {"buffered"}
                await trio.to_thread.run_sync(fill, spool / "filler")
                # the replay meets ENOSPC saving a progress mark: the spool logs it and goes
                # on, or the error reaches the loop's supervisor; either way no exit
                no_space = broker.watch(
                    r"(progress not saved|background loop spool-replay failed).*No space left"
                )
                await trio.to_thread.run_sync(own_pg.start)
                with trio.fail_after(60):
                    await no_space.wait()

                assert broker.proc is not None and broker.proc.returncode is None
                health = (await http.get("/health")).json()
                assert health["database"] == "connected"
                assert health["status"] in {"healthy", "degraded"}
                other = await http.post("/api/v1/push", json=push_body("elsewhere", "p", range(1)))
                assert other.json()[0]["status"] == "queued"

                (spool / "filler").unlink()
                await broker.wait_spool_empty()
                await wait_loop_ok(broker, "spool-replay")
            await broker.stop()
        assert spool_files(spool) == []
    await check_exactly_once_in_order(Db(own_pg.conninfo), queue, 1, per_partition)


# --- the open-file limit -------------------------------------------------------------------


def _lowest_free_descriptor(pid: int) -> int:
    """The number the process's next open descriptor would take."""
    used = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
    return min(set(range(len(used) + 1)) - used)


async def test_idle_connections_past_the_open_file_limit_do_not_end_the_broker(
    own_pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    queue = "emfile"
    env = broker_env(
        own_pg,
        tmp_path / "spool",
        QUEEN_LOOP_RETRY_MAX_S="1",
        QUEEN_SHUTDOWN_GRACE_S="1",  # connections the server still holds do not delay the end
    )
    broker = BrokerProcess(env)
    async with (
        trio.open_nursery() as nursery,
        # one connection, opened before the limit is reached and kept alive through it
        httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=1)) as kept,
    ):
        await broker.start(nursery)
        first = await kept.post(f"{broker.base}/api/v1/push", json=push_body(queue, "p", range(1)))
        assert first.json()[0]["status"] == "queued"
        assert (await kept.get(f"{broker.base}/health")).status_code == 200  # probe connected
        assert broker.proc is not None
        pid = broker.proc.pid
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 8, hard))

        # the replay's directory listing meets EMFILE: the spool logs it, or the error reaches
        # the loop's supervisor
        replay_failed = broker.watch(
            r"(could not be read|background loop spool-replay failed).*Too many open files"
        )
        idle: list[trio.SocketStream] = []
        try:
            for _ in range(60):  # far past the limit: the rest wait in the listen backlog
                idle.append(await trio.open_tcp_stream("127.0.0.1", broker.port))
            # A descriptor freed meanwhile (a connection shed or timed out) could let the
            # replay's listing through: the limit bounds a new descriptor's number, and a new
            # one takes the lowest number free. Pin the limit at that number until the listing
            # fails.
            with trio.move_on_after(60) as waited:
                while not replay_failed.is_set():
                    if broker.proc.returncode is not None:
                        break
                    free = _lowest_free_descriptor(pid)
                    resource.prlimit(pid, resource.RLIMIT_NOFILE, (min(free, in_use + 8), hard))
                    with trio.move_on_after(1):
                        await replay_failed.wait()
            if waited.cancelled_caught:  # say what the broker did instead, and stop it
                fds = len(os.listdir(f"/proc/{pid}/fd")) if broker.proc.returncode is None else -1
                broker.kill()
                with trio.move_on_after(10):
                    await broker.proc.wait()  # reaped, so no warning lands on a later test
                pytest.fail(
                    f"no EMFILE from the spool replay in 60 s ({fds} descriptors open, limit "
                    f"{in_use + 8}):\n" + "\n".join(broker.log[-40:])
                )

            # out of descriptors (the limit back where it was set first, the idle clients still
            # queued past it): alive, and a connection it already has is still served
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 8, hard))
            assert broker.proc.returncode is None
            during = await kept.get(f"{broker.base}/health")
            assert during.status_code == 200, "\n".join([during.text, *broker.log])
            assert during.json()["database"] == "connected"
        finally:
            for stream in idle:
                await stream.aclose()

        # Descriptors free again: the idle clients are gone and the limit has room again (the
        # server keeps a connection whose client left before sending a request until its
        # keep-alive timeout, so room comes back with the limit here).
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 64 + len(idle), hard))
        async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
            health = (await http.get("/health")).json()
            assert health["database"] == "connected"
            pushed = await http.post("/api/v1/push", json=push_body(queue, "p", range(1, 2)))
            assert pushed.json()[0]["status"] == "queued"
            popped = await http.get(f"/api/v1/pop/queue/{queue}?batch=10")
            assert [m["transactionId"] for m in popped.json()["messages"]] == ["p-00000", "p-00001"]
            await wait_loop_ok(broker, "spool-replay")
        assert any("accept returned EMFILE" in line for line in broker.log)
        await broker.stop()
    assert broker.proc.returncode == 0


# --- PostgreSQL stopped with SIGSTOP ------------------------------------------------------


def server_pids(server: EmbeddedPostgres) -> list[int]:
    """The postmaster and every process it started."""
    postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(entry))
    return pids


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@pytest.mark.parametrize(
    ("call_timeout_s", "probe_timeout_s"),
    [
        pytest.param(2.0, 60.0, id="call-deadline"),  # the probe never decides: deadlines do
        pytest.param(60.0, 0.5, id="probe-finds-the-hang"),  # the probe gives up the calls
    ],
)
async def test_hung_postgres_pushes_fail_over_to_the_spool_within_the_deadline(
    own_pg: EmbeddedPostgres, tmp_path: Path, call_timeout_s: float, probe_timeout_s: float
) -> None:
    partitions, per_partition, items = 4, 150, 2
    queue = "hung"
    env = broker_env(
        own_pg,
        tmp_path / "spool",
        QUEEN_DB_CALL_TIMEOUT_S=str(call_timeout_s),
        QUEEN_DB_PROBE_TIMEOUT_S=str(probe_timeout_s),
        QUEEN_DB_PROBE_MAX_S="0.5",
    )
    broker = BrokerProcess(env)
    total = partitions * per_partition
    statuses: list[str] = []
    frozen_answers: list[tuple[str, float]] = []  # (status, seconds) of pushes during the freeze
    frozen = False
    pop_answers: list[tuple[int, float]] = []  # a pop during the freeze: (status, seconds)
    one_third, two_thirds = trio.Event(), trio.Event()

    async def producer(k: int, http: httpx.AsyncClient) -> None:
        for seq in range(0, per_partition, items):
            started = time.monotonic()
            resp = await http.post(
                "/api/v1/push", json=push_body(queue, f"p{k}", range(seq, seq + items))
            )
            assert resp.status_code == 201, resp.text
            answered = [r["status"] for r in resp.json()]
            statuses.extend(answered)
            if frozen:
                frozen_answers.append((answered[0], time.monotonic() - started))
            if len(statuses) >= total // 3:
                one_third.set()
            if len(statuses) >= 2 * total // 3:
                two_thirds.set()

    # /health never waits for the database: it answers well within one database call's
    # deadline (a busy 2-core machine can take a second over it; waiting would take 2 s)
    at_once_s = min(3.0, 0.75 * call_timeout_s)

    async def health_answers_at_once(http: httpx.AsyncClient) -> dict[str, object]:
        with trio.fail_after(at_once_s):
            resp = await http.get("/health")
        body: dict[str, object] = resp.json()
        return body

    async def freeze(http: httpx.AsyncClient) -> None:
        nonlocal frozen
        await one_third.wait()
        pids = server_pids(own_pg)
        signal_all(pids, signal.SIGSTOP)
        frozen = True
        try:
            with trio.move_on_after(60) as waiting:
                async with httpx.AsyncClient(base_url=broker.base, timeout=60) as own:
                    while True:  # the state lives in the broker process: ask it
                        if (await health_answers_at_once(own))["database"] == "disconnected":
                            break
                        await trio.sleep(0.05)  # leave the CPU to the broker meanwhile
                await two_thirds.wait()
            assert not waiting.cancelled_caught, "\n".join(
                [f"stopped {pids}; {len(statuses)} answers", *broker.log[-60:]]
            )
            health = await health_answers_at_once(http)
            assert health["status"] == "unhealthy"
            started = time.monotonic()
            popped = await http.get(f"/api/v1/pop/queue/{queue}?batch=1")
            pop_answers.append((popped.status_code, time.monotonic() - started))
        finally:
            frozen = False
            signal_all(pids, signal.SIGCONT)

    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        async with (
            httpx.AsyncClient(base_url=broker.base, timeout=60) as http,
            trio.open_nursery() as load,
        ):
            load.start_soon(freeze, http)
            for k in range(partitions):
                load.start_soon(producer, k, http)
        await broker.wait_spool_empty()
        await broker.stop()

    assert set(statuses) <= {"queued", "duplicate", "buffered"}
    assert "buffered" in statuses and "queued" in statuses
    assert "buffered" in {s for s, _ in frozen_answers}
    slowest = max(seconds for _, seconds in frozen_answers)
    # the first of the two limits, then the spool (a push may also wait behind its
    # partition's earlier one); far below the other limit
    bound_s = 4 * min(call_timeout_s, 0.5 + probe_timeout_s)
    assert slowest < bound_s, f"a push waited {slowest:.1f} s on the hung database"
    [(pop_status, pop_seconds)] = pop_answers
    assert pop_status == 503 and pop_seconds < bound_s, pop_answers
    assert any("no answer within" in line or "did not answer" in line for line in broker.log)
    await check_exactly_once_in_order(Db(own_pg.conninfo), queue, partitions, per_partition)
    assert spool_files(tmp_path / "spool") == []

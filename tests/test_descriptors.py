"""Descriptors: a connection the client closed frees its descriptor at once, the open files limit
is raised at start, and a broker at its descriptor limit still answers (idle connections are
shed to make room, busy ones are never dropped for a newcomer).

The bookkeeping (:class:`ConnectionCapacity`) is tested on its own; the rest with real
``queen serve`` processes under ``prlimit`` and raw sockets.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from queen.serving.capacity import ConnectionCapacity, default_max_connections
from tests.procs import BrokerProcess

# --- the bookkeeping ---------------------------------------------------------------------


def test_capacity_sheds_the_longest_idle_connection_to_admit_a_new_one() -> None:
    closed: list[str] = []
    capacity = ConnectionCapacity(3)
    for name in ("a", "b", "c"):
        assert capacity.admit(name, lambda n=name: closed.append(n))
    capacity.turned_busy("a")
    capacity.turned_busy("b")
    capacity.turned_idle("a")  # a finished a request after c was opened: c is idle longer
    assert capacity.admit("d", lambda: closed.append("d"))
    assert closed == ["c"]
    assert capacity.admit("e", lambda: closed.append("e"))
    assert closed == ["c", "a"]
    assert capacity.open == 3
    assert capacity.counts.http_connections_shed == 2


def test_capacity_refuses_a_new_connection_when_every_one_is_busy() -> None:
    closed: list[str] = []
    capacity = ConnectionCapacity(2)
    for name in ("a", "b"):
        assert capacity.admit(name, lambda n=name: closed.append(n))
        capacity.turned_busy(name)
    assert not capacity.admit("c", lambda: closed.append("c"))
    assert closed == []
    assert capacity.counts.http_connections_refused == 1
    capacity.release("a")
    assert capacity.admit("c", lambda: closed.append("c"))
    assert capacity.open == 2


def test_a_released_connection_is_never_shed() -> None:
    closed: list[str] = []
    capacity = ConnectionCapacity(1)
    assert capacity.admit("a", lambda: closed.append("a"))
    capacity.release("a")
    assert not capacity.shed_idle()
    assert capacity.admit("b", lambda: closed.append("b"))
    assert closed == []


def test_the_default_cap_keeps_a_reserve_of_descriptors() -> None:
    assert default_max_connections(1024) == 1024 - 102
    assert default_max_connections(256) == 156
    assert default_max_connections(65536) == 65536 - 6553
    assert default_max_connections(50) == 1


# --- real processes ----------------------------------------------------------------------


def _nofile(soft: int, hard: int) -> list[str]:
    return ["prlimit", f"--nofile={soft}:{hard}", sys.executable, "-m", "queen.cli", "serve"]


def _limits_line(pid: int, name: str) -> str:
    limits = Path(f"/proc/{pid}/limits").read_text()
    return next(x for x in limits.splitlines() if x.startswith(name))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _close_wait_sockets(pid: int) -> int:
    """How many of ``pid``'s sockets are in CLOSE-WAIT (the client closed, the server not)."""
    inodes = _socket_inodes(pid)
    count = 0
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "08" and fields[9] in inodes:
                count += 1
    return count


@pytest.fixture
def own_limit() -> None:
    """This test process opens over a thousand sockets: raise its own limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096
    if hard != resource.RLIM_INFINITY and hard < want:
        if os.geteuid() != 0:
            pytest.fail(f"the test needs {want} open files; the hard limit is {hard}")
        hard = want
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))


@pytest.fixture
async def start(pg_url: str, tmp_path: Path) -> AsyncIterator[object]:
    async with trio.open_nursery() as nursery:
        brokers: list[BrokerProcess] = []

        async def start_broker(argv: list[str], **env: str) -> BrokerProcess:
            broker = BrokerProcess(
                {
                    "DATABASE_URL": pg_url,
                    "FILE_BUFFER_DIR": str(tmp_path / f"spool-{len(brokers)}"),
                    "QUEEN_LOG_LEVEL": "info",
                    **env,
                },
                argv=argv,
            )
            brokers.append(broker)
            await broker.start(nursery)
            return broker

        yield start_broker
        for broker in brokers:
            await broker.stop()
        nursery.cancel_scope.cancel()


def _pid(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    return broker.proc.pid


async def _request(stream: trio.SocketStream, path: str = "/health") -> bytes:
    """Send one keep-alive GET and read until the end of its (small) answer."""
    await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    data = b""
    with trio.fail_after(10):
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return data
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                length = re.search(rb"content-length: (\d+)", head, re.I)
                if length and len(body) >= int(length.group(1)):
                    return data


async def _wait_for(condition: object, what: str, within_s: float = 5.0) -> None:
    """Ask another process's /proc until ``condition()`` holds (nothing there can wake us)."""
    assert callable(condition)
    with trio.move_on_after(within_s):
        while True:
            if condition():
                return
            await trio.sleep(0.02)
    raise AssertionError(what)


@pytest.mark.slow
async def test_a_connection_the_client_closes_frees_its_descriptor_at_once(
    start: object,
) -> None:
    assert callable(start)
    # keep-alive far longer than the test: only acting on the client's close frees them
    broker: BrokerProcess = await start(
        [sys.executable, "-m", "queen.cli", "serve"], QUEEN_KEEP_ALIVE_TIMEOUT_S="300"
    )
    pid = _pid(broker)
    async with httpx.AsyncClient(base_url=broker.base, timeout=10) as http:
        assert (await http.get("/health")).status_code == 200  # the pool and probe are up
    await _wait_for(lambda: _close_wait_sockets(pid) == 0, "the warm-up connection stays")
    before = _fds(pid)

    # 1. a half-closed client (request answered, then its side ended) sees the server close
    stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
    assert b" 200 " in (await _request(stream)).split(b"\r\n", 1)[0]
    await stream.send_eof()
    with trio.fail_after(5):
        assert await stream.receive_some(65536) == b"", "the server closes its side too"
    await stream.aclose()

    # 2. clients that close after one request, and clients that close without one
    streams = [await trio.open_tcp_stream("127.0.0.1", broker.port) for _ in range(40)]
    for s in streams[:20]:
        assert b" 200 " in (await _request(s)).split(b"\r\n", 1)[0]
    assert _fds(pid) >= before + 40
    for s in streams:
        await s.aclose()
    await _wait_for(
        lambda: _close_wait_sockets(pid) == 0 and _fds(pid) <= before,
        "connections the clients closed still hold their descriptors",
    )


@pytest.mark.slow
async def test_the_soft_open_files_limit_is_raised_to_the_hard_one(start: object) -> None:
    assert callable(start)
    broker: BrokerProcess = await start(_nofile(256, 2048))
    line = _limits_line(_pid(broker), "Max open files")
    assert line.split()[3:5] == ["2048", "2048"], line
    assert any("up to 1844 connections" in x for x in broker.log), broker.log[-5:]


@pytest.mark.slow
async def test_a_client_opening_a_connection_per_request_never_exhausts_the_broker(
    start: object,
) -> None:
    assert callable(start)
    broker: BrokerProcess = await start(_nofile(128, 128), QUEEN_KEEP_ALIVE_TIMEOUT_S="300")
    queue = f"fd-{uuid.uuid4().hex[:8]}"
    # far more connections than descriptors, one request each, as curl or a health check does
    for k in range(400):
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
            body = (
                f'{{"items":[{{"queue":"{queue}","partition":"p","payload":{k},'
                f'"transactionId":"t{k}"}}]}}'
            ).encode()
            await stream.send_all(
                b"POST /api/v1/push HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            answer = b""
            while b'"status"' not in answer:
                chunk = await stream.receive_some(65536)
                assert chunk, f"request {k}: closed without an answer"
                answer += chunk
            assert b'"queued"' in answer, answer
            await stream.aclose()
    assert await broker.metric("queen_http_connections_shed_total") == 0, (
        "closed connections had to be shed: their descriptors were not freed at once"
    )


@pytest.mark.slow
async def test_health_and_pushes_are_answered_with_1100_idle_connections_at_nofile_1024(
    start: object, own_limit: None
) -> None:
    assert callable(start)
    broker: BrokerProcess = await start(_nofile(1024, 1024))
    pid = _pid(broker)
    idle: list[trio.SocketStream] = []
    try:
        for _ in range(1100):
            idle.append(await trio.open_tcp_stream("127.0.0.1", broker.port))
        assert _fds(pid) < 1024
        # the first ones, idle the longest, were closed to make room
        with trio.fail_after(10):
            assert await idle[0].receive_some(1) == b""
        queue = f"fd-{uuid.uuid4().hex[:8]}"
        async with httpx.AsyncClient(base_url=broker.base, timeout=10) as http:
            for k in range(5):
                health = await http.get("/health")
                assert health.status_code == 200, health.text
                pushed = await http.post(
                    "/api/v1/push",
                    json={"items": [{"queue": queue, "payload": k, "transactionId": f"t{k}"}]},
                )
                assert pushed.json()[0]["status"] == "queued"
            shed = await broker.metric("queen_http_connections_shed_total")
        assert shed >= 1100 - (1024 - 102)
        assert broker.proc is not None and broker.proc.returncode is None
    finally:
        for stream in idle:
            await stream.aclose()


def _unread_bytes_by_socket(pid: int) -> list[int]:
    """The receive queue of each of ``pid``'s established TCP sockets."""
    inodes = _socket_inodes(pid)
    queues = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and fields[9] in inodes:
                queues.append(int(fields[4].split(":")[1], 16))
    return queues


@pytest.mark.slow
async def test_busy_connections_are_kept_and_a_newcomer_gets_503(
    start: object, pg_url: str
) -> None:
    assert callable(start)
    broker: BrokerProcess = await start(
        [sys.executable, "-m", "queen.cli", "serve"], QUEEN_MAX_CONNECTIONS="3"
    )
    pid = _pid(broker)
    database_sockets = len(_unread_bytes_by_socket(pid))  # unix sockets do not count: none
    queue = f"fd-{uuid.uuid4().hex[:8]}"
    polls = []
    for _ in range(3):  # three long polls: busy, never to be shed
        stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
        target = f"/api/v1/pop/queue/{queue}?wait=true&timeout=3000"
        await stream.send_all(f"GET {target} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        polls.append(stream)
    # busy once the broker has read their requests (another process: ask its /proc)
    await _wait_for(
        lambda: (
            (q := _unread_bytes_by_socket(pid)) and len(q) == database_sockets + 3 and not any(q)
        ),
        "the broker did not read the long polls",
    )
    newcomer = await trio.open_tcp_stream("127.0.0.1", broker.port)
    answer = await _request(newcomer)
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b"retry-after: 1" in answer.lower()
    await newcomer.aclose()
    for stream in polls:  # each long poll is answered in full when its wait is over
        answer = await _request(stream)
        assert answer.startswith(b"HTTP/1.1 204 "), answer
    # now idle, they make room for the next client
    async with httpx.AsyncClient(base_url=broker.base, timeout=10) as http:
        assert (await http.get("/health")).status_code == 200
        assert await broker.metric("queen_http_connections_refused_total") == 1
    for stream in polls:
        await stream.aclose()


@pytest.mark.slow
async def test_a_burst_of_half_closed_requests_leaves_the_broker_answering(start: object) -> None:
    assert callable(start)
    broker: BrokerProcess = await start(
        [sys.executable, "-m", "queen.cli", "serve"], QUEEN_MAX_CONNECTIONS="20"
    )
    pid = _pid(broker)
    statuses: list[bytes] = []

    async def half_closed() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
        answer = b""
        with trio.move_on_after(3):
            try:
                await stream.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
                await stream.send_eof()  # the request is whole; the client still reads
                while chunk := await stream.receive_some(65536):
                    answer += chunk
            except (trio.BrokenResourceError, OSError):
                pass  # closed at once: refused while too many refusals were lingering
        statuses.append(answer[9:12])
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(200):  # ten times the cap, 200 a second: a client's pace, not a flood
            nursery.start_soon(half_closed)
            await trio.sleep(0.005)
    # every one has been answered and closed by the server (or refused at the cap), so a
    # newcomer is served, not refused, and no connection is left half-open
    async with httpx.AsyncClient(base_url=broker.base, timeout=10) as http:
        status = (await http.get("/health")).status_code
    assert status == 200, f"{status} after the burst; the burst's answers: {sorted(statuses)}"
    await _wait_for(lambda: _close_wait_sockets(pid) == 0, "half-closed connections stay open")
    assert b"200" in statuses

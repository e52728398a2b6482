"""The connection lifecycle of the real server, seen from raw sockets: when the server closes a
connection, how long it waits for headers, what a refused body does to the connection, what
happens when the client ends its side (half-closes, closes, resets), and how fast a graceful
stop is when clients are idle or half-closed."""

from __future__ import annotations

import signal
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import trio
import trio.testing

from queen.broker import Broker
from queen.http.app import create_app
from queen.server import listen_socket, serve
from queen.serving import ConnectionCapacity, serve_app
from queen.settings import Settings
from tests.procs import BrokerProcess

# Long enough that only the behaviour under test can explain a close.
LONG_S = 60.0


@pytest.fixture
async def opened() -> AsyncIterator[list[trio.SocketStream]]:
    """Every raw connection a test opens, closed at its end."""
    streams: list[trio.SocketStream] = []
    yield streams
    for stream in streams:
        await stream.aclose()


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[Any]:
    """Start the real server (``queen.server.serve``) with the settings a test asks for."""
    async with trio.open_nursery() as nursery:

        async def start(**changes: Any) -> int:
            changed = settings.with_changes(host="127.0.0.1", port=0, **changes)
            port: int = await nursery.start(serve, changed)
            return port

        yield start
        nursery.cancel_scope.cancel()


@dataclass
class Served:
    port: int
    broker: Broker
    capacity: ConnectionCapacity


@pytest.fixture
async def served(broker: Broker) -> AsyncIterator[Served]:
    """The broker's app served on a real socket (``serve_app``), with a connection capacity the
    test can read."""
    sock = listen_socket("127.0.0.1", 0)
    capacity = ConnectionCapacity(64)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(
                serve_app,
                create_app(broker),
                broker.settings,
                sock,
                shutdown_trigger=trio.sleep_forever,
                capacity=capacity,
            )
        )
        yield Served(sock.getsockname()[1], broker, capacity)
        nursery.cancel_scope.cancel()


async def no_connection_left(capacity: ConnectionCapacity) -> None:
    """Once nothing is left to run (each connection is released by its own task as it
    closes), the server holds no connection, busy or idle."""
    with trio.fail_after(5):
        await trio.testing.wait_all_tasks_blocked(0.01)
    assert capacity.open == 0


class Client:
    """A raw HTTP/1.1 client over one socket; responses are parsed with h11."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.parser = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int, opened: list[trio.SocketStream]) -> Client:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        opened.append(stream)
        return cls(stream)

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next response, read within a bounded time. The client side of the parser is
        driven by hand (the requests are raw bytes), so it only reads."""
        status = 0
        headers: dict[str, str] = {}
        body = b""
        self.parser = h11.Connection(h11.CLIENT)
        self.parser.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
        self.parser.send(h11.EndOfMessage())
        with trio.fail_after(10):
            while True:
                event = self.parser.next_event()
                if event is h11.NEED_DATA:
                    self.parser.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return status, headers, body
                elif isinstance(event, h11.ConnectionClosed):
                    raise AssertionError("closed before a response")

    async def closed_by_server(self, within_s: float = 10) -> bool:
        """True once the server has closed the connection (end of stream or reset); nothing
        else may arrive before."""
        with trio.fail_after(within_s):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return True
                if not data:
                    return True
                raise AssertionError(f"unexpected bytes: {data[:80]!r}")


def get(path: str, *extra: str, version: str = "1.1") -> bytes:
    lines = [f"GET {path} HTTP/{version}", "Host: test", *extra, "", ""]
    return "\r\n".join(lines).encode()


def post_head(path: str, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json", *extra]
    return ("\r\n".join([*lines, "", ""])).encode()


def push(queue: str, payload: int = 1) -> bytes:
    body = f'{{"items": [{{"queue": "{queue}", "payload": {payload}}}]}}'.encode()
    return post_head("/api/v1/push", f"Content-Length: {len(body)}") + body


def long_poll(queue: str) -> bytes:
    return get(f"/api/v1/pop/queue/{queue}?wait=true&timeout=60000")


async def test_connection_close_is_honoured(server: Any, opened: list[trio.SocketStream]) -> None:
    port = await server(keep_alive_timeout_s=LONG_S, header_timeout_s=LONG_S)
    client = await Client.connect(port, opened)
    await client.send(get("/health", "Connection: close"))
    status, headers, _ = await client.response()
    assert status == 200
    assert headers.get("connection") == "close"
    assert await client.closed_by_server()


async def test_http_1_0_request_is_answered_then_closed(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(keep_alive_timeout_s=LONG_S, header_timeout_s=LONG_S)
    client = await Client.connect(port, opened)
    await client.send(get("/health", version="1.0"))
    status, _, body = await client.response()
    assert status == 200 and b"healthy" in body
    assert await client.closed_by_server()


async def test_keep_alive_connection_serves_requests_then_times_out_when_idle(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(keep_alive_timeout_s=0.5, header_timeout_s=LONG_S)
    client = await Client.connect(port, opened)
    for _ in range(3):
        await client.send(get("/health"))
        status, headers, _ = await client.response()
        assert status == 200 and "connection" not in headers
    assert await client.closed_by_server()


async def test_a_connection_in_use_past_its_keep_alive_closes_that_long_after_its_last_answer(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    keep_alive = 0.5
    port = await server(keep_alive_timeout_s=keep_alive, header_timeout_s=LONG_S)
    client = await Client.connect(port, opened)
    start = trio.current_time()
    while trio.current_time() - start < 3 * keep_alive:  # used well past the first timeout
        await client.send(get("/health"))
        status, _, _ = await client.response()
        assert status == 200
        await trio.sleep(keep_alive * 0.6)  # (a client's pace: never idle a whole timeout)
    await client.send(get("/health"))
    assert (await client.response())[0] == 200
    answered = trio.current_time()
    assert await client.closed_by_server()
    assert trio.current_time() - answered >= keep_alive * 0.9  # counted from the last answer


async def test_headers_trickled_byte_by_byte_are_cut_off(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(keep_alive_timeout_s=LONG_S, header_timeout_s=0.5)
    client = await Client.connect(port, opened)
    await client.send(get("/health"))  # a served request first: the deadline applies again
    assert (await client.response())[0] == 200
    trickle = b"GET /health HTTP/1.1\r\nHost: test\r\n" + b"X-Slow: " + b"a" * 10_000
    closed = False
    with trio.fail_after(20):
        for byte in trickle:
            try:
                await client.send(bytes([byte]))
            except trio.BrokenResourceError:
                closed = True
                break
            with trio.move_on_after(0.05):  # one byte every 50 ms, while watching for the close
                try:
                    if await client.stream.receive_some(65536) == b"":
                        closed = True
                        break
                except trio.BrokenResourceError:  # closed with our bytes unread: a reset
                    closed = True
                    break
    assert closed, "the server waited for the whole trickle"


async def test_a_body_that_stops_arriving_is_cut_off(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(keep_alive_timeout_s=LONG_S, header_timeout_s=LONG_S, body_timeout_s=0.5)
    client = await Client.connect(port, opened)
    await client.send(post_head("/api/v1/push", "Content-Length: 1000") + b'{"items": [')
    start = trio.current_time()
    with trio.fail_after(10):  # the server ends the connection: any bytes, then the end
        while True:
            try:
                if await client.stream.receive_some(65536) == b"":
                    break
            except trio.BrokenResourceError:
                break
    assert trio.current_time() - start >= 0.4  # not before the body's deadline


async def test_a_body_that_keeps_arriving_slowly_is_not_cut_off(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(keep_alive_timeout_s=LONG_S, header_timeout_s=LONG_S, body_timeout_s=0.5)
    client = await Client.connect(port, opened)
    body = b'{"items": [{"queue": "slow-body", "payload": "' + b"x" * 40 + b'"}]}'
    await client.send(post_head("/api/v1/push", f"Content-Length: {len(body)}"))
    for at in range(0, len(body), 8):  # ten pieces, each well within the deadline of the last
        await trio.sleep(0.2)  # (the client's pace: 2 s in all, four deadlines' worth)
        await client.send(body[at : at + 8])
    status, _, answer = await client.response()
    assert status == 201 and b"queued" in answer


async def test_a_request_with_its_whole_body_has_no_deadline(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(keep_alive_timeout_s=LONG_S, header_timeout_s=LONG_S, body_timeout_s=0.3)
    client = await Client.connect(port, opened)
    start = trio.current_time()
    await client.send(get("/api/v1/pop/queue/no-body-deadline?wait=true&timeout=1500"))
    assert (await client.response())[0] == 204  # waited its 1.5 s, five body deadlines
    assert trio.current_time() - start >= 1.4
    await client.send(get("/health"))  # and the connection is still open
    assert (await client.response())[0] == 200


async def test_body_over_the_limit_gets_413_and_the_connection_closes(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(max_body_bytes=4096, keep_alive_timeout_s=LONG_S)
    client = await Client.connect(port, opened)
    await client.send(post_head("/api/v1/push", "Content-Length: 10000000") + b" " * 65536)
    status, headers, body = await client.response()
    assert status == 413 and b"4096" in body
    assert headers.get("connection") == "close"
    assert await client.closed_by_server()


async def test_chunked_body_over_the_limit_gets_413_and_the_connection_closes(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(max_body_bytes=4096, keep_alive_timeout_s=LONG_S)
    client = await Client.connect(port, opened)
    await client.send(post_head("/api/v1/push", "Transfer-Encoding: chunked"))
    chunk = b"1000\r\n" + b" " * 4096 + b"\r\n"
    await client.send(chunk * 2)
    status, headers, _ = await client.response()
    assert status == 413
    assert headers.get("connection") == "close"
    assert await client.closed_by_server()


async def test_a_pooling_client_goes_on_after_a_413(server: Any, queue: str) -> None:
    port = await server(max_body_bytes=4096, keep_alive_timeout_s=LONG_S)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        for _ in range(2):
            big = b'{"items": [{"queue": "q", "payload": "' + b"x" * 5_000_000 + b'"}]}'
            with trio.fail_after(20):
                refused = await http.post(
                    "/api/v1/push", content=big, headers={"content-type": "application/json"}
                )
                assert refused.status_code == 413
                ok = await http.post(
                    "/api/v1/push", json={"items": [{"queue": queue, "payload": 1}]}
                )
                assert ok.status_code == 201


async def test_bodies_over_the_decoding_budget_get_503_with_retry_after(
    server: Any, queue: str, opened: list[trio.SocketStream]
) -> None:
    port = await server(max_body_bytes=4096, max_decoding_bytes=6000, keep_alive_timeout_s=LONG_S)
    body = b'{"items": [{"queue": "' + queue.encode() + b'", "payload": "' + b"x" * 3900
    tail = b'"}]}'
    holder = await Client.connect(port, opened)
    # 3,926 bytes declared, all but the tail sent: the body holds its share of the budget
    await holder.send(post_head("/api/v1/push", f"Content-Length: {len(body) + len(tail)}"))
    await holder.send(body)

    async def refused(*head: str, payload: bytes) -> None:
        client = await Client.connect(port, opened)
        await client.send(post_head("/api/v1/push", *head) + payload)
        status, headers, answer = await client.response()
        assert status == 503
        assert headers.get("retry-after") == "1"
        assert headers.get("connection") == "close"
        assert b"retry later" in answer
        assert await client.closed_by_server()

    # The holder is charged once it reached the server: retry until it has.
    second = b'{"items": [{"queue": "' + queue.encode() + b'", "payload": "' + b"y" * 2500 + tail
    await refused(f"Content-Length: {len(second)}", payload=second)
    chunk = f"{len(second):x}\r\n".encode() + second + b"\r\n0\r\n\r\n"
    await refused("Transfer-Encoding: chunked", payload=chunk)

    await holder.send(tail)
    status, _, answer = await holder.response()
    assert status == 201 and b'"queued"' in answer
    # the budget is free again
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        again = await http.post(
            "/api/v1/push",
            content=second,
            headers={"content-type": "application/json"},
        )
        assert again.status_code == 201


async def test_graceful_stop_does_not_wait_for_idle_clients(
    pg_url: str, tmp_path: Path, opened: list[trio.SocketStream]
) -> None:
    broker = BrokerProcess(
        {
            "DATABASE_URL": pg_url,
            "FILE_BUFFER_DIR": str(tmp_path / "spool"),
            "QUEEN_SHUTDOWN_GRACE_S": str(LONG_S),
            "QUEEN_KEEP_ALIVE_TIMEOUT_S": str(LONG_S),
        }
    )
    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        served = [await Client.connect(broker.port, opened) for _ in range(3)]
        for client in served:
            await client.send(get("/health"))
            assert (await client.response())[0] == 200
        silent = [await Client.connect(broker.port, opened) for _ in range(3)]
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)
        # Every idle connection is closed by the server, and the process is gone, long before
        # the grace period (60 s) could have run out.
        with trio.fail_after(LONG_S / 3):
            for client in served + silent:
                assert await client.closed_by_server(within_s=LONG_S / 3)
            assert await broker.proc.wait() == 0
        nursery.cancel_scope.cancel()


async def test_a_client_leaving_mid_body_gives_its_share_of_the_budget_back(
    server: Any, queue: str, opened: list[trio.SocketStream]
) -> None:
    port = await server(max_body_bytes=4096, max_decoding_bytes=4096)
    leaver = await Client.connect(port, opened)
    await leaver.send(post_head("/api/v1/push", "Content-Length: 4000") + b'{"items": [')
    await leaver.stream.aclose()
    body = b'{"items": [{"queue": "' + queue.encode() + b'", "payload": "' + b"z" * 3000 + b'"}]}'
    # The whole budget is needed: the server must notice the leaver and release its share.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        with trio.fail_after(20):
            while True:
                answer = await http.post(
                    "/api/v1/push", content=body, headers={"content-type": "application/json"}
                )
                if answer.status_code != 503:
                    break
                await trio.sleep(0.05)
    assert answer.status_code == 201


async def test_pipelined_requests_are_all_answered_in_order(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(keep_alive_timeout_s=LONG_S)
    client = await Client.connect(port, opened)
    await client.send(get("/health") + get("/metrics") + get("/health", "Connection: close"))
    first, second, third = [await client.response() for _ in range(3)]
    assert first[0] == 200 and b"healthy" in first[2]
    assert second[0] == 200 and b"queen_" in second[2]
    assert third[0] == 200 and third[1].get("connection") == "close"
    assert await client.closed_by_server()


async def test_oversized_headers_are_refused_and_the_connection_closed(
    server: Any, opened: list[trio.SocketStream]
) -> None:
    port = await server(keep_alive_timeout_s=LONG_S, header_timeout_s=LONG_S)
    client = await Client.connect(port, opened)
    await client.send(get("/health", "X-Big: " + "a" * 100_000))
    status, _, _ = await client.response()
    assert status == 431
    assert await client.closed_by_server()


# --- the client's end: half-closed, closed, reset ------------------------------------------


@pytest.mark.parametrize("what", ["health", "push"])
async def test_a_half_closed_client_gets_its_whole_answer_then_the_close(
    served: Served, queue: str, opened: list[trio.SocketStream], what: str
) -> None:
    client = await Client.connect(served.port, opened)
    await client.send(get("/health") if what == "health" else push(queue))
    await client.stream.send_eof()  # shutdown(SHUT_WR): the request is whole, the client reads
    status, _, body = await client.response()
    if what == "health":
        assert status == 200 and b"healthy" in body
    else:
        assert status == 201 and b'"queued"' in body
    assert await client.closed_by_server(within_s=5)
    await no_connection_left(served.capacity)


async def test_a_half_closed_long_poll_is_answered_at_once_then_closed(
    served: Served, queue: str, opened: list[trio.SocketStream]
) -> None:
    client = await Client.connect(served.port, opened)
    await client.send(long_poll(queue))
    await client.stream.send_eof()
    with trio.fail_after(5):  # the poll may wait 60 s: only the client's end explains an answer
        status, _, _ = await client.response()
    assert status == 204
    assert await client.closed_by_server(within_s=5)
    await no_connection_left(served.capacity)
    await served.broker.consume.wakeups.until_waiting(0)


@pytest.mark.parametrize("how", ["closes", "resets"])
async def test_a_client_gone_mid_request_frees_its_connection(
    served: Served, queue: str, opened: list[trio.SocketStream], how: str
) -> None:
    client = await Client.connect(served.port, opened)
    await client.send(long_poll(queue))
    with trio.fail_after(5):
        await served.broker.consume.wakeups.until_waiting(1)  # the request is in progress
    if how == "resets":
        linger_zero = struct.pack("ii", 1, 0)
        client.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_zero)
    await client.stream.aclose()
    await no_connection_left(served.capacity)
    with trio.fail_after(5):
        await served.broker.consume.wakeups.until_waiting(0)


async def test_graceful_stop_does_not_wait_for_a_half_closed_client(
    pg_url: str, tmp_path: Path, queue: str, opened: list[trio.SocketStream]
) -> None:
    broker = BrokerProcess(
        {
            "DATABASE_URL": pg_url,
            "FILE_BUFFER_DIR": str(tmp_path / "spool"),
            "QUEEN_SHUTDOWN_GRACE_S": str(LONG_S),
            "QUEEN_KEEP_ALIVE_TIMEOUT_S": str(LONG_S),
        }
    )
    async with trio.open_nursery() as nursery:
        await broker.start(nursery)
        client = await Client.connect(broker.port, opened)
        # Two requests at once, then the end of the client's side: the server is serving the
        # second one (or has served it) once the first one is answered.
        await client.send(get("/health") + push(queue))
        await client.stream.send_eof()
        assert (await client.response())[0] == 200
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(LONG_S / 6):  # the grace is 60 s
            status, _, body = await client.response()
            assert status == 201 and b'"queued"' in body
            assert await client.closed_by_server(within_s=LONG_S / 6)
            assert await broker.proc.wait() == 0
        nursery.cancel_scope.cancel()

"""How an answer reaches the socket (:class:`queen.serving.connection.Connection`): one write
per answer on a kept-alive connection, written straight to the socket; an informational ``100
Continue`` at once (before the client sends its body); a whole answer before the server
closes; what the socket cannot take at once sent through Trio; a long streamed answer that
still goes through Trio (and so lets other tasks run) every ``UNYIELDED_WRITE_BYTES``; and the
close of a connection whose client leaves as soon as it has read its answer. Served by the
real serving loop on a real socket; the server's writes are counted where they happen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import h11
import pytest
import trio
import trio.testing
from quart import Response, request
from quart_trio import QuartTrio

from queen.http.asgi import RequestConnection
from queen.server import listen_socket
from queen.serving import ConnectionCapacity, connection, serve_app
from queen.serving.connection import Connection
from queen.settings import Settings


def _app(gate: trio.Event) -> QuartTrio:
    app = QuartTrio("writes-test", static_folder=None)
    app.asgi_http_class = RequestConnection

    @app.get("/gated")
    async def gated() -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield b'{"ok":true}'
            await gate.wait()  # the answer is out, the app has not finished sending it

        return Response(body(), content_type="application/json", headers={"content-length": "11"})

    @app.get("/ping")
    async def ping() -> Response:
        return Response(b'{"ok":true}', content_type="application/json")

    @app.post("/echo")
    async def echo() -> Response:
        return Response(await request.get_data(), status=201, content_type="application/json")

    @app.get("/big")
    async def big() -> Response:
        return Response(BIG, content_type="application/octet-stream")

    @app.get("/stream")
    async def stream() -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            for n in range(STREAM_CHUNKS):
                yield bytes([n]) * STREAM_CHUNK

        return Response(chunks(), content_type="application/octet-stream")

    return app


# An answer larger than what a socket's buffers take at once; a streamed answer of 64 chunks.
BIG = bytes(range(256)) * (32 * 1024)
STREAM_CHUNK, STREAM_CHUNKS = 4 * 1024, 64


class Served:
    def __init__(self, port: int) -> None:
        self.port = port
        self.writes: list[bytes] = []
        # How each write went: "direct" (straight to the socket) or "trio" (send_all).
        self.paths: list[str] = []
        self.capacity = ConnectionCapacity(16)
        self.gate = trio.Event()


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    sock = listen_socket("127.0.0.1", 0)
    found = Served(sock.getsockname()[1])
    original, original_now = trio.SocketStream.send_all, Connection._write_now

    async def counted(self: trio.SocketStream, data: Any) -> None:
        if self.socket.getsockname()[1] == found.port:  # the server's side only
            found.writes.append(bytes(data))
            found.paths.append("trio")
        await original(self, data)

    def counted_now(self: Connection, data: bytes) -> int:
        sent = original_now(self, data)
        found.writes.append(data[:sent])
        found.paths.append("direct")
        return sent

    monkeypatch.setattr(trio.SocketStream, "send_all", counted)
    monkeypatch.setattr(Connection, "_write_now", counted_now)
    settings = Settings(host="127.0.0.1", port=found.port, shutdown_grace_s=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(
                serve_app,
                _app(found.gate),
                settings,
                sock,
                shutdown_trigger=trio.sleep_forever,
                capacity=found.capacity,
            )
        )
        yield found
        nursery.cancel_scope.cancel()


async def _answer(stream: trio.SocketStream, parser: h11.Connection) -> tuple[int, bytes]:
    status, body = 0, b""
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            parser.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return status, body


def _client() -> h11.Connection:
    return h11.Connection(h11.CLIENT)


async def _ask(stream: trio.SocketStream, parser: h11.Connection, path: str) -> None:
    """Send ``GET path`` on ``stream``, ``parser`` made ready to read its answer."""
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    parser.send(h11.Request(method="GET", target=path, headers=[("host", "x")]))
    parser.send(h11.EndOfMessage())


async def test_each_answer_is_one_write_on_a_kept_alive_connection(served: Served) -> None:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        parser = _client()
        for _ in range(3):
            await stream.send_all(
                parser.send(h11.Request(method="GET", target="/ping", headers=[("host", "x")]))
                or b""
            )
            await stream.send_all(parser.send(h11.EndOfMessage()) or b"")
            assert await _answer(stream, parser) == (200, b'{"ok":true}')
            parser.start_next_cycle()
        await stream.aclose()
    assert len(served.writes) == 3
    for write in served.writes:  # head and body together
        assert write.startswith(b"HTTP/1.1 200 ") and write.endswith(b'\r\n\r\n{"ok":true}')
    assert served.paths == ["direct"] * 3  # each straight to the socket


async def test_what_the_socket_cannot_take_at_once_goes_through_trio(served: Served) -> None:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        await stream.send_all(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked(0.05)  # the server waits for the client to read
        received = bytearray()
        while chunk := await stream.receive_some(1 << 20):  # until the server closes
            received += chunk
        await stream.aclose()
    head, body = bytes(received).split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ") and body == BIG  # whole, in order
    assert served.paths[:2] == ["direct", "trio"]  # a part at once, the rest through Trio
    assert 0 < len(served.writes[0]) < len(BIG)


async def test_a_long_streamed_answer_goes_through_trio_every_so_often(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowance = 16 * 1024  # (well under what the sockets' buffers hold: a run could pass it)
    monkeypatch.setattr(connection, "UNYIELDED_WRITE_BYTES", allowance)
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        parser = _client()
        await _ask(stream, parser, "/stream")
        status, body = await _answer(stream, parser)
        await stream.aclose()
    assert status == 200
    assert body == b"".join(bytes([n]) * STREAM_CHUNK for n in range(STREAM_CHUNKS))
    # Never more than the allowance (and the write that crossed it) straight to the socket
    # between two writes through Trio: the streaming task checkpoints at least that often.
    run = longest = 0
    for path, write in zip(served.paths, served.writes, strict=True):
        run = run + len(write) if path == "direct" else 0
        longest = max(longest, run)
    assert longest < allowance + STREAM_CHUNK + 1024
    assert served.paths.count("trio") >= STREAM_CHUNKS * STREAM_CHUNK // (allowance + STREAM_CHUNK)


async def test_a_100_continue_goes_out_before_the_client_sends_its_body(served: Served) -> None:
    body = b'{"items":[]}'
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        await stream.send_all(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        seen = b""
        while b"\r\n\r\n" not in seen:  # the body is not sent until the server says continue
            seen += await stream.receive_some(65536)
        assert seen.startswith(b"HTTP/1.1 100 ")
        rest = seen.split(b"\r\n\r\n", 1)[1]
        await stream.send_all(body)
        parser = _client()
        parser.send(h11.Request(method="POST", target="/", headers=[("host", "x")]))
        parser.send(h11.EndOfMessage())
        if rest:  # (to h11, empty data means the peer closed)
            parser.receive_data(rest)
        assert await _answer(stream, parser) == (201, body)
        await stream.aclose()
    assert [w[:13] for w in served.writes] == [b"HTTP/1.1 100 ", b"HTTP/1.1 201 "]


async def test_an_answer_before_a_close_arrives_whole(served: Served) -> None:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        await stream.send_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := await stream.receive_some(65536):  # until the server closes
            received += chunk
        await stream.aclose()
    assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b'{"ok":true}')
    assert len(served.writes) == 1


async def test_a_client_that_closes_right_after_its_answer_frees_its_connection(
    served: Served,
) -> None:
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", served.port)
        parser = _client()
        await _ask(stream, parser, "/gated")
        assert await _answer(stream, parser) == (200, b'{"ok":true}')
        await stream.aclose()
        # the server has seen the client's end before the app finishes its answer
        await trio.testing.wait_all_tasks_blocked(0.05)
        served.gate.set()
        await trio.testing.wait_all_tasks_blocked(0.05)
    assert served.capacity.open == 0

"""How an answer reaches the socket (:class:`queen.serving.connection.Connection`): one write
per answer on a kept-alive connection, an informational ``100 Continue`` at once (before the
client sends its body), a whole answer before the server closes, and the close of a connection
whose client leaves as soon as it has read its answer. Served by the real serving loop on a
real socket; the server's writes are counted where they happen."""

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
from queen.serving import ConnectionCapacity, serve_app
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

    return app


class Served:
    def __init__(self, port: int) -> None:
        self.port = port
        self.writes: list[bytes] = []
        self.capacity = ConnectionCapacity(16)
        self.gate = trio.Event()


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    sock = listen_socket("127.0.0.1", 0)
    found = Served(sock.getsockname()[1])
    original = trio.SocketStream.send_all

    async def counted(self: trio.SocketStream, data: Any) -> None:
        if self.socket.getsockname()[1] == found.port:  # the server's side only
            found.writes.append(bytes(data))
        await original(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", counted)
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
        await stream.send_all(b"GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
        parser.send(h11.Request(method="GET", target="/gated", headers=[("host", "x")]))
        parser.send(h11.EndOfMessage())
        assert await _answer(stream, parser) == (200, b'{"ok":true}')
        await stream.aclose()
        # the server has seen the client's end before the app finishes its answer
        await trio.testing.wait_all_tasks_blocked(0.05)
        served.gate.set()
        await trio.testing.wait_all_tasks_blocked(0.05)
    assert served.capacity.open == 0

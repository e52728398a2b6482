"""What the serving code assumes of Hypercorn, h11 and Quart-Trio internals, checked one by one.

``queen/serving/connection.py`` subclasses Hypercorn's TCP server (taking the place of its
``run``, overriding its reader, its idle timer, its close and its ``protocol_send``) and holds
h11's response heads; ``queen/serving/inbox.py`` subclasses its per-connection task group to
hand each request's messages over without a channel; ``queen/serving/__init__.py`` drives
Hypercorn's lifespan and worker context itself; and
``queen/http/asgi.py`` subclasses Quart-Trio's HTTP connection, app and request, and takes a
request's body that has all arrived out of it. None of that is public API:
``pyproject.toml`` pins the versions these tests pass with. After an upgrade, each assumption
that no longer holds fails here with its own message (these tests run first), rather than as
a hung or misbehaving connection in the serving tests.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import h11
import pytest
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio import task_group, tcp_server
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper
from hypercorn.utils import parse_socket_addr
from quart import Quart
from quart.asgi import ASGIHTTPConnection
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers.request import TrioBody, TrioRequest


def _body_keeps_what_arrived() -> bool:
    body = TrioBody(None, None)
    body.append(b"ab")
    body.append(b"cd")
    if body._complete.is_set() or body._must_raise is not None:
        return False
    body.set_complete()
    refused = TrioBody(10, 4)
    return (
        type(body._data) is bytearray
        and body._data == b"abcd"
        and body._complete.is_set()
        and refused._must_raise is not None
    )


def _params(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


def _is_coroutine(owner: type, name: str, params: list[str]) -> bool:
    function = getattr(owner, name, None)
    return (
        function is not None
        and inspect.iscoroutinefunction(function)
        and _params(function) == ["self", *params]
    )


def _uses(function: Callable[..., Any], *names: str) -> bool:
    """Whether ``function``'s code names every one of ``names`` (attributes and globals)."""
    return set(names) <= set(function.__code__.co_names)


def _class_uses(owner: type, name: str) -> bool:
    return any(
        name in member.__code__.co_names
        for member in vars(owner).values()
        if inspect.isfunction(member)
    )


def _h11_head_starts_the_answer() -> bool:
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    server.next_event()
    head = server.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
    interim = h11.Connection(h11.SERVER)
    interim.receive_data(b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n\r\n")
    interim.next_event()
    informational = interim.send(h11.InformationalResponse(status_code=100, headers=[]))
    return (
        head is not None
        and head.startswith(b"HTTP/1.1 200")
        and informational is not None
        and informational.startswith(b"HTTP/1.1 100")
    )


def _h11_reads_an_empty_read_as_the_end() -> bool:
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"")
    return isinstance(server.next_event(), h11.ConnectionClosed)


@dataclass(frozen=True)
class Assumption:
    name: str
    what: str  # what is relied upon, and by whom
    holds: Callable[[], bool]


ASSUMPTIONS = (
    Assumption(
        "tcpserver-init",
        "TCPServer(app, config, context, state, stream): how Connection builds its base",
        lambda: (
            _params(TCPServer.__init__) == ["self", "app", "config", "context", "state", "stream"]
        ),
    ),
    Assumption(
        "tcpserver-overridden-methods",
        "TCPServer has the coroutines Connection overrides, with their arguments: run(), "
        "protocol_send(event), _read_data(), _idle_timeout(), _close()",
        lambda: all(
            _is_coroutine(TCPServer, name, params)
            for name, params in (
                ("run", []),
                ("protocol_send", ["event"]),
                ("_read_data", []),
                ("_idle_timeout", []),
                ("_close", []),
            )
        ),
    ),
    Assumption(
        "tcpserver-initiate-server-close",
        "TCPServer._initiate_server_close(): Connection's watchdog closes an idle connection "
        "with it",
        lambda: _is_coroutine(TCPServer, "_initiate_server_close", []),
    ),
    Assumption(
        "tcpserver-run-steps",
        "TCPServer.run serves a plain connection as Connection._serve does: a task group, "
        "self.protocol (a ProtocolWrapper) initiated, self._idle_timeout started once as the "
        "idle timer through idle_task, reading through self._read_data, ending with "
        "self._close (Connection._serve takes run's place, with its own task group)",
        lambda: _uses(
            TCPServer.run,
            "TaskGroup",
            "ProtocolWrapper",
            "protocol",
            "initiate",
            "idle_task",
            "_idle_timeout",
            "_read_data",
            "_close",
        ),
    ),
    Assumption(
        "protocol-wrapper-init",
        "ProtocolWrapper(app, config, context, task_group, state, ssl, client, server, send, "
        "alpn_protocol) and hypercorn.utils.parse_socket_addr(family, address): how "
        "Connection._serve builds the protocol",
        lambda: (
            _params(ProtocolWrapper.__init__)
            == [
                "self",
                "app",
                "config",
                "context",
                "task_group",
                "state",
                "ssl",
                "client",
                "server",
                "send",
                "alpn_protocol",
            ]
            and _params(parse_socket_addr) == ["family", "address"]
        ),
    ),
    Assumption(
        "task-group-spawn-app",
        "Hypercorn's trio TaskGroup holds its nursery in _nursery and starts a request's app "
        "with spawn_app(app, config, scope, send), returning how to put a message to the app; "
        "task_group._handle(app, config, scope, receive, send, sync_spawn, call_soon) runs it: "
        "RequestTasks replaces the app's channel with a RequestInbox",
        lambda: (
            _is_coroutine(TaskGroup, "spawn_app", ["app", "config", "scope", "send"])
            and _uses(TaskGroup.__aenter__, "_nursery")
            and _params(task_group._handle)
            == ["app", "config", "scope", "receive", "send", "sync_spawn", "call_soon"]
        ),
    ),
    Assumption(
        "http-stream-app-put",
        "HTTPStream.handle starts the app with spawn_app and hands it body chunks and the "
        "disconnect through what spawn_app returned (app_put), its scope carrying an "
        "extensions dict: RequestTasks offers the inbox's listen there",
        lambda: (
            _uses(HTTPStream.handle, "spawn_app", "app_put")
            and "extensions" in HTTPStream.handle.__code__.co_consts
        ),
    ),
    Assumption(
        "tcpserver-protocol-send",
        "TCPServer.protocol_send writes RawData with stream.send_all and closes on Closed "
        "through self._close, then tells the protocol: Connection hands both to it",
        lambda: _uses(TCPServer.protocol_send, "send_all", "_close", "handle"),
    ),
    Assumption(
        "tcpserver-send-lock",
        "TCPServer.__init__ makes self.send_lock and protocol_send writes under it: "
        "Connection._send_raw writes answers under the same lock",
        lambda: (
            _uses(TCPServer.__init__, "send_lock", "Lock")
            and _uses(TCPServer.protocol_send, "send_lock")
        ),
    ),
    Assumption(
        "tcpserver-max-recv",
        "hypercorn.trio.tcp_server.MAX_RECV, the read size Connection's reader uses",
        lambda: isinstance(tcp_server.MAX_RECV, int) and tcp_server.MAX_RECV > 0,
    ),
    Assumption(
        "protocol-handle",
        "ProtocolWrapper.handle(event): Connection feeds it RawData and Closed",
        lambda: _is_coroutine(ProtocolWrapper, "handle", ["event"]),
    ),
    Assumption(
        "events",
        "RawData(data), Updated(idle) and Closed() are dataclasses with those fields and no "
        "subclasses: Connection.protocol_send tells them apart by their exact type",
        lambda: (
            [f.name for f in dataclasses.fields(RawData)][:1] == ["data"]
            and [f.name for f in dataclasses.fields(Updated)] == ["idle"]
            and [f.name for f in dataclasses.fields(Closed)] == []
            and not RawData.__subclasses__()
            and not Updated.__subclasses__()
            and not Closed.__subclasses__()
        ),
    ),
    Assumption(
        "h11-protocol-says-idle",
        "Hypercorn's HTTP/1.1 protocol sends Updated(idle=...) around each request: "
        "Connection moves its watchdog's deadline and its place in the capacity on it",
        lambda: _class_uses(H11Protocol, "Updated"),
    ),
    Assumption(
        "h11-heads",
        "h11 writes a response head as its own piece starting with b'HTTP/1.1 <status>' "
        "(b'HTTP/1.1 1..' for an informational one): Connection holds the final head to "
        "write it with the body",
        _h11_head_starts_the_answer,
    ),
    Assumption(
        "h11-end-of-stream",
        "h11 takes an empty read as the end of the client's side: Connection hands it "
        "RawData(b'') when the client half-closes",
        _h11_reads_an_empty_read_as_the_end,
    ),
    Assumption(
        "worker-context",
        "WorkerContext(max_requests) with .terminated an event of async set(), wait() and "
        "is_set(): serve_app and Connection's watchdog use it for shutdown",
        lambda: (
            _params(WorkerContext.__init__) == ["self", "max_requests"]
            and inspect.iscoroutinefunction(WorkerContext(None).terminated.set)
            and inspect.iscoroutinefunction(WorkerContext(None).terminated.wait)
            and callable(WorkerContext(None).terminated.is_set)
        ),
    ),
    Assumption(
        "lifespan",
        "Lifespan(app, config, state) with handle_lifespan(task_status=), wait_for_startup() "
        "and wait_for_shutdown(): serve_app runs the app's lifespan with them",
        lambda: (
            _params(Lifespan.__init__) == ["self", "app", "config", "state"]
            and _is_coroutine(Lifespan, "handle_lifespan", ["task_status"])
            and _is_coroutine(Lifespan, "wait_for_startup", [])
            and _is_coroutine(Lifespan, "wait_for_shutdown", [])
        ),
    ),
    Assumption(
        "app-wrapper",
        "ASGIWrapper(app), called as (scope, receive, send, sync_spawn, call_soon) like every "
        "AppWrapper: Connection's _WithClientEnd wraps that call",
        lambda: (
            _params(ASGIWrapper.__init__) == ["self", "app"]
            and _params(ASGIWrapper.__call__)
            == ["self", "scope", "receive", "send", "sync_spawn", "call_soon"]
            and _params(AppWrapper.__call__) == _params(ASGIWrapper.__call__)
        ),
    ),
    Assumption(
        "config",
        "Config() has bind, accesslog, errorlog, graceful_timeout, keep_alive_timeout, "
        "backlog and ssl_handshake_timeout: hypercorn_config sets them, serve_app and "
        "Connection read them",
        lambda: all(
            hasattr(Config(), name)
            for name in (
                "bind",
                "accesslog",
                "errorlog",
                "graceful_timeout",
                "keep_alive_timeout",
                "backlog",
                "ssl_handshake_timeout",
            )
        ),
    ),
    Assumption(
        "quart-trio-connection",
        "Quart-Trio's HTTP connection is QuartTrio.asgi_http_class, built as (app, scope), "
        "with _create_request_from_scope(send), handle_messages(nursery, request, receive), "
        "handle_request(nursery, request, send) and _send_response(send, response); the app's "
        "handle_request(request) answers, and a request's body takes append(data) and "
        "set_complete(): queen/http/asgi.py's RequestConnection runs them in Hypercorn's task",
        lambda: (
            QuartTrio.asgi_http_class is TrioASGIHTTPConnection
            and _params(ASGIHTTPConnection.__init__) == ["self", "app", "scope"]
            and _params(TrioASGIHTTPConnection._create_request_from_scope) == ["self", "send"]
            and _is_coroutine(
                TrioASGIHTTPConnection, "handle_messages", ["nursery", "request", "receive"]
            )
            and _is_coroutine(
                TrioASGIHTTPConnection, "handle_request", ["nursery", "request", "send"]
            )
            and _is_coroutine(TrioASGIHTTPConnection, "_send_response", ["send", "response"])
            and _is_coroutine(QuartTrio, "handle_request", ["request"])
            and _params(TrioBody.append) == ["self", "data"]
            and _params(TrioBody.set_complete) == ["self"]
        ),
    ),
    Assumption(
        "quart-body-internals",
        "a request's TrioBody keeps what arrived in _data (a bytearray), says it is all there "
        "with _complete.is_set(), and holds a refusal in _must_raise: queen/http/asgi.py's "
        "arrived_body takes a body that has all arrived from it",
        _body_keeps_what_arrived,
    ),
    Assumption(
        "quart-app-hooks",
        "Quart asks the app's ensure_async(func) for every hook and route it runs, and a "
        "request's blueprints is a property worked out from its url_rule: queen/http/asgi.py's "
        "App keeps each function's async form and AppRequest the blueprints of a rule",
        lambda: (
            _params(Quart.ensure_async) == ["self", "func"]
            and all(
                _uses(getattr(Quart, name), "ensure_async")
                for name in ("preprocess_request", "dispatch_request", "process_response")
            )
            and isinstance(inspect.getattr_static(TrioRequest, "blueprints"), property)
            and _uses(inspect.getattr_static(TrioRequest, "blueprints").fget, "blueprint")
        ),
    ),
)


def failure(assumption: Assumption) -> str | None:
    """What to say when ``assumption`` no longer holds (None while it does)."""
    if assumption.holds():
        return None
    versions = ", ".join(
        f"{package} {version(package)}" for package in ("hypercorn", "h11", "quart-trio")
    )
    return (
        f"serving relies on {assumption.what}; this is no longer so with {versions}: adapt "
        "queen/serving (or queen/http/asgi.py) before moving the pins in pyproject.toml"
    )


@pytest.mark.parametrize("assumption", ASSUMPTIONS, ids=[a.name for a in ASSUMPTIONS])
def test_what_serving_relies_on_holds(assumption: Assumption) -> None:
    message = failure(assumption)
    if message is not None:
        pytest.fail(message, pytrace=False)


def _assumption(name: str) -> Assumption:
    [found] = [a for a in ASSUMPTIONS if a.name == name]
    return found


def test_a_server_that_changed_what_connection_overrides_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    overrides, calls = (
        _assumption("tcpserver-overridden-methods"),
        _assumption("tcpserver-run-steps"),
    )
    assert failure(overrides) is None and failure(calls) is None

    async def run_reading_otherwise(self: TCPServer) -> None:
        await self.protocol.initiate()

    monkeypatch.setattr(TCPServer, "_read_data", None)
    monkeypatch.setattr(TCPServer, "run", run_reading_otherwise)
    for changed in (overrides, calls):
        message = failure(changed)
        assert message is not None and changed.what in message
        assert f"hypercorn {version('hypercorn')}" in message

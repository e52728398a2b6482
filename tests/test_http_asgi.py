"""How the app serves one request (:mod:`queen.http.asgi`) and which per-request hooks it
installs: the app runs in the task the server started for the request (one task fewer than
Quart-Trio's own connection class; none of its own where the server hands the request's
messages over, as ours does), a client that leaves still cancels its route, an answer still
ends the exchange; a body that has all arrived is read without a wait; the app works out
each function's async form once and keeps the blueprints' hooks to their routes; the access
gate and CORS add hooks only when they have something to decide."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from quart import Blueprint, Response, request
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers.request import TrioBody
from werkzeug.exceptions import RequestEntityTooLarge

from queen.auth import AccessGate
from queen.http import access, cors
from queen.http.asgi import App, RequestConnection, arrived_body
from queen.http.responses import read_body
from queen.serving.inbox import LISTEN, RequestInbox


class _SpawnCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1


def _app(connection_class: type[TrioASGIHTTPConnection], events: list[str]) -> QuartTrio:
    app = QuartTrio("asgi-test", static_folder=None)
    app.asgi_http_class = connection_class

    @app.post("/echo")
    async def echo() -> Response:
        return Response(await request.get_data(), status=201)

    @app.get("/hang")
    async def hang() -> Response:
        try:
            await trio.sleep_forever()
        finally:
            events.append("route cancelled")
        return Response("never")  # pragma: no cover

    return app


def _scope(method: str, path: str, body: bytes = b"") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "extensions": {},
    }


async def _serve(app: QuartTrio, scope: dict[str, Any], incoming: list[dict[str, Any]]) -> Any:
    """Run one ASGI exchange: ``incoming`` are the receive() messages in order (then it
    blocks, as a server does while the client stays); returns what the app sent."""
    sent: list[dict[str, Any]] = []
    pending = list(incoming)

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)  # type: ignore[arg-type]
    return sent


async def _spawned_for_one_push(connection_class: type[TrioASGIHTTPConnection]) -> int:
    app = _app(connection_class, [])
    counter = _SpawnCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        sent = await _serve(
            app,
            _scope("POST", "/echo", b"hello"),
            [{"type": "http.request", "body": b"hello", "more_body": False}],
        )
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert sent[0]["status"] == 201 and sent[1]["body"] == b"hello"
    return counter.spawned


async def test_a_request_starts_one_task_fewer_than_quart_trios_own() -> None:
    with trio.fail_after(10):
        ours = await _spawned_for_one_push(RequestConnection)
        theirs = await _spawned_for_one_push(TrioASGIHTTPConnection)
    assert ours == theirs - 1


@pytest.mark.parametrize("handed_over", [False, True], ids=["received", "handed-over"])
async def test_a_client_that_leaves_cancels_its_route(handed_over: bool) -> None:
    events: list[str] = []
    app = _app(RequestConnection, events)
    head: list[dict[str, Any]] = [{"type": "http.request", "body": b"", "more_body": False}]
    gone: list[dict[str, Any]] = [{"type": "http.disconnect"}]
    with trio.fail_after(10):
        if handed_over:  # as our server serves it (below)
            sent = await _serve_listening(app, _scope("GET", "/hang"), head, gone)
        else:
            sent = await _serve(app, _scope("GET", "/hang"), head + gone)
    assert events == ["route cancelled"]
    assert sent == []  # nothing is answered to a client that has gone


async def test_an_answer_ends_the_exchange_while_the_client_stays() -> None:
    # The body feeder waits for a disconnect that never comes: the answer must end it.
    app = _app(RequestConnection, [])
    with trio.fail_after(10):
        sent = await _serve(
            app,
            _scope("POST", "/echo", b"x"),
            [{"type": "http.request", "body": b"x", "more_body": False}],
        )
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 201
    assert sent[-1]["type"] == "http.response.body" and not sent[-1].get("more_body", False)


# --- as our server runs it: the request's messages handed over as they arrive ---------------


def _listening(scope: dict[str, Any]) -> RequestInbox:
    """The request's inbox, offered to the app in its scope as the server offers it."""
    inbox = RequestInbox()
    scope["extensions"][LISTEN] = {"listen": inbox.listen}
    return inbox


async def _serve_listening(
    app: QuartTrio,
    scope: dict[str, Any],
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """One exchange through a :class:`RequestInbox`: ``before`` arrives before the app runs,
    ``after`` once the app is waiting; returns what the app sent."""
    inbox = _listening(scope)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for message in before:
        await inbox.put(message)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app, scope, inbox.receive, send)
        await trio.testing.wait_all_tasks_blocked()
        for message in after:
            await inbox.put(message)  # type: ignore[arg-type]
    return sent


async def test_a_request_whose_messages_are_handed_over_starts_no_task() -> None:
    app = _app(RequestConnection, [])
    scope = _scope("POST", "/echo", b"hello")
    inbox = _listening(scope)
    await inbox.put({"type": "http.request", "body": b"hello", "more_body": False})
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    counter = _SpawnCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        with trio.fail_after(10):
            await app(scope, inbox.receive, send)  # type: ignore[arg-type]
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert sent[0]["status"] == 201 and sent[1]["body"] == b"hello"
    assert counter.spawned == 0


async def test_a_body_arriving_while_its_route_waits_for_it_is_read_whole() -> None:
    app = _app(RequestConnection, [])
    with trio.fail_after(10):
        sent = await _serve_listening(
            app,
            _scope("POST", "/echo", b"hello world"),
            [{"type": "http.request", "body": b"hello ", "more_body": True}],
            [{"type": "http.request", "body": b"world", "more_body": False}],
        )
    assert sent[0]["status"] == 201 and sent[1]["body"] == b"hello world"


async def test_once_answered_a_request_takes_no_more_messages() -> None:
    # What arrives after the answer (the disconnect of a closing connection) is not the
    # finished request's: it stays queued for whoever reads the inbox next.
    app = _app(RequestConnection, [])
    scope = _scope("POST", "/echo", b"x")
    inbox = _listening(scope)
    await inbox.put({"type": "http.request", "body": b"x", "more_body": False})

    async def send(message: dict[str, Any]) -> None:
        pass

    with trio.fail_after(10):
        await app(scope, inbox.receive, send)  # type: ignore[arg-type]
        await inbox.put({"type": "http.disconnect"})
        assert await inbox.receive() == {"type": "http.disconnect"}


def _hooks(app: QuartTrio) -> tuple[int, int]:
    return len(app.before_request_funcs.get(None, [])), len(app.after_request_funcs.get(None, []))


def test_an_open_gate_adds_no_access_hook_and_a_closed_one_adds_one() -> None:
    # (the after-request hook, in both, is the audit log of operators' actions)
    open_app = QuartTrio("open", static_folder=None)
    access.install(open_app, AccessGate.disabled())
    assert _hooks(open_app) == (0, 1)

    class _Verifier:  # any verifier turns the gate on; this one is never asked
        pass

    closed_app = QuartTrio("closed", static_folder=None)
    access.install(closed_app, AccessGate(_Verifier()))  # type: ignore[arg-type]
    assert _hooks(closed_app) == (1, 1)


def test_cors_answers_preflights_always_and_decorates_answers_only_with_origins() -> None:
    without = QuartTrio("without", static_folder=None)
    cors.install(without, "")
    assert _hooks(without) == (1, 0)
    with_origins = QuartTrio("with", static_folder=None)
    cors.install(with_origins, "https://ops.example")
    assert _hooks(with_origins) == (1, 1)


async def test_a_body_that_has_all_arrived_is_taken_once_without_a_copy() -> None:
    body = TrioBody(None, None)
    body.append(b'{"items":')
    assert arrived_body(body) is None  # more may come: nothing is taken
    body.append(b"[]}")
    body.set_complete()
    held = body._data
    whole = arrived_body(body)
    assert whole == b'{"items":[]}' and whole is held  # the framework's buffer itself
    assert await body == b""  # taken: the request's body now reads as empty
    refused = TrioBody(10, 4)  # declared over the limit: left to the reader, which raises
    refused.set_complete()
    assert arrived_body(refused) is None


async def test_a_route_reads_a_body_that_has_arrived_without_a_checkpoint() -> None:
    app = App("arrived", static_folder=None)
    async with app.test_request_context("/p", method="POST", data=b'{"a":1}'):
        with trio.testing.assert_no_checkpoints():
            assert await read_body() == b'{"a":1}'
    async with app.test_request_context("/p", method="POST", data=b'{"a":1}'):
        # the limit still holds for a body that declared no length
        app.config["MAX_CONTENT_LENGTH"] = 4
        request.content_length = None  # type: ignore[misc]
        with pytest.raises(RequestEntityTooLarge):
            await read_body()


def test_the_app_works_out_a_functions_async_form_once() -> None:
    app = App("forms", static_folder=None)

    def plain() -> int:
        return 1

    async def coroutine() -> int:
        return 2

    assert app.ensure_async(coroutine) is coroutine
    wrapped = app.ensure_async(plain)
    assert wrapped is not plain and app.ensure_async(plain) is wrapped
    assert trio.run(wrapped) == 1  # (run in a worker thread, as Quart runs sync functions)
    bound = app.ensure_async(app.config.get)  # a bound method: worked out anew, not kept
    assert bound is not app.ensure_async(app.config.get) and plain in app._async_forms


async def test_blueprint_hooks_run_for_the_blueprints_routes_only() -> None:
    app, seen = App("blueprints", static_folder=None), []
    inner = Blueprint("inner", __name__)

    @inner.before_request
    async def inner_before() -> None:
        seen.append(("before", request.path))

    @inner.after_request
    async def inner_after(response: Response) -> Response:
        seen.append(("after", request.path))
        return response

    @inner.teardown_request
    async def inner_teardown(exc: BaseException | None) -> None:
        seen.append(("teardown", request.path))

    @inner.get("/in")
    async def inside() -> str:
        return "in"

    @app.get("/out")
    async def outside() -> str:
        return "out"

    app.register_blueprint(inner)
    client = app.test_client()
    assert (await client.get("/in")).status_code == 200
    assert (await client.get("/out")).status_code == 200
    assert (await client.get("/in")).status_code == 200
    assert seen == [("before", "/in"), ("after", "/in"), ("teardown", "/in")] * 2

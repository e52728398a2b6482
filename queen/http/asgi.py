"""How Quart-Trio serves one HTTP request, without a task of its own.

Quart-Trio serves a request in a nursery of two tasks it starts for it: one feeds the request
body (and notices the client leaving), the other runs the app and sends the answer; whichever
ends first cancels the other. :class:`RequestConnection` runs the app in the task Hypercorn
already started for the request. Where the server hands a request's messages over as they
arrive (:func:`queen.serving.request_listener`: ours does), there is no feeder either: each
body chunk goes into the request and a client that leaves cancels it, in the connection's
reader. Under any other server the feeder stays, a task in a nursery beside the app's, as
Quart-Trio has it. Starting, waking and cancelling tasks per request was a measurable share of
a small request's CPU.

The path routed is :func:`queen.http.paths.routing_path`'s: a ``/`` sent as ``%2F`` stays
inside its segment.

It also gives back what a request's answer held in the process's byte budget (a pop's
answer, :func:`release_when_sent`) once the answer is sent, or the request ends otherwise (the
client left, an error).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from types import FunctionType
from typing import Any, cast

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGIReceiveEvent, ASGISendCallable
from quart.wrappers import Body, Request, Response
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers import TrioRequest

from queen.budget import Charge
from queen.http.paths import routing_path
from queen.serving import Listener, request_listener

# The charges the request being served releases when it ends (the app runs in its task).
_WHEN_SENT: ContextVar[list[Charge] | None] = ContextVar("queen_release_when_sent", default=None)


def release_when_sent(charge: Charge) -> None:
    """Release ``charge`` when the current request's answer has been sent (its last byte
    handed to the socket), or when the request ends without it; at once outside a request."""
    held = _WHEN_SENT.get()
    if held is None:
        charge.release()
    else:
        held.append(charge)


def arrived_body(body: Body) -> bytearray | None:
    """What ``body`` holds, once all of it has arrived, taken out of the request (it reads as
    empty afterwards: what reading it would have given); else None, and nothing changes. A
    small request's body usually arrives with its head: it is then read without a wait, a
    cancel scope or a copy."""
    if not body._complete.is_set() or body._must_raise is not None:
        return None
    whole, body._data = body._data, bytearray()
    return whole


class RequestConnection(TrioASGIHTTPConnection):
    """Quart-Trio's HTTP connection with the app run in the calling task, routing the path
    with its encoded slashes kept."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        self.scope["path"] = routing_path(self.scope["path"], self.scope.get("raw_path"))
        request = self._create_request_from_scope(send)
        held: list[Charge] = []
        token = _WHEN_SENT.set(held)
        try:
            listen = request_listener(self.scope)
            if listen is None:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.handle_messages, nursery, request, receive)
                    await self.handle_request(nursery, request, send)
            else:
                await self._answer_listening(listen, request, send)
        finally:
            _WHEN_SENT.reset(token)
            for charge in held:
                charge.release()

    async def _answer_listening(
        self, listen: Callable[[Listener | None], None], request: Request, send: ASGISendCallable
    ) -> None:
        """Serve the request with its messages handed over as they arrive: the body goes
        into the request, and a client that leaves cancels it."""
        body = request.body
        with trio.CancelScope() as scope:

            def take(message: ASGIReceiveEvent) -> None:
                if message["type"] == "http.request":
                    body.append(message.get("body", b""))
                    if not message.get("more_body", False):
                        body.set_complete()
                elif message["type"] == "http.disconnect":
                    scope.cancel()

            listen(take)
            try:
                response = await self.app.handle_request(request)
                if isinstance(response, Response) and response.timeout != Ellipsis:
                    timeout = cast(float | None, response.timeout)
                else:
                    timeout = self.app.config["RESPONSE_TIMEOUT"]
                if timeout is not None:
                    # (an answer not sent by then is given up, as Quart-Trio does)
                    scope.deadline = trio.current_time() + timeout
                await self._send_response(send, response)
            finally:
                listen(None)


class AppRequest(TrioRequest):
    """Quart-Trio's request, its blueprints worked out once per matched rule: Quart asks for
    them when it runs the before-request hooks, the after-request hooks and the teardown."""

    @property
    def blueprints(self) -> list[str]:
        rule = self.url_rule
        known: tuple[object, list[str]] | None = self.__dict__.get("_blueprints_of")
        if known is not None and known[0] is rule:
            return known[1]
        names = super().blueprints
        self.__dict__["_blueprints_of"] = (rule, names)
        return names


class App(QuartTrio):
    """The Quart-Trio app every route of the broker runs in: requests served by
    :class:`RequestConnection` as :class:`AppRequest`, and each function's async form (Quart
    asks for it for every hook and route of every request) worked out once."""

    asgi_http_class = RequestConnection
    request_class = AppRequest

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._async_forms: dict[FunctionType, Callable[..., Awaitable[Any]]] = {}

    def ensure_async(self, func: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        if type(func) is not FunctionType:  # (a bound method or a partial may be made anew)
            return super().ensure_async(func)
        form = self._async_forms.get(func)
        if form is None:
            form = self._async_forms[func] = super().ensure_async(func)
        return form

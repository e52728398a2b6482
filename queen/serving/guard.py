"""The ASGI layer between Hypercorn and the Quart-Trio app.

Quart-Trio ends a request's nursery as soon as it receives ``http.disconnect``, and Hypercorn
sends that message from inside the app's last ``send()``, while that same call is still
closing the connection or starting its keep-alive timer. Forwarded, the message cancels
Hypercorn's own close path: sockets then stay open after ``Connection: close``, after HTTP/1.0
requests, after a refused body, and idle connections never time out. The guard therefore
keeps ``http.disconnect`` from the app once its response is complete (a disconnect before
that is forwarded: the app must stop working for a client that left).

It also bounds the request body bytes the process holds at once (the process's
:class:`~queen.budget.ByteBudget`, which pop answers are charged to as well): a body is
charged when it starts (its ``Content-Length``) or as it arrives (chunked), and released when
its request has been answered. A body that does not fit is answered 503 with
``Retry-After`` without being read, and the connection is closed. A response that starts
before its request body was received says ``Connection: close``: the server closes such a
connection rather than leave the unread body in the way of the next request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import orjson
import trio
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPScope,
    Scope,
)

from queen.budget import ByteBudget
from queen.serving.inbox import LISTEN, Listener, request_listener

log = logging.getLogger("queen.http")

RETRY_AFTER_S = 1


class ConnectionGuard:
    """An ASGI app wrapping ``app``; see the module's docstring."""

    def __init__(self, app: ASGIFramework, budget: ByteBudget, max_body_bytes: int) -> None:
        self.app = app
        self.budget = budget
        self.max_body_bytes = max_body_bytes

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await _Exchange(self, scope, receive, send).run()


def _body_framing(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bool, int | None]:
    """(whether the request has a body, its declared length if it has one)."""
    length: int | None = None
    chunked = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = None
        elif lowered == b"transfer-encoding":
            chunked = True
    if chunked:
        return True, None
    if length:
        return True, length
    return False, None


class _Exchange:
    """One request and its answer, as seen between Hypercorn and the app."""

    def __init__(
        self,
        guard: ConnectionGuard,
        scope: HTTPScope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
    ) -> None:
        self.guard = guard
        self.scope = scope
        self._receive = receive
        self._send = send
        # The inbox's listen, offered to the app through this guard in its place.
        self._listen = request_listener(scope)
        if self._listen is not None:
            scope["extensions"][LISTEN] = {"listen": self.listen}
        has_body, self.declared = _body_framing(scope["headers"])
        self.body_received = not has_body
        self.received = 0
        self.charged = 0
        self.refused = False
        self.response_started = False
        self.response_done = False

    async def run(self) -> None:
        budget = self.guard.budget
        try:
            declared = self.declared
            if declared is not None and declared <= self.guard.max_body_bytes:
                # Over the body limit the app answers 413 without reading: nothing to charge.
                if not budget.try_charge(declared):
                    await self._refuse()
                    return
                self.charged = declared
            await self.guard.app(self.scope, self.receive, self.send)
            if self.refused and not self.response_started:
                await self._refuse()
        finally:
            budget.release(self.charged, trim=True)

    async def receive(self) -> ASGIReceiveEvent:
        while True:
            message = self._passed(await self._receive())
            if message is not None:
                return message

    def listen(self, listener: Listener | None) -> None:
        """The inbox's :meth:`~queen.serving.inbox.RequestInbox.listen`, through this guard."""
        assert self._listen is not None
        if listener is None:
            self._listen(None)
            return

        def passed(message: ASGIReceiveEvent) -> None:
            given = self._passed(message)
            if given is not None:
                listener(given)

        self._listen(passed)

    def _passed(self, message: ASGIReceiveEvent) -> ASGIReceiveEvent | None:
        """What the app is given for ``message``: it, a disconnect in its place (a chunked
        body the budget refuses), or nothing."""
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.declared is None:
                # A chunked body is charged as it arrives, up to the body limit (past it the
                # app answers 413).
                want = min(self.received, self.guard.max_body_bytes) - self.charged
                if want > 0:
                    if not self.guard.budget.try_charge(want):
                        # The app stops as if the client had left; run() answers 503.
                        self.refused = True
                        return {"type": "http.disconnect"}
                    self.charged += want
            if not message.get("more_body", False):
                self.body_received = True
        elif message["type"] == "http.disconnect" and self.response_done:
            # Hypercorn says the exchange is over while the app's last send() is still
            # closing the connection or arming its idle timer: the app must not be cancelled
            # now. It is cancelled anyway as soon as that send() returns.
            return None
        return message

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            self.response_started = True
            if not self.body_received:
                headers = list(message.get("headers", []))
                headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.response_done = True
        await self._send(message)

    async def _refuse(self) -> None:
        """Answer 503 with ``Retry-After`` and close; the body is never read."""
        budget = self.guard.budget
        log.warning(
            "refused a request body of %s bytes: %d of %d bytes of request bodies and pop "
            "answers in progress",
            self.declared if self.declared is not None else "chunked",
            budget.in_use_bytes,
            budget.limit_bytes,
        )
        body = orjson.dumps({"error": "too many request bodies in progress; retry later"})
        self.response_started = True
        async with trio.open_nursery() as nursery:
            # Hypercorn keeps handing over body chunks (and finally the disconnect) while the
            # answer goes out: take them, or its queue fills and the close never happens.
            nursery.start_soon(self._discard_body)
            await self._send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", str(RETRY_AFTER_S).encode()),
                        (b"connection", b"close"),
                    ],
                    "trailers": False,
                }
            )
            await self._send({"type": "http.response.body", "body": body, "more_body": False})
            nursery.cancel_scope.cancel()

    async def _discard_body(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass

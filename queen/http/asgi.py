"""How Quart-Trio serves one HTTP request, with one task fewer.

Quart-Trio serves a request in a nursery of two tasks it starts for it: one feeds the request
body (and notices the client leaving), the other runs the app and sends the answer; whichever
ends first cancels the other. :class:`RequestConnection` keeps the body feeder as a task and
runs the app in the task Hypercorn already started for the request, inside the same nursery:
a client that leaves still cancels its request, an answer sent still ends the feeder, and an
error still surfaces from the nursery as before. Starting and ending a task per request was a
measurable share of a small request's CPU.

The path routed is :func:`queen.http.paths.routing_path`'s: a ``/`` sent as ``%2F`` stays
inside its segment.

It also gives back what a request's answer held in the process's byte budget (a pop's
answer, :func:`release_when_sent`) once the answer is sent, or the request ends otherwise (the
client left, an error).
"""

from __future__ import annotations

from contextvars import ContextVar

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from quart_trio.asgi import TrioASGIHTTPConnection

from queen.budget import Charge
from queen.http.paths import routing_path

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


class RequestConnection(TrioASGIHTTPConnection):
    """Quart-Trio's HTTP connection with the app run in the calling task, routing the path
    with its encoded slashes kept."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        self.scope["path"] = routing_path(self.scope["path"], self.scope.get("raw_path"))
        request = self._create_request_from_scope(send)
        held: list[Charge] = []
        token = _WHEN_SENT.set(held)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.handle_messages, nursery, request, receive)
                await self.handle_request(nursery, request, send)
        finally:
            _WHEN_SENT.reset(token)
            for charge in held:
                charge.release()

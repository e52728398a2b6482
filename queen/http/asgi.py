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
"""

from __future__ import annotations

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from quart_trio.asgi import TrioASGIHTTPConnection

from queen.http.paths import routing_path


class RequestConnection(TrioASGIHTTPConnection):
    """Quart-Trio's HTTP connection with the app run in the calling task, routing the path
    with its encoded slashes kept."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        self.scope["path"] = routing_path(self.scope["path"], self.scope.get("raw_path"))
        request = self._create_request_from_scope(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handle_messages, nursery, request, receive)
            await self.handle_request(nursery, request, send)

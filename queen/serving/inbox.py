"""A request's messages from Hypercorn to the app, handed over without a channel or a task.

Hypercorn gives each request's app a memory channel for what the connection's reader parses
after the head (body chunks, then ``http.disconnect``), and Quart-Trio starts a task per
request whose only work is to move those messages into the request's body and to cancel the
request when the client leaves: per request a channel, a task started and cancelled, and a
task switch per message.

:class:`RequestInbox` replaces the channel. A message is either queued for ``receive()``
(the ASGI way, for whatever reads it so) or, once the app has said what to do with each
message (:meth:`RequestInbox.listen`), handled at once in the reader's own task. The app finds
how to listen in its scope (:func:`request_listener`); an app that does not look reads with
``receive()`` as ASGI says. Once the app has ended, what still arrives for it is dropped: no
one will read it.

:class:`RequestTasks` is Hypercorn's per-connection task group with that inbox in place of the
channel.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio.task_group import TaskGroup, _handle
from hypercorn.typing import AppWrapper, ASGIReceiveEvent, ASGISendEvent, Scope

# The ASGI scope extension under which a request finds how to listen to its messages.
LISTEN = "queen.listen"

Listener = Callable[[ASGIReceiveEvent], None]


class RequestInbox:
    """What arrives for one request after its head (see the module's docstring)."""

    __slots__ = ("_closed", "_listener", "_queue", "_waiting")

    def __init__(self) -> None:
        self._queue: deque[ASGIReceiveEvent] = deque()
        self._waiting: trio.lowlevel.Task | None = None
        self._listener: Listener | None = None
        self._closed = False

    async def put(self, message: ASGIReceiveEvent) -> None:
        """Hypercorn's hand-over: to the listener at once, else queued for ``receive()``."""
        if self._closed:
            return
        listener = self._listener
        if listener is not None:
            listener(message)
            return
        self._queue.append(message)
        waiting = self._waiting
        if waiting is not None:
            self._waiting = None
            trio.lowlevel.reschedule(waiting)

    async def receive(self) -> ASGIReceiveEvent:
        """The next message, waiting for it if none is queued (one reader at a time)."""
        if self._queue:
            await trio.lowlevel.checkpoint()
        while not self._queue:  # (a listener may have taken what woke this reader)
            if self._waiting is not None:
                raise trio.BusyResourceError("another task is already receiving")
            self._waiting = trio.lowlevel.current_task()

            def abort(_: Any) -> trio.lowlevel.Abort:
                self._waiting = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        return self._queue.popleft()

    def listen(self, listener: Listener | None) -> None:
        """Hand every message to ``listener`` from now on, those queued first, in the caller's
        task; None goes back to queueing them."""
        if listener is not None:
            while self._queue:
                listener(self._queue.popleft())
        self._listener = listener

    def close(self) -> None:
        """The app has ended: drop what is queued and whatever comes."""
        self._closed = True
        self._listener = None
        self._queue.clear()


def request_listener(scope: Mapping[str, Any]) -> Callable[[Listener | None], None] | None:
    """How the request of ``scope`` can have its messages handed to a listener (its inbox's
    :meth:`RequestInbox.listen`, or a wrapper's around it); None when the server does not
    offer it."""
    extension = (scope.get("extensions") or {}).get(LISTEN)
    listen = extension.get("listen") if isinstance(extension, dict) else None
    return listen if callable(listen) else None


class RequestTasks(TaskGroup):
    """Hypercorn's task group for one connection, each request's app fed by a
    :class:`RequestInbox`."""

    async def spawn_app(
        self,
        app: AppWrapper,
        config: Config,
        scope: Scope,
        send: Callable[[ASGISendEvent | None], Awaitable[None]],
    ) -> Callable[[ASGIReceiveEvent], Awaitable[None]]:
        inbox = RequestInbox()
        if scope["type"] == "http":
            scope["extensions"][LISTEN] = {"listen": inbox.listen}
        assert self._nursery is not None
        self._nursery.start_soon(_run_app, inbox, app, config, scope, send)
        return inbox.put


async def _run_app(
    inbox: RequestInbox,
    app: AppWrapper,
    config: Config,
    scope: Scope,
    send: Callable[[ASGISendEvent | None], Awaitable[None]],
) -> None:
    try:
        await _handle(
            app, config, scope, inbox.receive, send, trio.to_thread.run_sync, trio.from_thread.run
        )
    finally:
        inbox.close()

"""One HTTP connection: Hypercorn's TCP server with one idle watchdog, a header deadline and a
lingering close.

Hypercorn keeps an idle timer per connection, from the moment the connection is idle (just
opened, or its last response sent) until a request's headers are complete; at
``keep_alive_timeout`` or at shutdown it closes the connection. Hypercorn starts a new timer
task after every response and cancels it at every request; this class keeps one watchdog task
for the life of the connection instead and moves its deadline (starting and cancelling a task
per request was the largest single cost of a small request). It also adds:

- **Header deadline.** Once the first byte of a request arrives, its headers must be complete
  within ``header_timeout_s``, however slowly the bytes come (Hypercorn's own read timeout
  would restart at every byte, and would also cut long polls).
- **Lingering close.** When the server closes a connection whose client may still be sending
  (a refused body), it first ends its own side, then goes on reading and discarding until
  the client closes or ``LINGER_S`` passes. Closing at once with unread bytes would reset the
  connection, and the client could lose the answer that says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, Updated
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, LifespanState

LINGER_S = 2.0


class WatchedStream:
    """A socket stream that reports what it receives: data, or the end of the client's side."""

    def __init__(
        self, stream: trio.SocketStream, on_data: Callable[[], None], peer_done: trio.Event
    ) -> None:
        self._stream = stream
        self._on_data = on_data
        self._peer_done = peer_done
        self.socket = stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self._stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._peer_done.set()
            raise
        if data:
            self._on_data()
        else:
            self._peer_done.set()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


class Connection(TCPServer):
    """Serves one accepted connection (``await Connection(...)``), then closes it."""

    def __init__(
        self,
        app: AppWrapper,
        config: Config,
        context: WorkerContext,
        state: LifespanState,
        stream: trio.SocketStream,
        *,
        header_timeout_s: float,
    ) -> None:
        self._header_timeout_s = header_timeout_s
        # The watchdog's deadline: keep-alive while idle, the header deadline once a request's
        # first byte arrived, none while a request is being served.
        self._watch = trio.CancelScope()
        self._idle = True
        self._request_started = False
        self._closed = False
        self._peer_done = trio.Event()
        watched = WatchedStream(stream, self._data_arrived, self._peer_done)
        super().__init__(app, config, context, state, watched)  # type: ignore[arg-type]

    def _data_arrived(self) -> None:
        if self._idle and not self._request_started:
            # The first byte of the next request: its headers now have a deadline of their own.
            self._request_started = True
            self._watch.deadline = trio.current_time() + self._header_timeout_s

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            if event.idle:
                self._idle = True
                self._request_started = False
                if self.context.terminated.is_set():  # shutting down: an idle one goes now
                    self._watch.deadline = -math.inf
                else:
                    self._watch.deadline = trio.current_time() + self.config.keep_alive_timeout
            else:
                self._idle = False
                self._watch.deadline = math.inf
            return
        if isinstance(event, Closed):
            self._closed = True
            self._watch.cancel()  # the watchdog has nothing left to do
        await super().protocol_send(event)

    async def _idle_timeout(self) -> None:
        """The connection's watchdog (started once, by Hypercorn, as its idle timer): closes
        the connection when its deadline passes, or at shutdown while it is idle."""
        self._request_started = False
        self._watch.deadline = trio.current_time() + self.config.keep_alive_timeout
        with self._watch:
            await self.context.terminated.wait()
            if not self._idle:
                # Busy at shutdown: Hypercorn closes it after the response (or the deadline,
                # now set to go at once when it turns idle, does).
                await trio.sleep_forever()
        if self._closed:
            return
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()

    async def _close(self) -> None:
        try:
            try:
                await self.stream.send_eof()
            except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError):
                pass
            with trio.move_on_after(LINGER_S):
                # The connection's reader goes on discarding what arrives meanwhile.
                await self._peer_done.wait()
        finally:
            await self.stream.aclose()

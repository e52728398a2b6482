"""One HTTP connection: Hypercorn's TCP server with a header deadline and a lingering close.

Hypercorn runs one idle timer per connection, from the moment the connection is idle (just
opened, or its last response sent) until a request's headers are complete; at
``keep_alive_timeout`` or at shutdown it closes the connection. This class keeps that timer
and adds two things:

- **Header deadline.** Once the first byte of a request arrives, its headers must be complete
  within ``header_timeout_s``, however slowly the bytes come (Hypercorn's own read timeout
  would restart at every byte, and would also cut long polls).
- **Lingering close.** When the server closes a connection whose client may still be sending
  (a refused body), it first ends its own side, then goes on reading and discarding until
  the client closes or ``LINGER_S`` passes. Closing at once with unread bytes would reset the
  connection, and the client could lose the answer that says why.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
from hypercorn.config import Config
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
        self._idle_scope: trio.CancelScope | None = None
        self._request_started = False
        self._peer_done = trio.Event()
        watched = WatchedStream(stream, self._data_arrived, self._peer_done)
        super().__init__(app, config, context, state, watched)  # type: ignore[arg-type]

    def _data_arrived(self) -> None:
        scope = self._idle_scope
        if scope is not None and not self._request_started:
            # The first byte of the next request: its headers now have a deadline of their own.
            self._request_started = True
            scope.deadline = trio.current_time() + self._header_timeout_s

    async def _idle_timeout(self) -> None:
        """Hypercorn's idle timer (started when the connection is idle, stopped when a
        request's headers are complete), with the header deadline once bytes arrive."""
        self._request_started = False
        scope = trio.move_on_after(self.config.keep_alive_timeout)
        try:
            with scope:
                self._idle_scope = scope
                await self.context.terminated.wait()
        finally:
            if self._idle_scope is scope:
                self._idle_scope = None
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

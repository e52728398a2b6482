"""One HTTP connection: Hypercorn's TCP server with one idle watchdog, a header deadline, the
end of the client's side acted on, a place in the process's connection capacity, and a
lingering close.

Hypercorn keeps an idle timer per connection, from the moment the connection is idle (just
opened, or its last response sent) until a request's headers are complete; at
``keep_alive_timeout`` or at shutdown it closes the connection. Hypercorn starts a new timer
task after every response and cancels it at every request; this class keeps one watchdog task
for the life of the connection instead (starting and cancelling a task per request was the
largest single cost of a small request), and moves its deadline only to make it earlier: a
later one is taken up when the earlier passes, so a connection in use moves none per
request. It also adds:

- **Header deadline.** Once the first byte of a request arrives, its headers must be complete
  within ``header_timeout_s``, however slowly the bytes come (Hypercorn's own read timeout
  would restart at every byte, and would also cut long polls).
- **Body deadline.** While a request's body is incomplete, each read of it must come within
  ``body_timeout_s`` of the one before (a request whose head says more is to come and which
  then stalls would hold the connection, and its place in the capacity, for ever); past it
  the request is told the client left and the connection is closed. Once the body is whole,
  nothing limits how long the request takes (a long poll).
- **The client's end is acted on.** Nothing more can arrive once the client's side has ended,
  and the descriptor is freed as soon as nothing is left to write, instead of sitting in
  ``CLOSE-WAIT`` until the keep-alive timeout:

  - an *end of stream* (the client closed, or half-closed after its request: it may still be
    reading) while idle closes the connection at once; during a request whose head has
    arrived, the request goes on and is answered, then the connection closes. (Hypercorn
    would tell the app the client left, Quart-Trio would cancel the request, and nothing
    would ever close the connection.) A request cut short (an incomplete head or body) is
    answered 400 and closed. Long waits can stop early: the request's scope carries the
    connection's :class:`ClientEnd` (extension ``queen.client_end``);
  - a *broken* connection (reset) cancels the request in progress (the app is told the client
    left: no answer can reach it) and closes the connection at once.
- **Capacity.** Every connection registers with the process's :class:`ConnectionCapacity`,
  says when it turns idle or busy, and closes when the capacity sheds it to make room. A new
  connection the capacity cannot admit (every connection busy) is answered 503 at once,
  without its request being read, and closed.
- **Lingering close.** When the server closes a connection whose client may still be sending
  (a refused body), it first ends its own side, then goes on reading and discarding until the
  client ends its side, nothing arrives for ``LINGER_S``, or ``LINGER_MAX_S`` have passed.
  Closing with unread bytes would reset the connection, and a client still sending its body
  would lose the answer that says why; so the linger lasts as long as the body keeps coming,
  however long after the answer that is.
"""

from __future__ import annotations

import fcntl
import math
import os
import sys
import termios
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import h11
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol import ProtocolWrapper
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import (
    AppWrapper,
    ASGIReceiveCallable,
    ASGISendCallable,
    ConnectionState,
    LifespanState,
    Scope,
)
from hypercorn.utils import parse_socket_addr

from queen.serving.capacity import ConnectionCapacity
from queen.serving.inbox import RequestTasks

# A lingering close ends when nothing has arrived for LINGER_S, and after LINGER_MAX_S at most.
LINGER_S = 2.0
LINGER_MAX_S = 30.0
# How many bytes a connection writes straight to its socket, without a trip through the
# scheduler, before one of its writes goes through Trio's send_all (which checkpoints).
UNYIELDED_WRITE_BYTES = 256 * 1024
# The ASGI scope extension under which a request finds its connection's ClientEnd (client_end).
CLIENT_END = "queen.client_end"


class ClientEnd:
    """Whether the client has ended its side of the connection (closed it, or half-closed it
    and may still read). A request that waits for something else (a long poll) stops waiting
    then: :meth:`cancels` is a cancel scope that is cancelled when the end comes, or at once if
    it has come already."""

    __slots__ = ("_scopes", "ended")

    def __init__(self) -> None:
        self.ended = False
        self._scopes: set[trio.CancelScope] = set()

    @contextmanager
    def cancels(self) -> Iterator[trio.CancelScope]:
        with trio.CancelScope() as scope:
            if self.ended:
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)

    def end(self) -> None:
        self.ended = True
        for scope in self._scopes:
            scope.cancel()


class _WithClientEnd:
    """The app, with the connection's :class:`ClientEnd` in each request's scope."""

    __slots__ = ("app", "end")

    def __init__(self, app: AppWrapper, end: ClientEnd) -> None:
        self.app = app
        self.end = end

    async def __call__(
        self,
        scope: Scope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        sync_spawn: object,
        call_soon: object,
    ) -> None:
        if scope["type"] == "http":
            scope["extensions"][CLIENT_END] = {"end": self.end}
        await self.app(scope, receive, send, sync_spawn, call_soon)  # type: ignore[arg-type]


def client_end(scope: Mapping[str, Any]) -> ClientEnd | None:
    """The :class:`ClientEnd` of the connection serving the request of ``scope``; None when the
    server does not offer it."""
    extension = (scope.get("extensions") or {}).get(CLIENT_END)
    return extension.get("end") if isinstance(extension, dict) else None


def _unread_bytes(sock: trio.socket.SocketType) -> int:
    """Bytes that have arrived on ``sock`` and are not read yet."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(raw, sys.byteorder)


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
        body_timeout_s: float,
        capacity: ConnectionCapacity,
    ) -> None:
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = body_timeout_s
        self._capacity = capacity
        # When the watchdog closes the connection (_due): keep-alive while idle, the header
        # deadline once a request's first byte arrived, the body deadline while its body is
        # incomplete, never while a request with its whole body is being served, now once the
        # connection has to go (shed, or its client gone). Its cancel scope's
        # deadline (_armed) is never later than that, and is moved only to make it earlier:
        # when it passes before _due, the watchdog arms a new scope for _due. A request
        # then moves no deadline of Trio's, as long as the connection goes on being used
        # more often than its keep-alive timeout.
        self._watch = trio.CancelScope()
        self._due = self._armed = math.inf
        self._idle = True
        self._request_started = False
        self._closed = False
        self._must_close = False
        # The client's side: ended or broken (_peer_done), as the requests see it (_client_end);
        # the reader task and whether it runs; whether what arrives is now only discarded, and
        # how many bytes were.
        self._peer_done = trio.Event()
        self._client_end = ClientEnd()
        self._reader: trio.lowlevel.Task | None = None
        self._reading = False
        self._received = 0
        self._discarding = False
        self._shut = False
        # One write per answer: a request's response head is held (`_held`) and written with
        # what follows it, and empty writes are skipped.
        self._awaiting_head = False
        self._held: bytes | None = None
        # Bytes written directly since a write last went through Trio's send_all.
        self._unyielded = 0
        self._raw = stream
        with_end = _WithClientEnd(app, self._client_end)
        super().__init__(with_end, config, context, state, stream)  # type: ignore[arg-type]

    async def run(self) -> None:
        if not self._capacity.admit(self, self._shed):
            await self._refuse_busy()
            return
        try:
            await self._serve()
        finally:
            self._capacity.release(self)

    async def _serve(self) -> None:
        """Hypercorn's serving of a plain TCP connection, with each request's app fed by a
        :class:`~queen.serving.inbox.RequestInbox` (:class:`RequestTasks`)."""
        try:
            sock = self._raw.socket
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
            async with RequestTasks() as task_group:
                self._task_group = task_group
                self.protocol = ProtocolWrapper(
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                    "http/1.1",
                )
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                await self._read_data()
        except OSError:
            pass
        finally:
            await self._close()

    def _shed(self) -> None:
        """The capacity needs room: close now (only ever called while idle)."""
        self._close_now()

    def _close_now(self) -> None:
        self._must_close = True
        self._set_due(-math.inf)

    def _set_due(self, due: float) -> None:
        """The watchdog closes the connection at ``due``, unless told otherwise before."""
        self._due = due
        if due < self._armed:
            self._armed = self._watch.deadline = due

    def _idle_deadline(self) -> float:
        if self._must_close or self.context.terminated.is_set():
            return -math.inf  # shed, client gone or shutting down: an idle one goes now
        return trio.current_time() + self.config.keep_alive_timeout

    def _data_arrived(self) -> float | None:
        """The header deadline of the request whose first byte just arrived (None if a
        request had begun already); the connection is no longer one to shed."""
        if self._idle and not self._request_started:
            self._request_started = True
            self._capacity.turned_busy(self)
            return trio.current_time() + self._header_timeout_s
        return None

    async def _read_data(self) -> None:
        """Hypercorn's reader, noting the first byte of each request and the end of the
        client's side. It has no per-read timeout (Hypercorn's read timeout is off: the
        watchdog's deadlines replace it), so no cancel scope is opened per read."""
        self._reader = trio.lowlevel.current_task()
        self._reading = True
        try:
            ended = await self._read_until_end()
        finally:
            self._reading = False
            self._peer_done.set()
        # Nothing more can arrive on this connection.
        self._must_close = True
        self._client_end.end()
        if self._closed:
            return
        if ended:
            # h11 learns that the client's side ended: a request cut short is answered 400
            # and the connection closed; a complete one goes on (h11 has the client's side
            # closed, so Hypercorn closes the connection after the answer).
            await self.protocol.handle(RawData(b""))
            if self._closed or not self._idle:
                return
        # Idle, or broken: the request in progress (if any) is told the client left, and the
        # connection closes now.
        await self.protocol.handle(Closed())
        self._close_now()

    async def _read_until_end(self) -> bool:
        """Read and hand over what arrives until the client's side ends (True) or breaks
        (False). Once the server has ended its own side, what arrives is only discarded."""
        receive_some = self._raw.receive_some
        handle = self.protocol.handle
        while True:
            try:
                data = await receive_some(MAX_RECV)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
            if not data:
                return True
            if self._discarding:
                self._received += len(data)
                continue
            due = self._data_arrived()
            await handle(RawData(data))
            if not self._idle:
                # A request is in progress: its body, if incomplete, must go on arriving;
                # once whole, the request has no deadline.
                if self._must_close:
                    continue  # (a connection that has to go keeps its deadline of now)
                if self._body_pending():
                    self._set_due(trio.current_time() + self._body_timeout_s)
                elif self._due < math.inf:
                    self._due = math.inf
            elif due is not None and self._request_started and not self._must_close:
                # The first byte of a request came and its head is not complete yet: the
                # headers now have a deadline of their own. (A head complete in that read
                # has turned the connection busy, which lifts the header deadline.)
                self._set_due(due)

    def _body_pending(self) -> bool:
        """Whether the request in progress still expects body bytes from the client."""
        parser = getattr(self.protocol.protocol, "connection", None)
        return getattr(parser, "their_state", None) is h11.SEND_BODY

    async def protocol_send(self, event: Event) -> None:
        kind = type(event)  # (exact types: Hypercorn's events are final, and an ABC check costs)
        if kind is RawData:
            await self._write(event.data)  # type: ignore[attr-defined]
            return
        if kind is Updated:
            if event.idle:  # type: ignore[attr-defined]
                self._idle = True
                self._request_started = False
                self._awaiting_head = False
                self._capacity.turned_idle(self)
                self._set_due(self._idle_deadline())
            else:
                self._idle = False
                self._awaiting_head = True
                self._capacity.turned_busy(self)
                self._due = math.inf
            return
        if kind is Closed:
            self._closed = True
            self._watch.cancel()  # the watchdog has nothing left to do
            if self._held is not None:
                held, self._held = self._held, None
                await super().protocol_send(RawData(held))
        await super().protocol_send(event)

    async def _write(self, data: bytes) -> None:
        """Write what Hypercorn's HTTP/1.1 layer produced, one write per answer where it can.

        Hypercorn writes an answer in three pieces, each a lock and a send: the head (at the
        app's ``http.response.start``), the body, and the end of the message (empty when the
        body's length was declared). The first final head after a request began is held and
        goes out with the next piece; informational heads (``100 Continue``, and a
        ``101`` that ends HTTP/1.1 on the connection) go at once; empty pieces send nothing.
        Something always follows a head (a body, the end of the message, or the connection's
        close, which writes what is held first), so nothing waits for later traffic; a
        streamed answer's head goes out with its first chunk.
        """
        if self._awaiting_head:
            if data.startswith(b"HTTP/1.1 1"):
                if data.startswith(b"HTTP/1.1 101"):
                    self._awaiting_head = False
            else:
                self._awaiting_head = False
                self._held = data
                return
        held = self._held
        if held is not None:
            self._held = None
            data = held + data
        elif not data:
            return
        await self._send_raw(data)

    async def _send_raw(self, data: bytes) -> None:
        """Hypercorn's write of ``data`` (under the connection's send lock, shielded, a broken
        connection told to the protocol), the lock taken without a trip through the scheduler
        when no one holds it.

        What the socket takes at once is written directly, with no trip through the scheduler
        either (a small answer: all of it); the rest goes through Trio's ``send_all``, which
        waits for the socket and checkpoints. So that a long streamed answer still lets other
        tasks run, the direct writes stop after ``UNYIELDED_WRITE_BYTES`` until a write has
        gone through Trio's."""
        lock = self.send_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            sent = 0
            if self._unyielded < UNYIELDED_WRITE_BYTES:
                try:
                    sent = self._write_now(data)
                except BlockingIOError:
                    pass
                except OSError:
                    await self.protocol.handle(Closed())
                    return
                self._unyielded += sent
            if sent < len(data):
                self._unyielded = 0
                with trio.CancelScope(shield=True):
                    await self.stream.send_all(memoryview(data)[sent:] if sent else data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self.protocol.handle(Closed())
        finally:
            lock.release()

    def _write_now(self, data: bytes) -> int:
        """Write what the socket takes of ``data`` now, without waiting; how many bytes it
        took (``BlockingIOError``: none; another ``OSError``: the connection is broken or
        closed, its descriptor then reading -1)."""
        return os.write(self._raw.socket.fileno(), data)

    async def _idle_timeout(self) -> None:
        """The connection's watchdog (started once, by Hypercorn, as its idle timer): closes
        the connection when its deadline passes, or at shutdown while it is idle."""
        self._request_started = False
        self._due = self._armed = self._watch.deadline = self._idle_deadline()
        while True:
            with self._watch:
                await self.context.terminated.wait()
                if not self._idle:
                    # Busy at shutdown: Hypercorn closes it after the response (or the
                    # deadline, now set to go at once when it turns idle, does).
                    await trio.sleep_forever()
            if self._closed:
                return
            if not self._watch.cancelled_caught or trio.current_time() >= self._due:
                break  # shutting down while idle, or due
            # Armed early (the connection was used since): a new scope for when it is due.
            self._armed = self._due
            self._watch = trio.CancelScope(deadline=self._armed)
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()

    async def _close(self) -> None:
        """End the server's side, linger while the client may still be sending, then close
        (once: Hypercorn calls this again when the connection's tasks are done)."""
        if self._shut:
            return
        self._shut = True
        try:
            try:
                await self.stream.send_eof()
            except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError):
                pass
            if not self._peer_done.is_set():
                self._discarding = True
                await self._linger()
        finally:
            await self.stream.aclose()

    async def _linger(self) -> None:
        """Discard what the client still sends until it ends its side, nothing arrives for
        ``LINGER_S``, or ``LINGER_MAX_S`` pass. Bytes waiting unread after such a pause earn one
        more: the process may have been too busy to read them. The reader discards; if the
        reader itself is closing (a protocol error found in what it read), or is gone, the
        reading is done here."""
        here = not self._reading or trio.lowlevel.current_task() is self._reader
        waited_on_unread = False
        with trio.move_on_after(LINGER_MAX_S):
            while not self._peer_done.is_set():
                before = self._received
                with trio.move_on_after(LINGER_S):
                    if here:
                        await self._discard_until_end()
                    else:
                        await self._peer_done.wait()
                if self._received != before:
                    waited_on_unread = False
                elif waited_on_unread or not _unread_bytes(self._raw.socket):
                    return
                else:
                    waited_on_unread = True

    async def _discard_until_end(self) -> None:
        try:
            while data := await self._raw.receive_some(MAX_RECV):
                self._received += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._peer_done.set()

    async def _refuse_busy(self) -> None:
        """Answer 503 without reading the request, then close; if too many refusals are
        already lingering, close at once."""
        stream = self._raw
        try:
            if not self._capacity.start_refusal():
                return
            try:
                with trio.move_on_after(LINGER_S):
                    await stream.send_all(BUSY_ANSWER)
                    await stream.send_eof()
                    while await stream.receive_some(MAX_RECV):
                        pass  # the request, unread: the client closes once it has the answer
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                self._capacity.end_refusal()
        finally:
            await stream.aclose()


_BUSY_BODY = b'{"error":"too many connections; retry later"}'
BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: application/json\r\n"
    b"content-length: " + str(len(_BUSY_BODY)).encode() + b"\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n\r\n" + _BUSY_BODY
)

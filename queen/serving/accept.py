"""The accept loop: hands every new connection to a handler task, and when the process is out of
descriptors makes room instead of only waiting.

An ``accept`` that fails for want of resources (``EMFILE``, ``ENFILE``, ``ENOMEM``,
``ENOBUFS``) leaves the connection in the listen backlog. The loop then sheds the connection
that has been idle the longest (:meth:`ConnectionCapacity.shed_idle`), so the next try finds a
descriptor, and tries again after ``ACCEPT_RETRY_S``. The condition is logged once, then at
most once per ``period_s`` with a count (:class:`RepeatThrottle`). Any other error ends the
loop, and the server with it.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Awaitable, Callable

import trio

from queen.serving.capacity import ConnectionCapacity

log = logging.getLogger("queen.http.accept")

OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
ACCEPT_RETRY_S = 0.05


class RepeatThrottle(logging.Filter):
    """Keep the first record, then at most one per ``period_s`` saying how many were left out
    (their tracebacks too)."""

    def __init__(self, period_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._period_s = period_s
        self._clock = clock
        self._last: float | None = None
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self._period_s:
            self._dropped += 1
            return False
        if self._dropped:
            record.msg = f"{record.msg} ({self._dropped} more since the last report)"
            record.exc_info, record.exc_text = None, None
        self._last, self._dropped = now, 0
        return True


if not any(isinstance(f, RepeatThrottle) for f in log.filters):
    log.addFilter(RepeatThrottle())


async def accept_connections(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Awaitable[object]],
    handler_nursery: trio.Nursery,
    capacity: ConnectionCapacity,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept on ``listener`` until cancelled, each connection served by ``handler`` in
    ``handler_nursery``; the listener is closed on the way out. Ready at once (the socket is
    already listening)."""
    async with listener:
        task_status.started()
        await _accept_forever(listener, handler, handler_nursery, capacity)


async def _accept_forever(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Awaitable[object]],
    handler_nursery: trio.Nursery,
    capacity: ConnectionCapacity,
) -> None:
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in OUT_OF_RESOURCES:
                raise
            shed = capacity.shed_idle()
            log.error(
                "accept returned %s with %d connections open; %s",
                errno.errorcode.get(exc.errno or 0, exc.errno),
                capacity.open,
                "closed the longest idle one" if shed else "none is idle to close",
            )
            await trio.sleep(ACCEPT_RETRY_S)
            continue
        handler_nursery.start_soon(_serve_one, handler, stream)


async def _serve_one(
    handler: Callable[[trio.SocketStream], Awaitable[object]], stream: trio.SocketStream
) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)  # whatever the handler did, the descriptor goes

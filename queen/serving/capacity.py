"""How many connections one process holds, so that it always has descriptors to answer with.

Every open connection costs a file descriptor, and so does everything else the broker opens
(database connections, spool files, the listening socket). Once the process is out of
descriptors it cannot accept, cannot open a database connection and cannot write the spool:
it is deaf. :class:`ConnectionCapacity` keeps the connections below a cap that leaves a
reserve for the rest, and, when a new connection arrives at the cap, makes room by **shedding
the connection that has been idle the longest** (a keep-alive connection between requests, or
one that never sent a byte). Only when every connection is busy with a request is the new one
refused (the server answers it 503 at once and closes it).

The registry is plain bookkeeping with no I/O and no checkpoints: a connection reports when it
turns idle and busy, and is told to close through the callback it registered with.

:func:`raise_descriptor_limit` raises the process's soft ``RLIMIT_NOFILE`` to its hard limit
at start, and :func:`default_max_connections` derives the cap from the result.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable, Hashable

from queen.metrics import Metrics

log = logging.getLogger("queen.http")

# Descriptors kept back from connections: database connections, spool files, the listening
# socket, the runtime's own (about 20 at rest), with room to spare.
RESERVE_MIN = 100
RESERVE_FRACTION = 0.1
# Above this many descriptors a cap adds nothing but a bookkeeping limit nobody reaches.
NO_CAP_ABOVE = 1 << 20
# Refused connections answered and lingering at once; past this, a refused one closes at once.
MAX_REFUSALS = 32


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit (where allowed); return
    ``(soft, hard)`` as they are afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else NO_CAP_ABOVE
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # e.g. above fs.nr_open
        log.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)
        return soft, hard
    return target, hard


def default_max_connections(soft_limit: int) -> int:
    """The connection cap for a soft limit of ``soft_limit`` descriptors."""
    if soft_limit == resource.RLIM_INFINITY or soft_limit > NO_CAP_ABOVE:
        soft_limit = NO_CAP_ABOVE
    reserve = max(RESERVE_MIN, int(soft_limit * RESERVE_FRACTION))
    return max(1, soft_limit - reserve)


class ConnectionCapacity:
    """The open connections of one process, in the order they last turned idle."""

    def __init__(self, max_connections: int, metrics: Metrics | None = None) -> None:
        """``metrics``: where the counts go (``queen_http_connections_*`` in ``/metrics``)."""
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_connections = max_connections
        self.counts = metrics if metrics is not None else Metrics()
        self._close: dict[Hashable, Callable[[], None]] = {}
        # Idle connections, longest idle first (a dict keeps insertion order).
        self._idle: dict[Hashable, None] = {}
        self._refusing = 0

    @property
    def open(self) -> int:
        return len(self._close)

    @property
    def idle(self) -> int:
        return len(self._idle)

    def admit(self, conn: Hashable, close: Callable[[], None]) -> bool:
        """Register a new connection (idle, since it has sent no request yet).

        At the cap, the longest idle connection is told to close (``close`` of its own
        registration) to make room. False if every connection is busy: the new one is not
        registered, and the caller refuses it.
        """
        if len(self._close) >= self.max_connections and not self._shed_one():
            self.counts.http_connections_refused += 1
            return False
        self._close[conn] = close
        self._idle[conn] = None
        self.counts.http_connections_accepted += 1
        self.counts.http_connections_open = len(self._close)
        return True

    def turned_idle(self, conn: Hashable) -> None:
        """``conn`` finished a request and waits for the next: it is now the newest idle one."""
        if conn in self._close:
            self._idle.pop(conn, None)
            self._idle[conn] = None

    def turned_busy(self, conn: Hashable) -> None:
        """``conn`` started a request: it is not shed until it turns idle again."""
        self._idle.pop(conn, None)

    def release(self, conn: Hashable) -> None:
        """``conn`` is closed (whoever closed it)."""
        self._close.pop(conn, None)
        self._idle.pop(conn, None)
        self.counts.http_connections_open = len(self._close)

    def start_refusal(self) -> bool:
        """A refused connection may be answered (and linger a moment) if few others are; False
        means close it at once."""
        if self._refusing >= MAX_REFUSALS:
            return False
        self._refusing += 1
        return True

    def end_refusal(self) -> None:
        self._refusing -= 1

    def shed_idle(self) -> bool:
        """Tell the longest idle connection to close (out of descriptors for another reason).
        False if none is idle."""
        return self._shed_one()

    def _shed_one(self) -> bool:
        for conn in self._idle:
            del self._idle[conn]
            close = self._close.pop(conn)
            self.counts.http_connections_open = len(self._close)
            self.counts.http_connections_shed += 1
            close()
            return True
        return False

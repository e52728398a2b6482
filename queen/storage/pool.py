"""A small pool of synchronous psycopg connections, driven from Trio through worker threads.

psycopg's async API is built on asyncio and does not run under Trio, so every database call is
a plain function ``fn(connection)`` that runs in a worker thread while the Trio task waits.
A call holds one connection for its whole duration (one call = one round trip in the push
path), and is not abandoned on cancellation: a write that has started is allowed to finish, and
the server-side ``statement_timeout`` bounds how long that can take.

Failures are translated at this boundary: a connection that cannot be opened or that breaks
becomes :class:`StoreUnavailable` (and is discarded); any other database error becomes
:class:`StoreError`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import trio

from queen.storage.base import StoreError, StoreUnavailable

log = logging.getLogger("queen.storage")

T = TypeVar("T")

# SQLSTATE classes that mean "the server is not there for us right now".
_UNAVAILABLE_SQLSTATE_PREFIXES = ("08", "57P", "53")


def connection_kwargs(
    connect_timeout_s: float, statement_timeout_ms: int, tcp_user_timeout_ms: int = 5_000
) -> dict[str, Any]:
    """Connection options that bound every wait on a dead or stuck server: connecting, a
    statement, unacknowledged data on a dead network path, an idle connection."""
    timeout_s = max(2, math.ceil(connect_timeout_s))  # libpq ignores values below 2
    return {
        "autocommit": True,
        "connect_timeout": timeout_s,
        "application_name": "queen",
        "options": f"-c statement_timeout={int(statement_timeout_ms)}",
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": int(tcp_user_timeout_ms),
    }


def is_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        sqlstate = getattr(exc, "sqlstate", None)
        return sqlstate is None or sqlstate.startswith(_UNAVAILABLE_SQLSTATE_PREFIXES)
    return False


class ConnectionPool:
    """At most ``size`` connections, opened lazily, reused LIFO, replaced when broken."""

    def __init__(
        self,
        conninfo: str,
        *,
        size: int,
        connect_timeout_s: float,
        statement_timeout_ms: int,
        tcp_user_timeout_ms: int = 5_000,
    ) -> None:
        self._conninfo = conninfo
        self._kwargs = connection_kwargs(
            connect_timeout_s, statement_timeout_ms, tcp_user_timeout_ms
        )
        self._slots = trio.Semaphore(size)
        self._limiter = trio.CapacityLimiter(size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False

    def connect_sync(self) -> psycopg.Connection[Any]:
        """Open one connection with the pool's options (runs in a worker thread)."""
        try:
            return psycopg.connect(self._conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {_short(exc)}") from exc

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn(connection)`` in a worker thread and return its result."""
        if self._closed:
            raise StoreUnavailable("connection pool is closed")
        async with self._slots:
            holder: list[psycopg.Connection[Any] | None] = [
                self._idle.pop() if self._idle else None
            ]
            try:
                return await trio.to_thread.run_sync(self._call, holder, fn, limiter=self._limiter)
            finally:
                self._release(holder[0])

    def _release(self, conn: psycopg.Connection[Any] | None) -> None:
        if conn is None or conn.closed:
            return
        if self._closed:
            conn.close()
        else:
            self._idle.append(conn)

    def _call(
        self,
        holder: list[psycopg.Connection[Any] | None],
        fn: Callable[[psycopg.Connection[Any]], T],
    ) -> T:
        conn = holder[0]
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            holder[0] = None
            conn = holder[0] = self.connect_sync()
        try:
            return fn(conn)
        except psycopg.Error as exc:
            if is_unavailable(exc) or conn.broken:
                conn.close()
                raise StoreUnavailable(f"PostgreSQL unavailable: {_short(exc)}") from exc
            raise StoreError(f"database error: {_short(exc)}") from exc
        except BaseException:
            conn.close()
            raise

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await trio.to_thread.run_sync(conn.close)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

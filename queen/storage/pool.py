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
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
import trio
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from queen.storage.base import StoreError, StoreUnavailable

log = logging.getLogger("queen.storage")

T = TypeVar("T")

# SQLSTATE classes that mean "the server is not there for us right now".
_UNAVAILABLE_SQLSTATE_PREFIXES = ("08", "57P", "53")


# Settings of every session the broker opens. JIT compilation pays off for long analytical
# queries; the broker's calls are short, and compiling one costs far more than running it
# (PostgreSQL 15-17 keep jit on by default: about 0.4 s per push call on PostgreSQL 15).
SESSION_SETTINGS = "-c jit=off"


def session_options(conninfo: str, statement_timeout_ms: int) -> str:
    """The ``options`` connection parameter: whatever ``conninfo`` already sets, then the
    broker's own session settings (a later ``-c`` wins)."""
    try:
        own = conninfo_to_dict(conninfo).get("options")
    except psycopg.ProgrammingError:
        own = None  # libpq reports a malformed conninfo when connecting
    ours = f"{SESSION_SETTINGS} -c statement_timeout={int(statement_timeout_ms)}"
    return f"{own} {ours}" if own else ours


def connection_kwargs(
    connect_timeout_s: float,
    statement_timeout_ms: int,
    tcp_user_timeout_ms: int = 5_000,
    conninfo: str = "",
) -> dict[str, Any]:
    """Connection options that bound every wait on a dead or stuck server: connecting, a
    statement, unacknowledged data on a dead network path, an idle connection; and the
    broker's session settings."""
    timeout_s = max(2, math.ceil(connect_timeout_s))  # libpq ignores values below 2
    return {
        "autocommit": True,
        "connect_timeout": timeout_s,
        "application_name": "queen",
        "options": session_options(conninfo, statement_timeout_ms),
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
            connect_timeout_s, statement_timeout_ms, tcp_user_timeout_ms, conninfo
        )
        self._slots = trio.Semaphore(size)
        self._limiter = trio.CapacityLimiter(size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False
        # statements prepared by query(), per connection
        self._prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[str]] = (
            weakref.WeakKeyDictionary()
        )

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

    async def query(
        self, name: str, sql: bytes, params: Sequence[bytes | None]
    ) -> list[tuple[bytes | None, ...]]:
        """Run one statement (text parameters, text results) without a worker thread.

        The statement goes through the pooled connection's libpq handle in non-blocking mode,
        and the Trio task waits on the socket: no thread hop, and no wait for the GIL behind
        the busy event loop, which matters on the push path. The statement is prepared once
        per connection under ``name``. A call cancelled mid-way closes its connection.
        """
        if self._closed:
            raise StoreUnavailable("connection pool is closed")
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed or conn.broken:
                if conn is not None:
                    conn.close()
                conn = await trio.to_thread.run_sync(self.connect_sync, limiter=self._limiter)
            done = False
            try:
                rows = await self._query(conn, name, sql, params)
                done = True
                return rows
            finally:
                if done or conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                    self._release(conn)
                else:
                    conn.close()

    async def _query(
        self,
        conn: psycopg.Connection[Any],
        name: str,
        sql: bytes,
        params: Sequence[bytes | None],
    ) -> list[tuple[bytes | None, ...]]:
        pg = conn.pgconn
        statement = name.encode()
        try:
            if name not in self._prepared.setdefault(conn, set()):
                pg.send_prepare(statement, sql)
                await _results(pg)
                self._prepared[conn].add(name)
            pg.send_query_prepared(statement, params)
            results = await _results(pg)
        except psycopg.Error as exc:
            conn.close()
            raise StoreUnavailable(f"PostgreSQL unavailable: {_short(exc)}") from exc
        rows: list[tuple[bytes | None, ...]] = []
        for res in results:
            rows.extend(
                tuple(res.get_value(r, c) for c in range(res.nfields)) for r in range(res.ntuples)
            )
        return rows

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await trio.to_thread.run_sync(conn.close)


async def _results(pg: pq.abc.PGconn) -> list[pq.abc.PGresult]:
    """Send what libpq has buffered, then collect every result of the statement sent."""
    fd = pg.socket
    while pg.flush():
        await trio.lowlevel.wait_writable(fd)
    results: list[pq.abc.PGresult] = []
    while True:
        pg.consume_input()
        while not pg.is_busy():
            res = pg.get_result()
            if res is None:
                return _checked(pg, results)
            results.append(res)
        await trio.lowlevel.wait_readable(fd)


def _checked(pg: pq.abc.PGconn, results: list[pq.abc.PGresult]) -> list[pq.abc.PGresult]:
    for res in results:
        if res.status == pq.ExecStatus.FATAL_ERROR:
            raw = res.error_field(pq.DiagnosticField.SQLSTATE)
            sqlstate = raw.decode() if raw else ""
            message = (res.error_message or b"").decode(errors="replace").strip()
            if (
                sqlstate.startswith(_UNAVAILABLE_SQLSTATE_PREFIXES)
                or pg.status == pq.ConnStatus.BAD
            ):
                raise StoreUnavailable(f"PostgreSQL unavailable: {message}")
            raise StoreError(f"database error: {message.splitlines()[0] if message else sqlstate}")
    return results


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

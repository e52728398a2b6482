"""A small pool of synchronous psycopg connections, driven from Trio on two paths.

psycopg's async API is built on asyncio and does not run under Trio. :meth:`ConnectionPool.run`
runs a plain function ``fn(connection)`` in a worker thread while the Trio task waits (and
:meth:`~ConnectionPool.fetch_all`, :meth:`~ConnectionPool.fetch_one` and
:meth:`~ConnectionPool.execute` run one statement that way, rows typed by a ``row`` class);
:meth:`ConnectionPool.query` drives the connection's libpq handle from the Trio thread,
waiting on its socket (the push statement, the batches of partition ids, pops and acks: no
thread hop). A call holds one connection for its whole duration; one call is one
round trip. Why two paths: ``docs/architecture.md``, "Database access from Trio".

**Deadlines.** Every call has a client-side deadline, ``call_timeout_s`` from its start
(waiting for a connection included), because a server that hangs without closing its
connections answers nothing and fires no server-side timeout. When the deadline passes the
call raises :class:`StoreUnavailable` and its connection is dropped, never reused: a worker
thread still blocked on it is woken by shutting the socket down, and closes it itself.

**Cancellation.** A worker-thread call that has started is not abandoned when its caller is
cancelled (a client going away): the write is allowed to finish, within the deadline. The
libpq path of :meth:`ConnectionPool.query` runs in the Trio thread; cancelling it closes its
connection (callers that must finish, pops and acks, shield it).

Failures are translated at this boundary: a connection that cannot be opened, that breaks or
that passes its deadline becomes :class:`StoreUnavailable` (and is discarded); any other
database error becomes :class:`StoreError`.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

import psycopg
import trio
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import RowFactory, kwargs_row, tuple_row

from queen.errors import StoreDeadlock, StoreError, StoreUnavailable
from queen.primitives import acquire_free

log = logging.getLogger("queen.storage")

T = TypeVar("T")
R = TypeVar("R")
Params = Sequence[Any] | Mapping[str, Any]

# How often a call that PostgreSQL chose as a deadlock victim is run (see retry_deadlock).
DEADLOCK_ATTEMPTS = 3

# SQLSTATE classes that mean "the server is not there for us right now".
_UNAVAILABLE_SQLSTATE_PREFIXES = ("08", "57P", "53")
_DEADLOCK_SQLSTATE = "40P01"


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


class _Call:
    """One worker-thread call, shared by the Trio task and the thread: the connection in use,
    a duplicate of its socket (so the Trio side can wake the thread without touching libpq),
    and who is done with it."""

    __slots__ = ("abandoned", "conn", "finished", "lock", "sock")

    def __init__(self, conn: psycopg.Connection[Any] | None) -> None:
        self.conn = conn
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()
        self.abandoned = False
        self.finished = False

    def attach(self, conn: psycopg.Connection[Any]) -> None:
        """Thread side: ``conn`` is in use now (raises if the Trio side already gave up)."""
        try:
            sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        except (OSError, psycopg.Error):
            sock = None  # no descriptor to spare: the call can still run, only not be woken
        with self.lock:
            self.conn, self.sock = conn, sock
            if self.abandoned:
                self._drop()
                raise StoreUnavailable("PostgreSQL did not answer in time")

    def finish(self) -> None:
        """Thread side: the call is over; a connection nobody will take back is closed."""
        with self.lock:
            self.finished = True
            if self.abandoned:
                self._drop()
            elif self.sock is not None:
                self.sock.close()
                self.sock = None

    def abandon(self) -> None:
        """Trio side: give up on the call; its connection is never reused."""
        with self.lock:
            self.abandoned = True
            if self.finished:
                self._drop()
            elif self.sock is not None:
                # wakes the thread blocked on the socket; it closes the connection itself
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.conn is not None:
            self.conn.close()


class ConnectionPool:
    """At most ``size`` connections, opened lazily, reused LIFO, replaced when broken; plus
    one connection of its own for :meth:`ping`."""

    def __init__(
        self,
        conninfo: str,
        *,
        size: int,
        connect_timeout_s: float,
        statement_timeout_ms: int,
        tcp_user_timeout_ms: int = 5_000,
        call_timeout_s: float | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._kwargs = connection_kwargs(
            connect_timeout_s, statement_timeout_ms, tcp_user_timeout_ms, conninfo
        )
        self.call_timeout_s = (
            call_timeout_s if call_timeout_s is not None else statement_timeout_ms / 1000 + 5
        )
        self._size = size
        self._slots = trio.Semaphore(size)
        self._limiter = trio.CapacityLimiter(size + 1)  # + the ping
        self._idle: list[psycopg.Connection[Any]] = []
        self._probe: psycopg.Connection[Any] | None = None
        self._in_flight: set[trio.CancelScope] = set()  # deadlines of the calls running
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

    def _late(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"PostgreSQL did not answer within {self.call_timeout_s:g} s (or stopped answering "
            "the health probe); connection dropped"
        )

    def stats(self) -> tuple[int, int]:
        """How many calls the pool may run at once, and how many it runs now."""
        return self._size, self._size - self._slots.value

    def interrupt(self) -> int:
        """Give up every call in flight now, as if its deadline had passed (the health probe
        found the database hung); returns how many."""
        for scope in self._in_flight:
            scope.cancel()
        return len(self._in_flight)

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn(connection)`` in a worker thread and return its result (see the module:
        deadline, cancellation)."""
        if self._closed:
            raise StoreUnavailable("connection pool is closed")
        deadline = trio.current_time() + self.call_timeout_s
        with trio.CancelScope(deadline=deadline) as waiting:
            await self._slots.acquire()
        if waiting.cancelled_caught:
            raise self._late()
        try:
            call = _Call(self._idle.pop() if self._idle else None)
            with trio.CancelScope(shield=True):  # the caller's cancellation waits for the call
                with trio.CancelScope(deadline=deadline) as running:
                    self._in_flight.add(running)
                    try:
                        result = await trio.to_thread.run_sync(
                            self._call, call, fn, limiter=self._limiter, abandon_on_cancel=True
                        )
                    finally:
                        self._in_flight.discard(running)
                if running.cancelled_caught:
                    call.abandon()
                    raise self._late()
            self._release(call.conn)
            return result
        finally:
            self._slots.release()

    @overload
    async def fetch_all(
        self, sql: str, params: Params | None = None, *, retry_deadlock: bool = False
    ) -> list[tuple[Any, ...]]: ...

    @overload
    async def fetch_all(
        self,
        sql: str,
        params: Params | None = None,
        *,
        row: Callable[..., R],
        retry_deadlock: bool = False,
    ) -> list[R]: ...

    async def fetch_all(
        self,
        sql: str,
        params: Params | None = None,
        *,
        row: Callable[..., Any] | None = None,
        retry_deadlock: bool = False,
    ) -> list[Any]:
        """Every row of one statement, run as :meth:`run` runs a call: tuples, or
        ``row(**columns)`` for each row when ``row`` is given (a class whose fields are the
        columns' names). ``retry_deadlock``: run the statement again, up to
        :data:`DEADLOCK_ATTEMPTS` times, when PostgreSQL chose it as a deadlock victim (for
        statements that are one transaction)."""
        factory = _row_factory(row)

        def fetch(conn: psycopg.Connection[Any]) -> list[Any]:
            with conn.cursor(row_factory=factory) as cur:
                cur.execute(sql, params)
                return cur.fetchall()

        return await self.run(retrying(fetch) if retry_deadlock else fetch)

    @overload
    async def fetch_one(
        self, sql: str, params: Params | None = None, *, retry_deadlock: bool = False
    ) -> tuple[Any, ...] | None: ...

    @overload
    async def fetch_one(
        self,
        sql: str,
        params: Params | None = None,
        *,
        row: Callable[..., R],
        retry_deadlock: bool = False,
    ) -> R | None: ...

    async def fetch_one(
        self,
        sql: str,
        params: Params | None = None,
        *,
        row: Callable[..., Any] | None = None,
        retry_deadlock: bool = False,
    ) -> Any:
        """The first row of one statement (None when it returns none); as
        :meth:`fetch_all`."""
        factory = _row_factory(row)

        def fetch(conn: psycopg.Connection[Any]) -> Any:
            with conn.cursor(row_factory=factory) as cur:
                cur.execute(sql, params)
                return cur.fetchone()

        return await self.run(retrying(fetch) if retry_deadlock else fetch)

    async def execute(
        self, sql: str, params: Params | None = None, *, retry_deadlock: bool = False
    ) -> int:
        """Run one statement for its effect; how many rows it affected."""

        def statement(conn: psycopg.Connection[Any]) -> int:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.rowcount

        return await self.run(retrying(statement) if retry_deadlock else statement)

    async def ping(self) -> None:
        """``SELECT 1`` on the pool's own probe connection, so a busy pool never delays the
        answer. Cancelling it (a probe timeout) drops that connection."""
        if self._closed:
            raise StoreUnavailable("connection pool is closed")
        call = _Call(self._probe)
        self._probe = None

        def select_one(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SELECT 1").fetchone()

        try:
            with trio.fail_after(self.call_timeout_s):
                await trio.to_thread.run_sync(
                    self._call, call, select_one, limiter=self._limiter, abandon_on_cancel=True
                )
        except trio.TooSlowError:
            call.abandon()
            raise self._late() from None
        except BaseException:
            call.abandon()
            raise
        if self.closed:  # closed meanwhile
            call.abandon()
        else:
            self._probe = call.conn

    @property
    def closed(self) -> bool:
        return self._closed

    def _release(self, conn: psycopg.Connection[Any] | None) -> None:
        if conn is None or conn.closed:
            return
        if self._closed:
            conn.close()
        else:
            self._idle.append(conn)

    def _call(self, call: _Call, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        conn = call.conn
        call.conn = None
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self.connect_sync()
        try:
            call.attach(conn)
        except BaseException:
            call.finish()
            raise
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
        finally:
            call.finish()

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
        with trio.CancelScope(deadline=trio.current_time() + self.call_timeout_s) as scope:
            self._in_flight.add(scope)
            try:
                return await self._query_within(name, sql, params)
            finally:
                self._in_flight.discard(scope)
        raise self._late()  # only reached when the deadline (or interrupt) cancelled the call

    async def _query_within(
        self, name: str, sql: bytes, params: Sequence[bytes | None]
    ) -> list[tuple[bytes | None, ...]]:
        slots = self._slots
        await acquire_free(slots)
        try:
            conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed or conn.broken:
                if conn is not None:
                    conn.close()
                conn = await self._connect()
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
        finally:
            slots.release()

    async def _connect(self) -> psycopg.Connection[Any]:
        """Open a connection in a worker thread; a caller that gives up leaves the thread to
        finish connecting, and the connection is closed."""
        call = _Call(None)

        def connect() -> psycopg.Connection[Any]:
            conn = self.connect_sync()
            with call.lock:
                call.conn, call.finished = conn, True
                if call.abandoned:
                    conn.close()
                    raise StoreUnavailable("PostgreSQL did not answer in time")
            return conn

        try:
            return await trio.to_thread.run_sync(
                connect, limiter=self._limiter, abandon_on_cancel=True
            )
        except BaseException:
            call.abandon()
            raise

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
            get, columns = res.get_value, range(res.nfields)
            rows.extend(tuple([get(r, c) for c in columns]) for r in range(res.ntuples))
        return rows

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        if self._probe is not None:
            idle.append(self._probe)
            self._probe = None
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
            text = f"database error: {message.splitlines()[0] if message else sqlstate}"
            if sqlstate == _DEADLOCK_SQLSTATE:
                raise StoreDeadlock(text)
            raise StoreError(text)
    return results


def _row_factory(row: Callable[..., Any] | None) -> RowFactory[Any]:
    return tuple_row if row is None else kwargs_row(row)


def retrying(
    fn: Callable[[psycopg.Connection[Any]], T],
) -> Callable[[psycopg.Connection[Any]], T]:
    """Run ``fn`` again if PostgreSQL chose it as a deadlock victim (it was rolled back)."""

    def again(conn: psycopg.Connection[Any]) -> T:
        for attempt in range(DEADLOCK_ATTEMPTS):
            try:
                return fn(conn)
            except pg_errors.DeadlockDetected:
                if attempt == DEADLOCK_ATTEMPTS - 1:
                    raise
                log.warning("deadlock detected; retrying the call")
        raise AssertionError("unreachable")

    return again


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

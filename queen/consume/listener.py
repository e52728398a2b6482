"""The push listener: wakes this process's waiting pops when another process pushes.

Every push transaction notifies channel ``queen_push`` with the names of the queues it wrote
(a trigger in ``consume.sql``), at commit. This component owns one dedicated PostgreSQL
connection that LISTENs on that channel. A worker thread waits on the socket for at most
``poll_s`` at a time and hands the queue names it received back to the Trio task, which calls
``on_queues``; so a push in another broker process reaches a waiting pop here within
milliseconds.

Lifetime: started with ``await nursery.start(listener.run)``; ready once the first LISTEN
succeeded (or failed: the broker does not wait for the database here; waiting pops then rely
on their periodic re-check). If the connection breaks it is reopened every ``retry_s``, and
``on_reconnect`` runs (notifications may have been missed meanwhile). Cancelling the task
stops it at once: the worker thread is abandoned and closes the connection itself when its
current wait ends; exactly one side closes it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from queen.storage.base import StoreError

log = logging.getLogger("queen.consume")

CHANNEL = "queen_push"


class PushListener:
    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        on_queues: Callable[[set[str]], None],
        *,
        on_reconnect: Callable[[], None] = lambda: None,
        poll_s: float = 0.25,
        retry_s: float = 1.0,
    ) -> None:
        self._connect = connect
        self._on_queues = on_queues
        self._on_reconnect = on_reconnect
        self._poll_s = poll_s
        self._retry_s = retry_s
        self.connected = False

    async def run(
        self, *, task_status: trio.TaskStatus[PushListener] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled, reconnecting as needed."""
        started = False
        while True:
            link = _Link()
            try:
                try:
                    await trio.to_thread.run_sync(self._open, link, abandon_on_cancel=True)
                except (StoreError, psycopg.Error) as exc:
                    log.warning("push listener cannot connect (%s); retrying", exc)
                if link.conn is not None:
                    self.connected = True
                    self._on_reconnect()
                if not started:
                    task_status.started(self)
                    started = True
                if link.conn is not None:
                    await self._listen(link)
            except psycopg.Error as exc:
                log.warning("push listener connection lost (%s); reconnecting", exc)
            finally:
                self.connected = False
                if link.stop() and link.conn is not None:
                    link.conn.close()
            await trio.sleep(self._retry_s)

    def _open(self, link: _Link) -> None:
        """Worker thread: connect and LISTEN; the connection goes into ``link``."""
        if not link.enter_thread():
            return
        try:
            link.conn = self._connect()
            link.conn.execute(f"LISTEN {CHANNEL}")
        finally:
            if link.leave_thread() and link.conn is not None:
                link.conn.close()

    async def _listen(self, link: _Link) -> None:
        while True:
            names = await trio.to_thread.run_sync(self._wait, link, abandon_on_cancel=True)
            if names:
                self._on_queues(names)

    def _wait(self, link: _Link) -> set[str]:
        """Worker thread: the queue names notified within ``poll_s`` (possibly none)."""
        conn = link.conn
        if conn is None or not link.enter_thread():
            return set()
        try:
            names = {n.payload for n in conn.notifies(timeout=self._poll_s, stop_after=1)}
            if names:
                names.update(n.payload for n in conn.notifies(timeout=0, stop_after=10_000))
            return names
        finally:
            if link.leave_thread():
                conn.close()


class _Link:
    """One listening connection, and who closes it: the Trio task, or a worker thread the
    task abandoned when it was cancelled. ``leave_thread`` and ``stop`` return True when
    their caller is the one that must close it.
    """

    __slots__ = ("_in_thread", "_lock", "_stopped", "conn")

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._in_thread = False
        self._stopped = False

    def enter_thread(self) -> bool:
        """A worker thread starts waiting; False if the listener already stopped."""
        with self._lock:
            if self._stopped:
                return False
            self._in_thread = True
            return True

    def leave_thread(self) -> bool:
        with self._lock:
            self._in_thread = False
            return self._stopped

    def stop(self) -> bool:
        with self._lock:
            self._stopped = True
            return not self._in_thread

"""The push listener: wakes this process's waiting pops when another process pushes.

Every push transaction notifies channel ``queen_pushed``, once per queue it wrote, with a JSON
array of the queue's name and the names of the partitions it wrote (a trigger in
``consume.sql``), at commit; so does an ack that hands a lease back (retry, a failure) with
messages behind it, for that partition; the queue's name alone stands for the queue as a whole
(a seek, a deleted group, more partitions than a notification holds). This component owns one
dedicated PostgreSQL connection that LISTENs on that channel. The Trio task waits on the
connection's socket itself (no worker thread while waiting), reads every notification that
arrived, and calls ``on_partitions`` with the (queue, partition) written and ``on_queues`` with
the queues named as a whole (a payload that is not such an array is taken as a queue's name);
so a push in another broker process reaches a waiting pop here within milliseconds.

Lifetime: started with ``await nursery.start(listener.run)``; ready once the first LISTEN
succeeded (or failed: the broker does not wait for the database here; waiting pops then rely
on their periodic re-check). If the connection breaks it is reopened every ``retry_s``, and
``on_reconnect`` runs (notifications may have been missed meanwhile). Cancelling the task
stops it at once, and the connection is closed on the way out. The log follows the state, not
the attempts: one WARNING when the connection is lost (or the first connect fails), a reminder
every ``remind_s`` while it stays down, and one line when it is back; every failed attempt is
reported to the loop's supervision, so ``/health`` shows the listener failing while it is
down, and ``ok`` once connected again. Opening a connection and sending LISTEN runs in a
worker thread, within ``open_timeout_s`` (a server that hangs without closing would otherwise
hold it forever): past it the attempt is abandoned (the thread closes whatever it opened when
it returns) and retried.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from queen.errors import StoreError
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.consume")  # its messages are about waiting pops

CHANNEL = "queen_pushed"


def parse(payload: bytes) -> tuple[str, list[str]]:
    """One notification as ``(queue, partitions written)``; no partitions: the queue as a
    whole."""
    text = payload.decode()
    try:
        value = json.loads(text)
    except ValueError:
        return text, []
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return text, []
    return value[0], value[1:]


class PushListener:
    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        on_queues: Callable[[set[str]], None],
        *,
        on_partitions: Callable[[set[tuple[str, str]]], None] | None = None,
        on_reconnect: Callable[[], None] = lambda: None,
        retry_s: float = 1.0,
        open_timeout_s: float = 10.0,
        remind_s: float = 60.0,
    ) -> None:
        self._connect = connect
        self._on_queues = on_queues
        self._on_partitions = on_partitions
        self._on_reconnect = on_reconnect
        self._retry_s = retry_s
        self._open_timeout_s = open_timeout_s
        self._remind_s = remind_s
        self.connected = False
        self._down_since: float | None = None  # trio clock, while it cannot listen
        self._attempts = 0  # failed attempts since then
        self._reminded_at = 0.0

    async def run(
        self, *, task_status: trio.TaskStatus[PushListener] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled, reconnecting as needed."""
        started = False
        while True:
            conn: psycopg.Connection[Any] | None = None
            try:
                try:
                    conn = await self._open_bounded()
                except (StoreError, psycopg.Error) as exc:
                    self._failed("cannot connect", exc)
                if conn is not None:
                    self._connected()
                    self._on_reconnect()
                if not started:
                    task_status.started(self)
                    started = True
                if conn is not None:
                    await self._listen(conn)
            except psycopg.Error as exc:
                self._failed("connection lost", exc)
            finally:
                self.connected = False
                if conn is not None:
                    conn.close()
            await trio.sleep(self._retry_s)

    def _failed(self, what: str, exc: Exception) -> None:
        now = trio.current_time()
        self._attempts += 1
        report_failure(f"{what}: {exc}")
        if self._down_since is None:
            self._down_since = self._reminded_at = now
            log.warning("push listener %s (%s); retrying every %g s", what, exc, self._retry_s)
        elif now - self._reminded_at >= self._remind_s:
            self._reminded_at = now
            log.warning(
                "push listener still down after %.0f s (%d attempts): %s",
                now - self._down_since,
                self._attempts,
                exc,
            )
        else:
            log.debug("push listener %s (%s)", what, exc)

    def _connected(self) -> None:
        self.connected = True
        report_ok()
        if self._down_since is not None:
            log.info(
                "push listener connected again after %.1f s (%d failed attempts)",
                trio.current_time() - self._down_since,
                self._attempts,
            )
        self._down_since = None
        self._attempts = 0

    async def _open_bounded(self) -> psycopg.Connection[Any]:
        lock = threading.Lock()
        opened: list[psycopg.Connection[Any]] = []
        abandoned = False

        def work() -> psycopg.Connection[Any]:
            conn = self._open()
            with lock:
                opened.append(conn)
                if abandoned:
                    conn.close()
            return conn

        def give_up() -> None:
            nonlocal abandoned
            with lock:
                abandoned = True
                for conn in opened:
                    conn.close()

        try:
            with trio.fail_after(self._open_timeout_s):
                return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        except trio.TooSlowError:
            give_up()
            raise StoreError(f"no answer within {self._open_timeout_s:g} s") from None
        except BaseException:
            give_up()
            raise

    def _open(self) -> psycopg.Connection[Any]:
        """Worker thread: connect and LISTEN."""
        conn = self._connect()
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _listen(self, conn: psycopg.Connection[Any]) -> None:
        pg = conn.pgconn
        fd = pg.socket
        while True:
            await trio.lowlevel.wait_readable(fd)
            pg.consume_input()  # raises if the connection broke
            names: set[str] = set()
            written: set[tuple[str, str]] = set()
            while (note := pg.notifies()) is not None:
                queue, partitions = parse(note.extra)
                if partitions and self._on_partitions is not None:
                    written.update((queue, p) for p in partitions)
                else:
                    names.add(queue)
            if written and self._on_partitions is not None:
                self._on_partitions(written)
            if names:
                self._on_queues(names)

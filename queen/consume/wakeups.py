"""Wake-ups for long-polling pops, keyed by queue name.

A waiting pop takes a *ticket* for its queue **before** it queries the database, queries, and
if nothing was there waits on the ticket. Whoever learns that a queue may have new work (a
committed push in this process, a NOTIFY from another process, an ack that released a lease)
fires the queue: every ticket taken for it so far is set, and the next ticket is a fresh one.
Because the ticket predates the query, a push that commits after the query's snapshot always
sets it: no wake-up is lost between "nothing there" and "wait".

Namespace/task pops (no queue name) take the wildcard ticket, which every fire sets.
:meth:`Wakeups.epoch` counts the fires that concern a ticket: while it has not changed, a
ticket taken now is as good as one taken earlier. Everything here runs in the Trio thread and
never blocks.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

ANY_QUEUE = "\x00*"
"""The ticket of pops that span queues (namespace/task pops); no queue can have this name."""


class Wakeups:
    def __init__(self) -> None:
        self._tickets: dict[str, trio.Event] = {}
        self._fired: dict[str, int] = {}  # fires per queue name (ANY_QUEUE: any fire)
        self._fired_all = 0
        self._waiting = 0
        self._changed = trio.Event()

    @property
    def waiting(self) -> int:
        """Pops waiting right now (for tests and metrics)."""
        return self._waiting

    def ticket(self, queue: str | None) -> trio.Event:
        """The event the next fire of ``queue`` (or of any queue, for None) sets."""
        key = ANY_QUEUE if queue is None else queue
        event = self._tickets.get(key)
        if event is None:
            event = self._tickets[key] = trio.Event()
        return event

    def epoch(self, queue: str | None) -> int:
        """How many fires so far would have set a ticket of ``queue`` (None: a cross-queue
        ticket)."""
        key = ANY_QUEUE if queue is None else queue
        return self._fired.get(key, 0) + self._fired_all

    def fire(self, queues: Iterable[str]) -> None:
        """Wake every pop waiting on one of ``queues``, and every cross-queue pop."""
        fired = False
        for queue in queues:
            event = self._tickets.pop(queue, None)
            if event is not None:
                event.set()
            self._fired[queue] = self._fired.get(queue, 0) + 1
            fired = True
        if fired:
            self._fired[ANY_QUEUE] = self._fired.get(ANY_QUEUE, 0) + 1
            event = self._tickets.pop(ANY_QUEUE, None)
            if event is not None:
                event.set()

    def fire_all(self) -> None:
        """Wake every waiting pop (shutdown, or notifications that may have been missed)."""
        tickets, self._tickets = self._tickets, {}
        self._fired_all += 1
        for event in tickets.values():
            event.set()

    async def wait(self, ticket: trio.Event, deadline: float) -> bool:
        """Wait until ``ticket`` is set (True) or ``deadline`` passes (False)."""
        self._count(+1)
        try:
            with trio.move_on_at(deadline):
                await ticket.wait()
                return True
            return False
        finally:
            self._count(-1)
            if not ticket.is_set() and ticket.statistics().tasks_waiting == 0:
                for key, event in list(self._tickets.items()):
                    if event is ticket:
                        del self._tickets[key]

    async def until_waiting(self, count: int) -> None:
        """Return once exactly ``count`` pops are waiting (tests use it instead of sleeping)."""
        while self._waiting != count:
            await self._changed.wait()

    def _count(self, delta: int) -> None:
        self._waiting += delta
        self._changed.set()
        self._changed = trio.Event()

"""Wake-ups for long-polling pops, keyed by queue name.

A waiting pop takes a *ticket* for its queue **before** it queries the database, queries, and
if nothing was there waits on the ticket. Whoever learns that a queue may have new work (a
committed push in this process, a NOTIFY from another process, an ack that released a lease)
fires the queue: every ticket taken for it so far is set, and the next ticket is a fresh one.
Because the ticket predates the query, a push that commits after the query's snapshot always
sets it: no wake-up is lost between "nothing there" and "wait".

A pop of one partition takes a ticket of that partition: a commit fires the partitions it
wrote (:meth:`Wakeups.fire_partitions`), so pops bound to other partitions of the queue sleep
on; a fire of the queue as a whole (a NOTIFY from another process, an ack that released a
lease, a seek) sets them all. Namespace/task pops (no queue name) take the wildcard ticket,
which every fire sets. :meth:`Wakeups.epoch` counts the fires that concern a ticket: while it
has not changed, a ticket taken now is as good as one taken earlier.

Fires of partitions are also remembered, per queue, in the order they came (the latest
:data:`REMEMBERED` partitions of each queue): :meth:`Wakeups.fired_since` tells which
partitions of a queue fired after a :meth:`Wakeups.position`, so a pop whose like look found
nothing at that position needs to look at those partitions only, as long as the queue as a
whole did not fire since (:meth:`Wakeups.wide_epoch`). Everything here runs in the Trio thread
and never blocks.

The tickets are Trio events, not ``trio_util.RepeatedEvent``: a repeated event takes its place
in the sequence of fires when the wait starts, after the query, so a fire in between would be
lost; a ticket is taken before the query.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable

import trio
from trio_util import AsyncValue

ANY_QUEUE = "\x00*"
"""The ticket of pops that span queues (namespace/task pops); no queue can have this name."""

REMEMBERED = 4096
"""Partitions whose fires are remembered per queue; an older fire is known only as "some"."""

_FORGET_AT_ONCE = 512
"""Past :data:`REMEMBERED` by this many, a queue's oldest fires are dropped together."""


class Wakeups:
    def __init__(self) -> None:
        self._tickets: dict[str, trio.Event] = {}  # queue-wide pops, and ANY_QUEUE
        self._partition_tickets: dict[str, dict[str, trio.Event]] = {}  # queue -> partition
        self._fired: dict[str, int] = {}  # queue-wide fires per queue name (ANY_QUEUE: any)
        self._fired_some_partition: dict[str, int] = {}  # per queue: fires of one partition
        self._fired_all = 0
        self._position = 0  # fires of partitions so far, every queue
        self._pushed: dict[str, dict[str, int]] = {}  # queue -> partition -> its last fire
        self._forgotten: dict[str, int] = {}  # queue -> the latest fire no longer remembered
        self._waiting = AsyncValue(0)

    @property
    def waiting(self) -> int:
        """Pops waiting right now (for tests and metrics)."""
        waiting: int = self._waiting.value
        return waiting

    def ticket(self, queue: str | None, partition: str | None = None) -> trio.Event:
        """The event the next fire of ``queue`` (or of any queue, for None) sets; with
        ``partition``, the next fire of the queue as a whole or of that partition."""
        if queue is not None and partition is not None:
            tickets = self._partition_tickets.setdefault(queue, {})
            event = tickets.get(partition)
            if event is None:
                event = tickets[partition] = trio.Event()
            return event
        key = ANY_QUEUE if queue is None else queue
        event = self._tickets.get(key)
        if event is None:
            event = self._tickets[key] = trio.Event()
        return event

    def epoch(self, queue: str | None, partition: str | None = None) -> int:
        """A count that changes with every fire that would have set a ticket of ``queue``
        (None: a cross-queue ticket; with ``partition``, of that partition; a fire of another
        partition of the queue changes it too, which only costs a query more)."""
        if queue is None:
            return self._fired.get(ANY_QUEUE, 0) + self._fired_all
        return (
            self._fired.get(queue, 0) + self._fired_some_partition.get(queue, 0) + self._fired_all
        )

    def position(self) -> int:
        """How many fires of partitions came so far (for :meth:`fired_since`)."""
        return self._position

    def wide_epoch(self, queue: str) -> int:
        """A count that changes with every fire of ``queue`` as a whole (and of everything)."""
        return self._fired.get(queue, 0) + self._fired_all

    def fired_since(self, queue: str, position: int, limit: int) -> list[str] | None:
        """The partitions of ``queue`` fired after ``position``, latest first; None when there
        are more than ``limit`` of them or they are no longer all remembered."""
        if self._forgotten.get(queue, 0) > position:
            return None
        out: list[str] = []
        for partition, at in reversed(self._pushed.get(queue, {}).items()):
            if at <= position:
                break
            if len(out) == limit:
                return None
            out.append(partition)
        return out

    def fire(self, queues: Iterable[str]) -> None:
        """Wake every pop waiting on one of ``queues`` (on any of their partitions), and every
        cross-queue pop."""
        fired = False
        for queue in queues:
            event = self._tickets.pop(queue, None)
            if event is not None:
                event.set()
            for event in self._partition_tickets.pop(queue, {}).values():
                event.set()
            self._fired[queue] = self._fired.get(queue, 0) + 1
            fired = True
        if fired:
            self._fire_any()

    def fire_partitions(self, keys: Collection[tuple[str, str]]) -> None:
        """Wake the pops waiting on one of these (queue, partition): those of the whole queue,
        those of that partition (not those of the queue's other partitions), and every
        cross-queue pop."""
        if not keys:
            return
        pushed = self._pushed
        for queue, partition in keys:
            self._position += 1
            remembered = pushed.get(queue)
            if remembered is None:
                remembered = pushed[queue] = {}
            else:
                remembered.pop(partition, None)  # (re-inserted: the latest come last)
            remembered[partition] = self._position
            if len(remembered) > REMEMBERED + _FORGET_AT_ONCE:
                self._forget_oldest(queue, remembered)
        partition_tickets = self._partition_tickets
        if partition_tickets:  # (a commit usually finds no pop bound to a partition waiting)
            for queue, partition in keys:
                tickets = partition_tickets.get(queue)
                if tickets is not None:
                    one = tickets.pop(partition, None)
                    if one is not None:
                        one.set()
                    if not tickets:
                        del partition_tickets[queue]
        for queue in {queue for queue, _ in keys}:
            event = self._tickets.pop(queue, None)
            if event is not None:
                event.set()
            self._fired_some_partition[queue] = self._fired_some_partition.get(queue, 0) + 1
        self._fire_any()

    def _forget_oldest(self, queue: str, remembered: dict[str, int]) -> None:
        """Keep the latest :data:`REMEMBERED` fires of ``queue``: a queue of more partitions
        than that drops its oldest fires a batch at a time, not one at every fire."""
        latest_dropped = 0
        for partition in list(itertools.islice(remembered, len(remembered) - REMEMBERED)):
            latest_dropped = remembered.pop(partition)
        self._forgotten[queue] = latest_dropped

    def _fire_any(self) -> None:
        self._fired[ANY_QUEUE] = self._fired.get(ANY_QUEUE, 0) + 1
        event = self._tickets.pop(ANY_QUEUE, None)
        if event is not None:
            event.set()

    def fire_all(self) -> None:
        """Wake every waiting pop (shutdown, or notifications that may have been missed)."""
        tickets, self._tickets = self._tickets, {}
        partitions, self._partition_tickets = self._partition_tickets, {}
        self._fired_all += 1
        for event in tickets.values():
            event.set()
        for by_partition in partitions.values():
            for event in by_partition.values():
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
                self._forget(ticket)

    def _forget(self, ticket: trio.Event) -> None:
        """Drop an unset ticket nobody waits on any more."""
        for key, event in list(self._tickets.items()):
            if event is ticket:
                del self._tickets[key]
                return
        for queue, tickets in list(self._partition_tickets.items()):
            for partition, event in list(tickets.items()):
                if event is ticket:
                    del tickets[partition]
                    if not tickets:
                        del self._partition_tickets[queue]
                    return

    async def until_waiting(self, count: int) -> None:
        """Return once exactly ``count`` pops are waiting (tests use it instead of sleeping)."""
        await self._waiting.wait_value(count)

    def _count(self, delta: int) -> None:
        self._waiting.value += delta

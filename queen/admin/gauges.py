"""The queues and groups Prometheus reads: per queue its depth, oldest pending age, DLQ depth
and partitions, per (queue, group) the lag, for at most :data:`MAX_GAUGE_QUEUES` queues (name
order).

Read from the database for each scrape, never kept: with ``--workers N`` any worker answers,
and a figure one kept would be older than what another worker has shown since. Scrapes of
this process at the same time share one read that started after each of them arrived
(:class:`FreshRead`), so a burst of them costs at most two.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

import trio

from queen.admin import params
from queen.admin.figures import need_store
from queen.admin.groups import GroupStanding, standing
from queen.admin.queues import QueueSummary, summary
from queen.storage.admin import PgAdminStore

MAX_GAUGE_QUEUES = 1000


@dataclass(frozen=True, slots=True)
class QueueGauges:
    """The per-queue and per-group figures Prometheus reads (at most 1,000 queues)."""

    queues: list[QueueSummary]
    groups: list[GroupStanding]


T = TypeVar("T")


class FreshRead(Generic[T]):
    """Reads that share a run of ``fetch`` only when it started after they were asked.

    One run at a time: a caller arriving while one is in flight waits for it to end and then
    for the next, which it shares with every caller that arrived meanwhile. So no caller gets
    a value read before it asked, and concurrent callers cost at most two runs. A run that
    fails (or whose caller is cancelled) leaves the next caller in line to run again.
    """

    def __init__(self, fetch: Callable[[], Awaitable[T]]) -> None:
        self._fetch = fetch
        self._lock = trio.Lock()  # fair: callers take turns in the order they came
        self._started = 0  # runs started so far
        self._last: tuple[int, T] | None = None  # the newest run's number and value

    async def read(self) -> T:
        asked_after = self._started  # a run numbered above this started after the ask
        async with self._lock:
            last = self._last
            if last is not None and last[0] > asked_after:
                return last[1]
            self._started += 1
            number = self._started
            value = await self._fetch()
            self._last = (number, value)
            return value


class Gauges:
    def __init__(self, store: PgAdminStore | None) -> None:
        """``store`` is None without PostgreSQL (:meth:`read` then raises
        :class:`queen.consume.errors.ConsumeUnavailable`)."""
        self._store = store
        self._reads = FreshRead(self._read)

    async def read(self) -> QueueGauges:
        """The gauges as a read that started after this call (see the module)."""
        return await self._reads.read()

    async def _read(self) -> QueueGauges:
        store = need_store(self._store)
        rows = await store.queues(limit=MAX_GAUGE_QUEUES, offset=0)
        groups = await store.groups(group=None, queue=None, limit=params.MAX_LIMIT, offset=0)
        now = datetime.now(UTC)
        return QueueGauges([summary(r, now) for r in rows], [standing(g, now) for g in groups])

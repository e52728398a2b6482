"""Queues: one page of them with their totals, one queue's figures (its partitions, a
page at a time, its options and totals, what it holds, the groups reading it), and the queues
per namespace and per task.

Figures are computed when asked, from offsets and cursors (see ``admin.sql``): nothing is
kept in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Literal

from queen.admin import params
from queen.admin.figures import MessageCounts, age_s, consumer_counts, need_store
from queen.admin.groups import GroupStanding, standing
from queen.admin.params import Args, Page
from queen.consume.errors import InvalidRequest
from queen.operations import Operations
from queen.records import QueueOptions
from queen.storage.admin import PARTITION_ORDERS as _ORDERS
from queen.storage.admin import PgAdminStore, QueueConfigRow, QueueRow
from queen.storage.retention import QueueHoldings

PARTITION_ORDERS = tuple(_ORDERS)

# --- queries -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueQuery:
    """Which queues to list: a page of those whose name holds ``search``, of ``namespace``
    and of ``task``."""

    page: Page = params.FIRST_PAGE
    search: str | None = None
    namespace: str | None = None
    task: str | None = None


def queue_query(args: Args, *, search: str | None = None) -> QueueQuery:
    """``limit``, ``offset``, ``search`` (``search`` instead, when given), ``namespace``,
    ``task``."""
    page = params.page(args)
    return QueueQuery(
        page,
        search or args.get("search") or None,
        params.optional_name(args, "namespace"),
        params.optional_name(args, "task"),
    )


@dataclass(frozen=True, slots=True)
class PartitionQuery:
    """Which partitions of a queue to show: a page, in ``order`` (one of
    :data:`PARTITION_ORDERS`), of those whose name holds ``search`` (any case) when given;
    ``paged``: the client asked for a page (``limit`` or ``offset``)."""

    page: Page = params.FIRST_PAGE
    order: str = "name"
    paged: bool = False
    search: str | None = None


def partition_query(args: Args) -> PartitionQuery:
    """``limit``, ``offset``, ``sort`` (``name``, the default, ``pending``: most first,
    ``oldest``: oldest pending message first, or ``lease``: soonest lease end first) and
    ``partition`` (a part of the names to show, checked as a name is: at most 255 characters,
    no control character)."""
    page = params.page(args)
    order = args.get("sort") or "name"
    if order not in PARTITION_ORDERS:
        raise InvalidRequest(f"sort must be one of {', '.join(PARTITION_ORDERS)}")
    search = params.optional_name(args, "partition")
    return PartitionQuery(page, str(order), params.paged(args), search)


# --- answers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """One queue of a list, with its totals over its partitions (each the consumer's
    furthest behind there: :func:`queen.admin.figures.consumer_counts`)."""

    id: int
    name: str
    namespace: str
    task: str
    priority: int
    created_at: datetime
    partitions: int
    messages: MessageCounts
    oldest_pending_at: datetime | None
    oldest_pending_age_s: float
    last_message_at: datetime | None


@dataclass(frozen=True, slots=True)
class QueuePage:
    """One page of queues; ``total`` counts every queue matching the filters."""

    queues: list[QueueSummary]
    total: int
    page: Page


@dataclass(frozen=True, slots=True)
class PartitionFigures:
    """One partition of a queue: its offsets, the figures of the consumers furthest behind
    there, queue mode's cursor and lease."""

    id: int
    name: str
    created_at: datetime
    messages: MessageCounts
    low_offset: int  # the lowest offset still stored
    next_offset: int
    cursor_offset: int  # queue mode's cursor
    lease_expires_at: datetime | None  # queue mode's live lease
    oldest_pending_at: datetime | None
    oldest_pending_age_s: float
    newest_at: datetime | None  # when its newest stored message was written


@dataclass(frozen=True, slots=True)
class ConfiguredQueue:
    """A queue's row: its names and options."""

    id: int
    name: str
    namespace: str
    task: str
    created_at: datetime
    options: QueueOptions


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """A queue, one page of its partitions, and its totals (``summary`` None when the queue
    went away between the reads)."""

    queue: ConfiguredQueue
    summary: QueueSummary | None
    partitions: list[PartitionFigures]
    page: Page


@dataclass(frozen=True, slots=True)
class QueueResources:
    """``GET /api/v1/resources/queues/{q}``: the queue's figures and what it holds."""

    figures: QueueFigures
    holdings: QueueHoldings


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """``GET /api/v1/status/queues/{q}``: the queue's figures and every group reading it."""

    figures: QueueFigures
    consumer_groups: list[GroupStanding]


@dataclass(frozen=True, slots=True)
class Depth:
    """The figures of a namespace or a task: held, pending, processing."""

    total: int
    pending: int
    processing: int


@dataclass(frozen=True, slots=True)
class Grouping:
    """The queues of one namespace or one task (``key``)."""

    key: str
    queues: int
    partitions: int
    messages: Depth


@dataclass(frozen=True, slots=True)
class Groupings:
    """Every namespace or every task (``by``), in name order."""

    by: Literal["namespace", "task"]
    items: list[Grouping]


def summary(row: QueueRow, now: datetime) -> QueueSummary:
    """A queue of :meth:`PgAdminStore.queues`."""
    return QueueSummary(
        id=row.id,
        name=row.name,
        namespace=row.namespace,
        task=row.task,
        priority=row.priority,
        created_at=row.created_at,
        partitions=row.partitions,
        messages=consumer_counts(
            held=row.held,
            undone=row.most_undone,
            processing=row.most_processing,
            done=row.most_done,
            dead=row.most_dead,
            failed=row.failed,
        ),
        oldest_pending_at=row.oldest_pending_at,
        oldest_pending_age_s=age_s(row.oldest_pending_at, now),
        last_message_at=row.newest_at,
    )


class QueueReads:
    def __init__(self, store: PgAdminStore | None, ops: Operations) -> None:
        """``store`` is None without PostgreSQL (the reads then raise
        :class:`queen.consume.errors.ConsumeUnavailable`); ``ops`` knows what a queue holds."""
        self._store = store
        self.ops = ops

    @property
    def store(self) -> PgAdminStore:
        return need_store(self._store)

    async def page(self, query: QueueQuery) -> QueuePage:
        """``GET /api/v1/resources/queues`` and ``/status/queues``: one page of queues."""
        rows = await self.store.queues(
            search=query.search,
            namespace=query.namespace,
            task=query.task,
            limit=query.page.limit,
            offset=query.page.offset,
        )
        now = datetime.now(UTC)
        total = rows[0].full_count if rows else 0
        return QueuePage([summary(r, now) for r in rows], total, query.page)

    async def _figures(
        self, queue: QueueConfigRow, query: PartitionQuery, *, every_partition: bool = False
    ) -> QueueFigures:
        """The queue of ``queue`` (its row), one page of its partitions (every one of them
        when ``every_partition`` and no page is asked), and its totals."""
        page = query.page
        if every_partition and not query.paged:
            rows = await params.every_row(
                partial(self.store.partitions, queue.id, order=query.order, search=query.search)
            )
            page = Page(len(rows), 0)
        else:
            rows = await self.store.partitions(
                queue.id,
                limit=page.limit,
                offset=page.offset,
                order=query.order,
                search=query.search,
            )
        now = datetime.now(UTC)
        partitions = [
            PartitionFigures(
                id=r.partition_id,
                name=r.name,
                created_at=r.created_at,
                messages=consumer_counts(
                    held=r.held,
                    undone=r.most_undone,
                    processing=r.most_processing,
                    done=r.most_done,
                    dead=r.most_dead,
                    failed=r.failed,
                ),
                low_offset=r.low_offset,
                next_offset=r.next_offset,
                cursor_offset=r.cursor_offset,
                lease_expires_at=r.lease_expires_at,
                oldest_pending_at=r.start_at,
                oldest_pending_age_s=age_s(r.start_at, now),
                newest_at=r.newest_at,
            )
            for r in rows
        ]
        found = await self.store.queues(name=queue.name, limit=1, offset=0)
        configured = ConfiguredQueue(
            queue.id, queue.name, queue.namespace, queue.task, queue.created_at, queue.options
        )
        return QueueFigures(configured, summary(found[0], now) if found else None, partitions, page)

    async def resources(self, name: str, query: PartitionQuery) -> QueueResources | None:
        """``GET /api/v1/resources/queues/{q}``: what the queue holds (segments, sidecar,
        options) and the queue, its partitions (one page) and totals."""
        holdings = await self.ops.queue_holdings(name)
        queue = await self.store.queue(name)
        if holdings is None or queue is None:
            return None
        return QueueResources(await self._figures(queue, query), holdings)

    async def status(
        self, name: str, query: PartitionQuery, *, every_partition: bool = False
    ) -> QueueStatus | None:
        """``GET /api/v1/status/queues/{q}``: configuration, partitions (every one, as the
        original answers, when ``every_partition`` and no page is asked), totals, groups."""
        queue = await self.store.queue(name)
        if queue is None:
            return None
        figures = await self._figures(queue, query, every_partition=every_partition)
        groups = await self.store.groups(group=None, queue=name, limit=params.MAX_LIMIT, offset=0)
        now = datetime.now(UTC)
        return QueueStatus(figures, [standing(g, now) for g in groups])

    async def _groupings(self, by: Literal["namespace", "task"]) -> Groupings:
        return Groupings(
            by,
            [
                Grouping(
                    key=r.key,
                    queues=r.queues,
                    partitions=r.partitions,
                    messages=Depth(
                        total=r.held,
                        pending=max(0, r.most_undone - r.most_processing),
                        processing=r.most_processing,
                    ),
                )
                for r in await self.store.groupings(by)
            ],
        )

    async def namespaces(self) -> Groupings:
        """``GET /api/v1/resources/namespaces``."""
        return await self._groupings("namespace")

    async def tasks(self) -> Groupings:
        """``GET /api/v1/resources/tasks``."""
        return await self._groupings("task")

"""Where consumer groups stand: per (group, queue) their lag and subscription, per partition
their cursor and whether it looks stuck, the partitions lagging past a threshold, and the
lag's history the broker samples (:class:`queen.admin.history.LagHistory`).

Read through :class:`queen.storage.admin.PgAdminStore`, answered as the typed values below;
:class:`queen.admin.service.AdminService` holds one as ``consumer_groups``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

import trio

from queen.admin import params
from queen.admin.figures import age_s, need_store
from queen.admin.history import LagHistory
from queen.admin.params import Args, Page
from queen.consume import requests
from queen.consume.errors import InvalidRequest
from queen.errors import StoreError
from queen.storage.admin import GROUP_PARTITION_ORDERS as _GROUP_ORDERS
from queen.storage.admin import STUCK_IDLE_S as _STUCK_IDLE_S
from queen.storage.admin import GroupPartitionRow, GroupRow, PgAdminStore
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.admin")

# How a stored subscription start reads back: as the pop asked for it (and as the original
# broker names it).
SUBSCRIPTION_MODES = {"all": "all", "now": "new", "at": "timestamp"}
GROUP_PARTITION_ORDERS = _GROUP_ORDERS  # how a group's page may sort its partitions
STUCK_IDLE_S = _STUCK_IDLE_S  # the store's rule: no pop this long on old messages is stuck
# A group is lagging on a queue when the oldest message it has still to receive is older than
# this (the original's ``Lagging`` state).
LAGGING_AFTER_S = 300
ALERTS_SHOWN = 10  # the lagging or stuck (group, queue) pairs the overview lists

# --- queries -----------------------------------------------------------------------------------

EVERY_GROUP = Page(params.MAX_LIMIT, 0)  # the groups listed when no page is asked


@dataclass(frozen=True, slots=True)
class GroupQuery:
    """Which (group, queue) standings to list: those on ``queue`` (or every queue), a page."""

    page: Page = EVERY_GROUP
    queue: str | None = None


def group_query(args: Args) -> GroupQuery:
    """``limit`` (by default the most a page holds: the original answers every group, and its
    clients ask without one), ``offset`` and ``queue``."""
    page = params.page(args, default_limit=EVERY_GROUP.limit)
    return GroupQuery(page, params.optional_name(args, "queue"))


@dataclass(frozen=True, slots=True)
class GroupDetailQuery:
    """Which of a group's partitions to show on each queue it reads: a page, in ``order`` (one
    of :data:`GROUP_PARTITION_ORDERS`)."""

    page: Page = params.FIRST_PAGE
    order: str = "name"


def group_detail_query(args: Args) -> GroupDetailQuery:
    """``limit``, ``offset`` and ``sort``: ``name`` (the default), ``lag`` (most messages
    behind first) or ``stuck`` (the partitions that look stuck first, then by lag)."""
    page = params.page(args)
    order = args.get("sort") or "name"
    if order not in GROUP_PARTITION_ORDERS:
        raise InvalidRequest(f"sort must be one of {', '.join(GROUP_PARTITION_ORDERS)}")
    return GroupDetailQuery(page, str(order))


@dataclass(frozen=True, slots=True)
class LaggingQuery:
    """The partitions whose oldest unconsumed message waited ``min_lag_s`` at least: all of
    them, or one page when ``paged``."""

    min_lag_s: int
    page: Page
    paged: bool


def lagging_query(args: Args) -> LaggingQuery:
    """``minLagSeconds`` (60 by default), ``limit`` and ``offset``."""
    value = requests.count(args.get("minLagSeconds"), "minLagSeconds", 0, 10 * 365 * 86400)
    paged = "limit" in args or "offset" in args
    return LaggingQuery(60 if value is None else value, params.page(args), paged)


# --- answers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupStanding:
    """A consumer group on one queue: ``lag`` messages behind over its ``partitions``,
    ``leased`` of them inside a live lease, the oldest unconsumed written at
    ``oldest_pending_at``. The subscription fields are None for queue mode and for groups
    that never subscribed."""

    name: str
    queue: str
    partitions: int
    leased: int
    lag: int
    max_time_lag_s: float
    oldest_pending_at: datetime | None
    last_consumed_at: datetime | None
    subscription_mode: str | None
    subscribed_at: datetime | None
    subscription_created_at: datetime | None
    lagging: int = 0  # partitions where it has messages to receive
    popped: int = 0  # partitions it has popped (a cursor with a delivery)
    popped_lag: int = 0  # its lag over the partitions it popped alone
    popped_lagging: int = 0  # of those, the partitions where it has messages to receive
    acknowledged: bool = False  # it acknowledged (or dead-lettered) a message on the queue
    stuck: int = 0  # partitions that look stuck


@dataclass(frozen=True, slots=True)
class GroupPartition:
    """Where a group stands in one partition holding messages: ``cursor_offset`` is its
    cursor, or, before its first pop there, the offset its subscription starts at."""

    partition: str
    partition_id: int
    cursor_offset: int
    next_offset: int
    lag: int
    time_lag_s: float
    lease_expires_at: datetime | None  # its live lease, if any
    last_consumed_at: datetime | None
    oldest_at: datetime | None = None  # when its oldest unconsumed message was written
    lease_expired_at: datetime | None = None  # a lease ran out here with messages in it
    stuck: str | None = None  # why this partition looks stuck, if it does


@dataclass(frozen=True, slots=True)
class LaggingPartition:
    """A partition where a group lags: the group's standing on the queue, and the partition."""

    standing: GroupStanding
    partition: GroupPartition


@dataclass(frozen=True, slots=True)
class GroupAlerts:
    """The (group, queue) pairs that need a look, ``total`` of them: ``lagging`` lag (the
    oldest message to receive is over :data:`LAGGING_AFTER_S` old), ``stuck`` have stuck
    partitions; ``shown``: the first of them, those with the most stuck partitions first, then
    the longest waiting."""

    total: int
    lagging: int
    stuck: int
    shown: list[GroupStanding]


@dataclass(frozen=True, slots=True)
class GroupOnQueue:
    """A group on one queue, with one page of its partitions."""

    standing: GroupStanding
    partitions: list[GroupPartition]


class ConsumerGroups:
    """The consumer-group reads of the admin API and the dashboard. ``store`` is None without
    PostgreSQL (the reads then raise :class:`ConsumeUnavailable`, the sampling loop returns)."""

    def __init__(self, store: PgAdminStore | None) -> None:
        self._store = store
        self.lag_history = LagHistory()

    @property
    def store(self) -> PgAdminStore:
        return need_store(self._store)

    async def standings(self, query: GroupQuery) -> list[GroupStanding]:
        """``GET /api/v1/consumer-groups``: one entry per (group, queue) of the query's queue
        (or every queue), one page."""
        rows = await self.store.groups(
            group=None, queue=query.queue, limit=query.page.limit, offset=query.page.offset
        )
        now = datetime.now(UTC)
        return [standing(r, now) for r in rows]

    async def alerts(self, shown: int | None = None) -> GroupAlerts:
        """The lagging or stuck (group, queue) pairs: how many, and the first ``shown``
        (:data:`ALERTS_SHOWN` by default), in one read over every pair."""
        limit = ALERTS_SHOWN if shown is None else shown
        rows = await self.store.group_alerts(lagging_s=LAGGING_AFTER_S, limit=limit)
        now = datetime.now(UTC)
        if not rows:
            return GroupAlerts(0, 0, 0, [])
        first = rows[0]
        return GroupAlerts(
            first.alert_pairs,
            first.lagging_pairs,
            first.stuck_pairs,
            [standing(r, now) for r in rows],
        )

    async def detail(self, name: str, query: GroupDetailQuery) -> list[GroupOnQueue] | None:
        """``GET /api/v1/consumer-groups/{g}``: per queue, the group's partitions (a page, in
        the query's order)."""
        page = query.page
        rows = await self.store.groups(group=name, queue=None, limit=params.MAX_LIMIT, offset=0)
        if not rows:
            return None
        now = datetime.now(UTC)
        found = []
        for r in rows:
            parts = await self.store.group_partitions(
                name, r.queue_id, limit=page.limit, offset=page.offset, order=query.order
            )
            partitions = [group_partition(p, now) for p in parts]
            found.append(GroupOnQueue(standing(r, now), partitions))
        return found

    async def lagging(self, query: LaggingQuery) -> list[LaggingPartition]:
        """``GET /api/v1/consumer-groups/lagging?minLagSeconds=N``: per (group, queue,
        partition), the partitions whose oldest unconsumed message is at least N seconds old,
        oldest first: all of them, as the original answers, or one page when ``limit`` or
        ``offset`` is given."""
        threshold, page = query.min_lag_s, query.page
        rows: list[GroupRow] = await params.every_row(
            partial(self.store.groups, group=None, queue=None)
        )
        now = datetime.now(UTC)
        found: list[LaggingPartition] = []
        for r in rows:
            group = standing(r, now)
            if r.lag <= 0 or group.max_time_lag_s < threshold:
                continue
            parts: list[GroupPartitionRow] = await params.every_row(
                partial(self.store.group_partitions, group.name, r.queue_id)
            )
            for p in parts:
                partition = group_partition(p, now)
                if partition.lag > 0 and partition.time_lag_s >= threshold:
                    found.append(LaggingPartition(group, partition))
        found.sort(key=lambda x: x.partition.time_lag_s, reverse=True)
        return found[page.offset : page.offset + page.limit] if query.paged else found

    async def sample_lag(self) -> None:
        """Record every group's lag on every queue (the first 1,000 pairs) in
        :attr:`lag_history`."""
        rows = await self.store.groups(group=None, queue=None, limit=params.MAX_LIMIT, offset=0)
        self.lag_history.record(
            time.time(), {(r.consumer_group, r.queue_name): r.lag for r in rows}
        )

    async def run_lag_history(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Sample the groups' lag every ``lag_history.step_s`` until cancelled; a sample the
        database cannot answer is skipped (and reported to the loop's supervision). The pause
        comes after each sample (not a fixed rate: see
        :meth:`queen.maintenance.MaintenanceSwitch.run`). Without PostgreSQL there is nothing
        to sample."""
        task_status.started()
        if self._store is None:
            return
        while True:
            try:
                await self.sample_lag()
            except StoreError as exc:
                log.debug("group lag not sampled: %s", exc)
                report_failure(exc)
            else:
                report_ok()
            await trio.sleep(self.lag_history.step_s)


def standing(r: GroupRow, now: datetime) -> GroupStanding:
    """A (group, queue) row of ``PgAdminStore.groups``."""
    mode = r.subscription_mode
    return GroupStanding(
        name=r.consumer_group,
        queue=r.queue_name,
        partitions=r.partitions,
        leased=r.leased,
        lag=r.lag,
        max_time_lag_s=age_s(r.oldest_at, now),
        oldest_pending_at=r.oldest_at,
        last_consumed_at=r.last_delivered_at,
        subscription_mode=None if mode is None else SUBSCRIPTION_MODES.get(mode, mode),
        subscribed_at=r.subscribed_at,
        subscription_created_at=r.subscription_created_at,
        lagging=r.lagging,
        popped=r.popped,
        popped_lag=r.popped_lag,
        popped_lagging=r.popped_lagging,
        acknowledged=r.done > 0,
        stuck=r.stuck,
    )


def group_partition(p: GroupPartitionRow, now: datetime) -> GroupPartition:
    """A row of ``PgAdminStore.group_partitions``."""
    return GroupPartition(
        partition=p.partition_name,
        partition_id=p.partition_id,
        cursor_offset=p.cursor_offset,
        next_offset=p.next_offset,
        lag=p.lag,
        time_lag_s=age_s(p.oldest_at, now),
        lease_expires_at=p.lease_expires_at,
        last_consumed_at=p.delivered_at,
        oldest_at=p.oldest_at,
        lease_expired_at=p.lease_expired_at,
        stuck=stuck_reason(
            p.stuck,
            lease_expired=p.lease_expired_at,
            last_pop=p.delivered_at,
            waiting_s=age_s(p.oldest_at, now),
            now=now,
        ),
    )


def stuck_reason(
    kind: str | None,
    *,
    lease_expired: datetime | None,
    last_pop: datetime | None,
    waiting_s: float,
    now: datetime,
) -> str | None:
    """Why a group's partition looks stuck, in words, from the ``kind`` the store found
    (``queen.admin_stuck``, the one rule: it holds messages for the group, no live lease
    covers them, and either a lease ran out there with messages in it and no pop since, or its
    oldest message has waited :data:`STUCK_IDLE_S` with no pop there for as long, or ever);
    None when it does not."""
    if kind == "lease_expired" and lease_expired is not None:
        return f"lease expired {_ago(now - lease_expired)} ago, not popped since"
    if kind == "never_popped":
        return f"never popped, oldest message waiting {_ago(timedelta(seconds=waiting_s))}"
    if kind == "idle" and last_pop is not None:
        return f"no pop for {_ago(now - last_pop)}"
    return None if kind is None else kind.replace("_", " ")


def _ago(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"

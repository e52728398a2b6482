"""Where consumer groups stand: per (group, queue) their lag and subscription, per partition
their cursor and whether it looks stuck, the partitions lagging past a threshold, and the
lag's history the broker samples (:class:`queen.admin.history.LagHistory`).

Read through :class:`queen.storage.admin.PgAdminStore`, answered as typed values
(:mod:`queen.admin.results`); :class:`queen.admin.service.AdminService` holds one as
``consumer_groups``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import trio

from queen.admin import params
from queen.admin.history import LagHistory
from queen.admin.params import Page
from queen.admin.results import (
    GroupOnQueue,
    GroupPartition,
    GroupStanding,
    LaggingPartition,
    age_s,
)
from queen.consume.errors import ConsumeUnavailable
from queen.errors import StoreError
from queen.storage.admin import PgAdminStore, Row
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.admin")

# How a stored subscription start reads back: as the pop asked for it (and as the original
# broker names it).
SUBSCRIPTION_MODES = {"all": "all", "now": "new", "at": "timestamp"}
STUCK_IDLE_S = 300.0  # a partition with messages for a group and no pop this long is stuck


class ConsumerGroups:
    """The consumer-group reads of the admin API and the dashboard. ``store`` is None without
    PostgreSQL (the reads then raise :class:`ConsumeUnavailable`, the sampling loop returns)."""

    def __init__(self, store: PgAdminStore | None) -> None:
        self._store = store
        self.lag_history = LagHistory()

    @property
    def store(self) -> PgAdminStore:
        if self._store is None:
            raise ConsumeUnavailable("the admin API needs the PostgreSQL store")
        return self._store

    async def standings(
        self, args: Mapping[str, Any], *, page: Page | None = None
    ) -> list[GroupStanding]:
        """``GET /api/v1/consumer-groups``: one entry per (group, queue) of ``args``' queue
        (or every queue), one page: ``page``, else the page ``args`` ask (without a ``limit``,
        the most a page holds: the original answers every group, and its clients ask
        without one)."""
        page = page or params.page(args, default_limit=params.MAX_LIMIT)
        rows = await self.store.groups(
            group=None,
            queue=params.optional_name(args, "queue"),
            limit=page.limit,
            offset=page.offset,
        )
        now = datetime.now(UTC)
        return [standing(r, now) for r in rows]

    async def detail(self, name: str, args: Mapping[str, Any]) -> list[GroupOnQueue] | None:
        """``GET /api/v1/consumer-groups/{g}``: per queue, the group's partitions (a page)."""
        page = params.page(args)
        rows = await self.store.groups(group=name, queue=None, limit=params.MAX_LIMIT, offset=0)
        if not rows:
            return None
        now = datetime.now(UTC)
        found = []
        for r in rows:
            parts = await self.store.group_partitions(
                name, int(r["queue_id"]), limit=page.limit, offset=page.offset
            )
            partitions = [group_partition(p, now) for p in parts]
            found.append(GroupOnQueue(standing(r, now), partitions))
        return found

    async def lagging(self, args: Mapping[str, Any]) -> list[LaggingPartition]:
        """``GET /api/v1/consumer-groups/lagging?minLagSeconds=N``: per (group, queue,
        partition), the partitions whose oldest unconsumed message is at least N seconds old,
        oldest first: all of them, as the original answers, or one page when ``limit`` or
        ``offset`` is given."""
        threshold = params.min_lag_seconds(args)
        paged = "limit" in args or "offset" in args
        page = params.page(args)
        rows = await every_row(partial(self.store.groups, group=None, queue=None))
        now = datetime.now(UTC)
        found: list[LaggingPartition] = []
        for r in rows:
            group = standing(r, now)
            if int(r["lag"]) <= 0 or group.max_time_lag_s < threshold:
                continue
            parts = await every_row(
                partial(self.store.group_partitions, group.name, int(r["queue_id"]))
            )
            for p in parts:
                partition = group_partition(p, now)
                if partition.lag > 0 and partition.time_lag_s >= threshold:
                    found.append(LaggingPartition(group, partition))
        found.sort(key=lambda x: x.partition.time_lag_s, reverse=True)
        return found[page.offset : page.offset + page.limit] if paged else found

    async def sample_lag(self) -> None:
        """Record every group's lag on every queue (the first 1,000 pairs) in
        :attr:`lag_history`."""
        rows = await self.store.groups(group=None, queue=None, limit=params.MAX_LIMIT, offset=0)
        self.lag_history.record(
            time.time(), {(r["consumer_group"], r["queue_name"]): int(r["lag"]) for r in rows}
        )

    async def run_lag_history(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Sample the groups' lag every ``lag_history.step_s`` until cancelled; a sample the
        database cannot answer is skipped (and reported to the loop's supervision). Without
        PostgreSQL there is nothing to sample."""
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


def standing(r: Row, now: datetime) -> GroupStanding:
    """A (group, queue) row of ``PgAdminStore.groups``."""
    return GroupStanding(
        name=r["consumer_group"],
        queue=r["queue_name"],
        partitions=int(r["partitions"]),
        leased=int(r["leased"]),
        lag=int(r["lag"]),
        max_time_lag_s=age_s(r["oldest_at"], now),
        oldest_pending_at=r["oldest_at"],
        last_consumed_at=r["last_delivered_at"],
        subscription_mode=SUBSCRIPTION_MODES.get(r["subscription_mode"], r["subscription_mode"]),
        subscribed_at=r["subscribed_at"],
        subscription_created_at=r["subscription_created_at"],
        lagging=int(r["lagging"]),
    )


def group_partition(p: Row, now: datetime) -> GroupPartition:
    """A row of ``PgAdminStore.group_partitions``."""
    return GroupPartition(
        partition=p["partition_name"],
        partition_id=int(p["partition_id"]),
        cursor_offset=int(p["cursor_offset"]),
        next_offset=int(p["next_offset"]),
        lag=int(p["lag"]),
        time_lag_s=age_s(p["oldest_at"], now),
        lease_expires_at=p["lease_expires_at"],
        last_consumed_at=p["delivered_at"],
        oldest_at=p["oldest_at"],
        lease_expired_at=p["lease_expired_at"],
        stuck=stuck_reason(
            int(p["lag"]),
            lease=p["lease_expires_at"],
            lease_expired=p["lease_expired_at"],
            last_pop=p["delivered_at"],
            waiting_s=age_s(p["oldest_at"], now),
            now=now,
        ),
    )


def stuck_reason(
    lag: int,
    *,
    lease: datetime | None,
    lease_expired: datetime | None,
    last_pop: datetime | None,
    waiting_s: float,
    now: datetime,
) -> str | None:
    """Why a group's partition looks stuck, or None: it holds messages for the group, no live
    lease covers them, and either a lease ran out there (its consumer went away holding
    messages) or its oldest message has waited ``STUCK_IDLE_S`` (``waiting_s``) with no pop
    there for as long (or ever)."""
    if lag <= 0 or lease is not None:
        return None
    if lease_expired is not None:
        return f"lease expired {_ago(now - lease_expired)} ago, not popped since"
    if waiting_s < STUCK_IDLE_S:
        return None
    if last_pop is None:
        return f"never popped, oldest message waiting {_ago(timedelta(seconds=waiting_s))}"
    idle = now - last_pop
    if idle.total_seconds() >= STUCK_IDLE_S:
        return f"no pop for {_ago(idle)}"
    return None


def _ago(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


async def every_row(fetch: Callable[..., Awaitable[Sequence[Any]]]) -> list[Any]:
    """Every row of a paged store read, ``fetch(limit=..., offset=...)`` a page of
    :data:`params.MAX_LIMIT` at a time."""
    rows: list[Any] = []
    while True:
        got = await fetch(limit=params.MAX_LIMIT, offset=len(rows))
        rows.extend(got)
        if len(got) < params.MAX_LIMIT:
            return rows

"""The admin and observability service: what the broker holds, where consumers stand, and
how this process is doing, as typed values (:mod:`queen.admin.results`; HTTP renders them in
the original broker's shapes).

It reads through :class:`queen.storage.admin.PgAdminStore` and the broker's own state (counters,
spool, switches); it writes nothing but single message deletions. The operator's actions on
dead letters and queues are :attr:`AdminService.actions` (:mod:`queen.admin.actions`).
Figures are computed when asked, from offsets and cursors (see ``admin.sql``), so there is
nothing to keep in step; ``POST /api/v1/stats/refresh`` only takes a history sample.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Generic, TypeVar

import trio

from queen.admin import params
from queen.admin.actions import AdminActions
from queen.admin.groups import ConsumerGroups, every_row, standing
from queen.admin.history import History
from queen.admin.params import Page
from queen.admin.payloads import decode_payload
from queen.admin.results import (
    ConfiguredQueue,
    DatabaseDetail,
    DeadLetterRecord,
    DeadLetterSummary,
    DeletionOutcome,
    Depth,
    Grouping,
    Groupings,
    GroupView,
    IndexStats,
    Leases,
    MessageCounts,
    MessageDeletion,
    MessageDetail,
    MessagePage,
    MessageStatus,
    Overview,
    PartitionFigures,
    PostgresStats,
    ProcessMetrics,
    ProcessSeries,
    ProcessState,
    QueueFigures,
    QueueFlowSeries,
    QueueGauges,
    QueueLagPoint,
    QueuePage,
    QueueResources,
    QueueStatus,
    QueueSummary,
    RatePoint,
    RetentionFigures,
    RunningQuery,
    Standing,
    Status,
    StoredMessage,
    TableSize,
    TableStats,
    TimeRange,
    age_s,
)
from queen.consume.errors import ConsumeUnavailable, InvalidRequest
from queen.consume.service import ConsumeService
from queen.metrics import Figures, LocalFigures, Metrics
from queen.operations import Operations
from queen.push import PushService
from queen.records import QUEUE_MODE, QueueOptions
from queen.settings import Settings
from queen.storage.admin import PgAdminStore, Row

MAX_GAUGE_QUEUES = 1000
RETENTION_COUNTERS = (
    "retention_passes",
    "retention_segments_removed",
    "retention_messages_removed",
    "dedup_rows_pruned",
)


def _counts(row: Row, dead_letter: int | None = None) -> MessageCounts:
    """Queue mode's message figures of a queue or partition row."""
    held, undone, processing = int(row["held"]), int(row["undone"]), int(row["processing"])
    return MessageCounts(
        total=held,
        pending=max(0, undone - processing),
        processing=processing,
        completed=max(0, held - undone),
        failed=int(row.get("failed") or 0),
        dead_letter=int(row["dead_letter"] if dead_letter is None else dead_letter),
    )


def _options(row: Row) -> QueueOptions:
    """The options of a ``queen.queues`` row (its columns are the fields' names but one)."""
    values = {
        f.name: row[f.name] for f in dataclasses.fields(QueueOptions) if f.name != "dedup_window_s"
    }
    return QueueOptions(**values, dedup_window_s=row["dedup_window_seconds"])


def _whole(counters: Mapping[str, float]) -> dict[str, float]:
    """The :class:`Metrics` counters of a reading, counts as integers."""
    return {k: v if k in _SECONDS else int(v) for k, v in counters.items() if k in _METRIC_FIELDS}


_METRIC_FIELDS = frozenset(Metrics().snapshot())
_SECONDS = frozenset({"push_transaction_seconds", "pop_lag_seconds"})


def _time(text: str | None) -> datetime | None:
    """A time the database wrote into JSON."""
    return None if text is None else datetime.fromisoformat(text)


log = logging.getLogger("queen.admin")


class AdminService:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        ops: Operations,
        *,
        database: str,
        store: PgAdminStore | None = None,
        consume: ConsumeService | None = None,
        history: History | None = None,
        push: PushService,
        figures: Figures | None = None,
    ) -> None:
        """``database``: what the start-up line calls it; ``store`` and ``consume`` are None
        without PostgreSQL (the admin reads then raise :class:`ConsumeUnavailable`);
        ``figures``: how the service's counters are read (by default this process's)."""
        self.settings = settings
        self.metrics = metrics
        self.ops = ops
        self.database = database
        self._store = store
        self._consume = consume
        self.figures: Figures = figures or LocalFigures(metrics)
        self.history = history or History(self.figures, pool=self._pool)
        self.consumer_groups = ConsumerGroups(store)
        self._gauges = FreshRead(self._read_queue_gauges)
        self.actions = AdminActions(store, push)

    def _pool(self) -> tuple[int, int] | None:
        gauges = self.ops.gauges()
        if "db_pool_size" not in gauges:
            return None
        return int(gauges["db_pool_size"]), int(gauges["db_pool_active"])

    @property
    def store(self) -> PgAdminStore:
        if self._store is None:
            raise ConsumeUnavailable("the admin API needs the PostgreSQL store")
        return self._store

    @property
    def consume(self) -> ConsumeService:
        if self._consume is None:
            raise ConsumeUnavailable("consuming needs the PostgreSQL store")
        return self._consume

    # --- queues ------------------------------------------------------------------------------

    @staticmethod
    def _queue_summary(row: Row, now: datetime) -> QueueSummary:
        return QueueSummary(
            id=int(row["id"]),
            name=row["name"],
            namespace=row["namespace"],
            task=row["task"],
            priority=row["priority"],
            created_at=row["created_at"],
            partitions=int(row["partitions"]),
            messages=_counts(row),
            oldest_pending_at=row["oldest_pending_at"],
            oldest_pending_age_s=age_s(row["oldest_pending_at"], now),
            last_message_at=row["newest_at"],
        )

    async def queues(self, args: Mapping[str, Any]) -> QueuePage:
        """``GET /api/v1/resources/queues`` and ``/status/queues``: one page of queues."""
        page = params.page(args)
        rows = await self.store.queues(
            search=args.get("search") or None,
            namespace=params.optional_name(args, "namespace"),
            task=params.optional_name(args, "task"),
            limit=page.limit,
            offset=page.offset,
        )
        now = datetime.now(UTC)
        total = int(rows[0]["full_count"]) if rows else 0
        return QueuePage([self._queue_summary(r, now) for r in rows], total, page)

    async def _figures(
        self, queue: Row, args: Mapping[str, Any], *, every_partition: bool = False
    ) -> QueueFigures:
        """The queue of ``queue`` (its row), one page of its partitions (every one of them
        when ``every_partition`` and no ``limit`` is asked), and its totals."""
        page = params.page(args)
        order = params.partition_order(args)
        queue_id = int(queue["id"])
        if every_partition and not args.get("limit") and not args.get("offset"):
            rows = await every_row(partial(self.store.partitions, queue_id, order=order))
            page = Page(len(rows), 0)
        else:
            rows = await self.store.partitions(
                queue_id, limit=page.limit, offset=page.offset, order=order
            )
        dlq = await self.store.dlq_by_partition(queue_id)
        now = datetime.now(UTC)
        partitions = [
            PartitionFigures(
                id=int(r["partition_id"]),
                name=r["name"],
                created_at=r["created_at"],
                messages=_counts(r, dlq.get(int(r["partition_id"]), 0)),
                low_offset=int(r["low_offset"]),
                next_offset=int(r["next_offset"]),
                cursor_offset=int(r["cursor_offset"]),
                lease_expires_at=r["lease_expires_at"],
                oldest_pending_at=r["start_at"],
                oldest_pending_age_s=age_s(r["start_at"], now),
                newest_at=r["newest_at"],
            )
            for r in rows
        ]
        found = await self.store.queues(name=queue["name"], limit=1, offset=0)
        summary = self._queue_summary(found[0], now) if found else None
        configured = ConfiguredQueue(
            id=queue_id,
            name=queue["name"],
            namespace=queue["namespace"],
            task=queue["task"],
            created_at=queue["created_at"],
            options=_options(queue),
        )
        return QueueFigures(configured, summary, partitions, page)

    async def queue_resources(self, name: str, args: Mapping[str, Any]) -> QueueResources | None:
        """``GET /api/v1/resources/queues/{q}``: what the queue holds (segments, sidecar,
        options) and the queue, its partitions (one page) and totals."""
        holdings = await self.ops.queue_holdings(name)
        queue = await self.store.queue(name)
        if holdings is None or queue is None:
            return None
        return QueueResources(await self._figures(queue, args), holdings)

    async def queue_status(
        self, name: str, args: Mapping[str, Any], *, every_partition: bool = False
    ) -> QueueStatus | None:
        """``GET /api/v1/status/queues/{q}``: configuration, partitions (every one, as the
        original answers, when ``every_partition`` and no page is asked), totals, groups."""
        queue = await self.store.queue(name)
        if queue is None:
            return None
        figures = await self._figures(queue, args, every_partition=every_partition)
        groups = await self.store.groups(group=None, queue=name, limit=params.MAX_LIMIT, offset=0)
        now = datetime.now(UTC)
        return QueueStatus(figures, [standing(g, now) for g in groups])

    async def _groupings(self, by: str) -> list[Grouping]:
        return [
            Grouping(
                key=r["key"],
                queues=int(r["queues"]),
                partitions=int(r["partitions"]),
                messages=Depth(
                    total=int(r["held"]),
                    pending=max(0, int(r["undone"]) - int(r["processing"])),
                    processing=int(r["processing"]),
                ),
            )
            for r in await self.store.groupings(by)
        ]

    async def namespaces(self) -> Groupings:
        return Groupings("namespace", await self._groupings("namespace"))

    async def tasks(self) -> Groupings:
        return Groupings("task", await self._groupings("task"))

    # --- overview and status -----------------------------------------------------------------

    def _process(self) -> ProcessState:
        ops = self.ops
        return ProcessState(
            process_id=os.getpid(),
            uptime_s=round(time.time() - self.history.started_at, 1),
            active_partitions=ops.supervisor.active_partitions,
            database_up=ops.db_health.up,
            maintenance_mode=ops.maintenance.enabled,
            spool=ops.spool_state(),
            counters=_whole(self.figures.read().counters),
        )

    async def _pop_maintenance(self) -> bool:
        """The pop switch as last read (off without the consume side)."""
        try:
            return (await self.consume.pop_maintenance()).enabled
        except ConsumeUnavailable:
            return False

    async def standing(self) -> Standing:
        """This process from its own memory (no database read): what the dashboard shows
        while the database is away."""
        self.history.sample()
        ops = self.ops
        down = ops.db_health.down_since
        pop_maintenance = await self._pop_maintenance()
        return Standing(
            at=datetime.now(UTC),
            database_down_since=None if down is None else datetime.fromtimestamp(down, UTC),
            process=self._process(),
            push_maintenance=ops.maintenance.enabled,
            pop_maintenance=pop_maintenance,
            loops=ops.service_loops(),
            rates=self.history.latest_rates(),
        )

    async def overview(self) -> Overview:
        """``GET /api/v1/resources/overview``: every queue together, and this process."""
        self.history.sample()
        t = await self.store.totals()
        now = datetime.now(UTC)
        rates = self.history.latest_rates()
        pop_maintenance = await self._pop_maintenance()
        return Overview(
            queues=int(t["queues"]),
            partitions=int(t["partitions"]),
            namespaces=int(t["namespaces"]),
            tasks=int(t["tasks"]),
            consumer_groups=int(t["named_groups"]),
            messages=_counts(t),
            oldest_pending_at=t["oldest_pending_at"],
            oldest_pending_age_s=age_s(t["oldest_pending_at"], now),
            rates=rates,
            push_maintenance=self.ops.maintenance.enabled,
            pop_maintenance=pop_maintenance,
            process=self._process(),
            at=now,
            average_lag_s=self.history.average_lag_s(),
        )

    def _throughput(self, since: datetime) -> list[RatePoint]:
        self.history.sample()
        return self.history.series(since.timestamp())

    async def status(self, args: Mapping[str, Any]) -> Status:
        """``GET /api/v1/status``: the service's throughput over the window, totals, and the
        queues holding messages (one page; filters ``queue``, ``namespace``, ``task``)."""
        since, until = params.window(args, default=timedelta(hours=1))
        overview = await self.overview()
        queue = params.optional_name(args, "queue")
        listed = await self.queues({**args, "search": queue} if queue else args)
        active = [
            q for q in listed.queues if q.messages.total > 0 and (queue is None or q.name == queue)
        ]
        return Status(
            TimeRange(since, until),
            self._throughput(since),
            overview,
            active,
            self.history.step_s,
            self.figures.read().counters,
            await self._leases(),
            socket.gethostname(),
            await self._dead_letters(since, until, queue),
        )

    async def _dead_letters(
        self, since: datetime, until: datetime, queue: str | None
    ) -> DeadLetterSummary:
        r = await self.store.dead_letter_summary(since, until, queue)
        return DeadLetterSummary(
            partitions=int(r["partitions"]),
            top_errors=[(e["error"], int(e["count"])) for e in r["errors"]],
        )

    async def _leases(self) -> Leases:
        r = await self.store.live_leases()
        return Leases(
            active=int(r["active"]),
            partitions=int(r["partitions"]),
            messages=int(r["messages"]),
            acked=int(r["acked"]),
        )

    def _series(self, args: Mapping[str, Any]) -> ProcessSeries:
        since, until = params.window(args, default=timedelta(hours=1))
        return ProcessSeries(
            window=TimeRange(since, until),
            interval=args.get("interval") or "10s",
            process_id=os.getpid(),
            points=self._throughput(since),
            step_s=self.history.step_s,
            counters=self.figures.read().counters,
            hostname=socket.gethostname(),
        )

    async def analytics(self, args: Mapping[str, Any]) -> ProcessSeries:
        """``GET /api/v1/status/analytics`` and ``/analytics/worker-metrics``: this process's
        rates over the window (the points it kept: every 10 s for the last hour)."""
        return self._series(args)

    async def system_metrics(self, args: Mapping[str, Any]) -> ProcessSeries:
        """``GET /api/v1/analytics/system-metrics``: CPU and memory of this process over the
        window."""
        return self._series(args)

    async def worker_metrics(self, args: Mapping[str, Any]) -> ProcessSeries:
        """``GET /api/v1/analytics/worker-metrics``: the service's history over the window
        with its counter totals."""
        return self._series(args)

    async def queue_flow(
        self, args: Mapping[str, Any], *, popped_only: bool = False
    ) -> QueueFlowSeries:
        """``GET /api/v1/analytics/queue-lag`` (``popped_only``: the minutes with pops) and
        ``/queue-ops``: per queue and minute of the window (filter ``queue``), what this
        process stored, popped and had acknowledged, and how long the popped had waited."""
        since, until = params.window(args, default=timedelta(hours=1))
        queue = params.optional_name(args, "queue")
        flow = None if self._consume is None else self._consume.flow
        rows = [] if flow is None else flow.rows(since.timestamp(), until.timestamp(), queue)
        return QueueFlowSeries(
            TimeRange(since, until),
            [
                QueueLagPoint(
                    minute=datetime.fromtimestamp(minute, UTC),
                    queue=name,
                    pops=flow.pops,
                    average_lag_ms=round(1000 * flow.lag_sum_s / flow.pops, 1) if flow.pops else 0,
                    max_lag_ms=round(1000 * flow.lag_max_s, 1),
                    pushes=flow.pushes,
                    empty_pops=flow.empty_pops,
                    acks=flow.acks,
                    acks_refused=flow.acks_refused,
                )
                for minute, name, flow in rows
                if flow.pops or not popped_only
            ],
        )

    async def retention(self, args: Mapping[str, Any] | None = None) -> RetentionFigures:
        """``GET /api/v1/analytics/retention``: what retention removed, in total and per
        interval of the service's history over the window."""
        since, until = params.window(args or {}, default=timedelta(hours=1))
        counters = self.metrics.snapshot()
        try:
            totals = await self.ops.retention_totals()
        except ConsumeUnavailable:
            totals = {}
        return RetentionFigures(
            all_processes=totals,
            this_process={k: counters[k] for k in RETENTION_COUNTERS},
            interval_s=self.settings.retention_interval_s,
            window=TimeRange(since, until),
            points=self._throughput(since),
        )

    async def _database_detail(self, name: str, disk_reads: int, hits: int) -> DatabaseDetail:
        d = await self.store.postgres_detail()
        tables = [
            TableStats(
                schema=t["schema"],
                name=t["table"],
                heap_read=int(t["heap_read"]),
                heap_hit=int(t["heap_hit"]),
                live=int(t["live"]),
                dead=int(t["dead"]),
                updates=int(t["updates"]),
                hot_updates=int(t["hot_updates"]),
                last_vacuum=_time(t["last_vacuum"]),
                last_autovacuum=_time(t["last_autovacuum"]),
                autovacuum_count=int(t["autovacuum_count"]),
                autoanalyze_count=int(t["autoanalyze_count"]),
                total_bytes=int(t["total_bytes"]),
                table_bytes=int(t["table_bytes"]),
                index_bytes=int(t["index_bytes"]),
                total_size=t["total_size"],
                table_size=t["table_size"],
                index_size=t["index_size"],
            )
            for t in d["tables"]
        ]
        indexes = [
            IndexStats(i["schema"], i["table"], i["index"], int(i["read"]), int(i["hit"]))
            for i in d["indexes"]
        ]
        dead = sorted((t for t in tables if t.dead > 0), key=lambda t: -t.dead)
        return DatabaseDetail(
            name=name,
            disk_reads=disk_reads,
            cache_hits=hits,
            table_cache=sorted(tables, key=lambda t: -t.heap_read),
            index_cache=sorted(indexes, key=lambda i: -i.read)[:20],
            dead_tuples=dead[:15],
            hot_updates=sorted((t for t in tables if t.updates > 0), key=lambda t: -t.updates)[:15],
            autovacuum_due=[t for t in dead if t.dead > 1000][:10],
            table_sizes=sorted(tables, key=lambda t: -t.total_bytes)[:20],
            running=[
                RunningQuery(
                    pid=int(q["pid"]),
                    duration_s=float(q["duration"]),
                    state=q["state"],
                    query=q["query"] or "",
                    wait_event_type=q["wait_event_type"],
                    wait_event=q["wait_event"],
                )
                for q in d["active"]
            ][:10],
            shared_buffers_pages=str(d["shared_buffers"]),
            shared_buffers_size=d["shared_buffers_size"],
            tables_read=sum(t.heap_read for t in tables),
            tables_hit=sum(t.heap_hit for t in tables),
            indexes_read=sum(i.read for i in indexes),
            indexes_hit=sum(i.hit for i in indexes),
        )

    async def postgres(self) -> PostgresStats:
        r = await self.store.postgres()
        reads = int(r["blks_read"]) + int(r["blks_hit"])
        return PostgresStats(
            version=r["version"],
            database=self.database,
            database_bytes=int(r["database_bytes"]),
            connections=int(r["connections"]),
            active_connections=int(r["active"]),
            max_connections=int(r["max_connections"]),
            pool_size=self.settings.db_pool_size,
            committed=int(r["xact_commit"]),
            rolled_back=int(r["xact_rollback"]),
            cache_hit_ratio=round(int(r["blks_hit"]) / reads, 4) if reads else 1.0,
            deadlocks=int(r["deadlocks"]),
            rows_inserted=int(r["tup_inserted"]),
            rows_updated=int(r["tup_updated"]),
            rows_deleted=int(r["tup_deleted"]),
            tables=[TableSize(t["table"], int(t["bytes"]), int(t["rows"])) for t in r["tables"]],
            detail=await self._database_detail(r["name"], int(r["blks_read"]), int(r["blks_hit"])),
        )

    async def refresh(self) -> None:
        """``POST /api/v1/stats/refresh``: figures are live (read when asked); this takes a
        history sample now."""
        self.history.sample(force=True)

    def metrics_json(self) -> ProcessMetrics:
        """``GET /metrics`` with ``Accept: application/json``: the original's figures for this
        process."""
        self.history.sample()
        reading = self.figures.read()
        c = _whole(reading.counters)
        rates = self.history.latest_rates()
        gauges = self.ops.gauges()
        return ProcessMetrics(
            uptime_s=round(time.time() - self.history.started_at, 1),
            requests=int(c["push_requests"] + c["pop_requests"] + c["acks"]),
            items_queued=int(c["push_items_queued"]),
            ingested_per_s=rates.ingested_per_s,
            pool_size=self.settings.db_pool_size,
            pool_idle=int(gauges["db_pool_idle"]) if "db_pool_idle" in gauges else None,
            rss_bytes=reading.rss_bytes,
            cpu_s=round(reading.cpu_s, 3),
            cpu_user_us=int(reading.counters.get("cpu_user_microseconds", 0)),
            cpu_system_us=int(reading.counters.get("cpu_system_microseconds", 0)),
            process_id=os.getpid(),
            processes=reading.processes,
            counters=c,
        )

    # --- messages ----------------------------------------------------------------------------

    @staticmethod
    def _stored(r: Row, status: MessageStatus, lease_expires_at: datetime | None) -> StoredMessage:
        return StoredMessage(
            partition_id=int(r["partition_id"]),
            queue=r["queue_name"],
            partition=r["partition_name"],
            namespace=r["namespace"],
            task=r["task"],
            offset=int(r["msg_offset"]),
            message_id=str(r["message_id"]),
            transaction_id=r["transaction_id"],
            status=status,
            trace_id=None if r["trace_id"] is None else str(r["trace_id"]),
            producer_sub=r["producer_sub"],
            created_at=r["created_at"],
            lease_expires_at=lease_expires_at,
            consumed_by=r.get("consumed_by"),
            total_groups=r.get("total_groups"),
        )

    async def messages(self, args: Mapping[str, Any], *, queue: str | None = None) -> MessagePage:
        """``GET /api/v1/messages``: stored messages, newest first, one page (no payloads)."""
        page = params.page(args, default_limit=50)
        since, until = params.window(args, default=timedelta(days=7))
        queue = queue or params.optional_name(args, "queue")
        transaction_id = params.transaction_id(args)
        if transaction_id is not None:
            return await self._find(queue, transaction_id, page, since, until)
        rows = await self.store.messages(
            queue=queue,
            partition=params.optional_name(args, "partition"),
            namespace=params.optional_name(args, "namespace"),
            task=params.optional_name(args, "task"),
            status=params.status(args),
            since=since,
            until=until,
            limit=page.limit,
            offset=page.offset,
        )
        return MessagePage(
            [self._stored(r, r["status"], r["lease_expires_at"]) for r in rows],
            page,
            TimeRange(since, until),
        )

    async def _find(
        self, queue: str | None, transaction_id: str, page: Page, since: datetime, until: datetime
    ) -> MessagePage:
        """The messages of ``queue`` with ``transaction_id`` (one per partition holding one),
        whenever they were stored."""
        if queue is None:
            raise InvalidRequest("transactionId needs queue: the queue to look in")
        ids = await self.store.find_partitions(queue, transaction_id, page.offset + page.limit)
        found = []
        for partition_id in ids[page.offset :]:
            detail = await self.message(str(partition_id), transaction_id)
            if detail is not None:
                found.append(detail.message)
        return MessagePage(found, page, TimeRange(since, until))

    async def message(self, partition_id: str, transaction_id: str) -> MessageDetail | None:
        """``GET /api/v1/messages/{partitionId}/{transactionId}``, with the payload."""
        row = await self.store.message(params.partition_id(partition_id), transaction_id)
        if row is None:
            return None
        groups = [
            GroupView(g["name"], g["consumed"], g["leased"], _time(g["lease_expires_at"]))
            for g in row["groups"] or []
        ]
        dead_letters = [
            DeadLetterRecord(
                consumer_group=d["consumer_group"],
                error_message=d["error_message"],
                retry_count=d["retry_count"],
                failed_at=datetime.fromisoformat(d["failed_at"]),
            )
            for d in row["dlq"] or []
        ]
        queue_mode = next((g for g in groups if g.name == QUEUE_MODE), None)
        status: MessageStatus
        if dead_letters:
            status = "dead_letter"
        elif queue_mode and queue_mode.consumed:
            status = "completed"
        elif queue_mode and queue_mode.leased:
            status = "processing"
        else:
            status = "pending"
        return MessageDetail(
            message=self._stored(row, status, queue_mode.lease_expires_at if queue_mode else None),
            payload=decode_payload(row["payload"], str(row["message_id"]), self.ops.encryption),
            consumer_groups=groups,
            dead_letters=dead_letters,
            lease_time_s=row["lease_time_s"],
            retry_limit=row["retry_limit"],
            retry_delay_ms=row["retry_delay_ms"],
            ttl_s=row["ttl_s"],
            priority=row["priority"],
        )

    async def delete_message(self, partition_id: str, transaction_id: str) -> MessageDeletion:
        """``DELETE /api/v1/messages/{partitionId}/{transactionId}``."""
        checked = params.partition_id(partition_id)
        outcome = await self.store.delete_message(checked, transaction_id)
        found: DeletionOutcome = (
            "deleted" if outcome == "deleted" else "leased" if outcome == "leased" else "missing"
        )
        return MessageDeletion(checked, transaction_id, found)

    # --- gauges ------------------------------------------------------------------------------

    async def queue_gauges(self) -> QueueGauges:
        """The queues and groups Prometheus reads (depth, oldest pending age, DLQ depth,
        partitions; consumer-group lag), for at most ``MAX_GAUGE_QUEUES`` queues (name order).

        Read from the database for each scrape, never kept: with ``--workers N`` any worker
        answers, and a figure one kept would be older than what another worker has shown
        since. Scrapes of this process at the same time share one read that started after
        each of them arrived (:class:`FreshRead`), so a burst of them costs at most two."""
        return await self._gauges.read()

    async def _read_queue_gauges(self) -> QueueGauges:
        rows = await self.store.queues(limit=MAX_GAUGE_QUEUES, offset=0)
        groups = await self.store.groups(group=None, queue=None, limit=params.MAX_LIMIT, offset=0)
        now = datetime.now(UTC)
        return QueueGauges(
            [self._queue_summary(r, now) for r in rows], [standing(g, now) for g in groups]
        )


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


def check_name(value: str, what: str) -> str:
    """A name from a path, checked like every other name."""
    from queen.consume import requests

    checked = requests.name(value, what)
    if checked is None:  # pragma: no cover - required=True never returns None
        raise InvalidRequest(f"{what} is required")
    return checked

"""The admin and observability service: what the broker holds, where consumers stand, and
how this process is doing, as the answers of the admin API (the original broker's shapes).

It reads through :class:`queen.storage.admin.PgAdminStore` and the broker's own state (counters,
spool, switches); it writes nothing but single message deletions. Figures are computed when
asked, from offsets and cursors (see ``admin.sql``), so there is nothing to keep in step and
``POST /api/v1/stats/refresh`` only drops the cached gauges.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from queen.admin import params
from queen.admin.history import History
from queen.admin.payloads import decode_payload
from queen.consume.errors import ConsumeUnavailable, InvalidRequest
from queen.consume.policy import iso_utc
from queen.consume.service import ConsumeService
from queen.metrics import Metrics
from queen.operations import Operations
from queen.records import QUEUE_MODE
from queen.settings import Settings
from queen.storage.admin import PgAdminStore, Row
from queen.storage.retention import QueueHoldings

Json = dict[str, Any]
GAUGE_CACHE_S = 10.0
MAX_GAUGE_QUEUES = 1000


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else iso_utc(moment)


def age_s(moment: datetime | None, now: datetime) -> float:
    return 0.0 if moment is None else round(max(0.0, (now - moment).total_seconds()), 3)


def _counts(row: Row, dead_letter: int | None = None) -> Json:
    """Queue mode's message figures of a queue or partition row."""
    held, undone, processing = int(row["held"]), int(row["undone"]), int(row["processing"])
    return {
        "total": held,
        "pending": max(0, undone - processing),
        "processing": processing,
        "completed": max(0, held - undone),
        "failed": int(row.get("failed") or 0),
        "deadLetter": int(row["dead_letter"] if dead_letter is None else dead_letter),
    }


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
    ) -> None:
        """``database``: what the start-up line calls it; ``store`` and ``consume`` are None
        without PostgreSQL (the admin reads then raise :class:`ConsumeUnavailable`)."""
        self.settings = settings
        self.metrics = metrics
        self.ops = ops
        self.database = database
        self._store = store
        self._consume = consume
        self.history = history or History(metrics)
        self._gauges: tuple[float, dict[str, dict[str, float]]] | None = None

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

    def _queue_item(self, row: Row, now: datetime) -> Json:
        return {
            "id": str(row["id"]),
            "name": row["name"],
            "namespace": row["namespace"],
            "task": row["task"],
            "priority": row["priority"],
            "createdAt": iso(row["created_at"]),
            "partitions": int(row["partitions"]),
            "messages": _counts(row),
            "oldestPendingAt": iso(row["oldest_pending_at"]),
            "oldestPendingAgeSeconds": age_s(row["oldest_pending_at"], now),
            "lastMessageAt": iso(row["newest_at"]),
        }

    async def queues(self, args: Mapping[str, Any]) -> Json:
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
        return {
            "queues": [self._queue_item(r, now) for r in rows],
            "total": total,
            "pagination": {"limit": page.limit, "offset": page.offset, "total": total},
        }

    async def _partitions(self, queue: Row, args: Mapping[str, Any]) -> tuple[list[Json], Json]:
        page = params.page(args)
        rows = await self.store.partitions(int(queue["id"]), limit=page.limit, offset=page.offset)
        dlq = await self.store.dlq_by_partition(int(queue["id"]))
        now = datetime.now(UTC)
        partitions = []
        for r in rows:
            counts = _counts(r, dlq.get(int(r["partition_id"]), 0))
            partitions.append(
                {
                    "id": str(r["partition_id"]),
                    "name": r["name"],
                    "createdAt": iso(r["created_at"]),
                    "messages": counts,
                    "stats": counts,
                    "offsets": {
                        "low": int(r["low_offset"]),
                        "next": int(r["next_offset"]),
                        "cursor": int(r["cursor_offset"]),
                    },
                    "cursor": {"totalConsumed": counts["completed"]},
                    "leaseExpiresAt": iso(r["lease_expires_at"]),
                    "oldestPendingAt": iso(r["start_at"]),
                    "oldestPendingAgeSeconds": age_s(r["start_at"], now),
                    "lastActivity": iso(r["newest_at"]),
                    "oldestMessage": None,
                    "newestMessage": iso(r["newest_at"]),
                }
            )
        return partitions, {"limit": page.limit, "offset": page.offset}

    async def _queue_totals(self, name: str) -> Row | None:
        found = await self.store.queues(name=name, limit=1, offset=0)
        return found[0] if found else None

    async def queue_resources(self, name: str, args: Mapping[str, Any]) -> Json | None:
        """``GET /api/v1/resources/queues/{q}``: what the queue holds (segments, sidecar,
        options) and the original's shape: the queue, its partitions (one page) and totals."""
        holdings = await self.ops.queue_holdings(name)
        queue = await self.store.queue(name)
        if holdings is None or queue is None:
            return None
        partitions, pagination = await self._partitions(queue, args)
        totals_row = await self._queue_totals(name)
        totals = _counts(totals_row) if totals_row else None
        return {
            **_holdings(name, holdings),
            "id": str(queue["id"]),
            "name": name,
            "createdAt": iso(queue["created_at"]),
            "partitionCount": holdings.partitions,
            "partitions": partitions,
            "pagination": pagination,
            "totals": totals,
        }

    async def queue_status(self, name: str, args: Mapping[str, Any]) -> Json | None:
        """``GET /api/v1/status/queues/{q}``: configuration, partitions, totals, groups."""
        queue = await self.store.queue(name)
        if queue is None:
            return None
        partitions, pagination = await self._partitions(queue, args)
        totals_row = await self._queue_totals(name)
        totals = _counts(totals_row) if totals_row else None
        groups = await self.store.groups(group=None, queue=name, limit=params.MAX_LIMIT, offset=0)
        now = datetime.now(UTC)
        return {
            "queue": {
                "id": str(queue["id"]),
                "name": name,
                "namespace": queue["namespace"],
                "task": queue["task"],
                "priority": queue["priority"],
                "createdAt": iso(queue["created_at"]),
                "config": {
                    "leaseTime": queue["lease_time_s"],
                    "retryLimit": queue["retry_limit"],
                    "retryDelay": queue["retry_delay_ms"],
                    "ttl": queue["ttl_s"],
                    "maxQueueSize": queue["max_size"],
                    "deadLetterQueue": queue["dead_letter_queue"],
                    "dedupWindowSeconds": queue["dedup_window_seconds"],
                    "retentionSeconds": queue["retention_s"],
                    "completedRetentionSeconds": queue["completed_retention_s"],
                    "delayedProcessing": queue["delayed_processing_s"],
                    "windowBuffer": queue["window_buffer_s"],
                },
            },
            "partitions": partitions,
            "partitionCount": int(totals_row["partitions"]) if totals_row else 0,
            "pagination": pagination,
            "totals": totals,
            "messages": totals,
            "oldestPendingAt": iso(totals_row["oldest_pending_at"]) if totals_row else None,
            "oldestPendingAgeSeconds": age_s(totals_row["oldest_pending_at"], now)
            if totals_row
            else 0.0,
            "consumerGroups": [self._group_item(g, now) for g in groups],
        }

    async def _groupings(self, column: str, key: str) -> Json:
        rows = await self.store.groupings(column)
        items = [
            {
                key: r["key"],
                "queues": int(r["queues"]),
                "partitions": int(r["partitions"]),
                "messages": {
                    "total": int(r["held"]),
                    "pending": max(0, int(r["undone"]) - int(r["processing"])),
                    "processing": int(r["processing"]),
                },
            }
            for r in rows
        ]
        return {f"{key}s": items}

    async def namespaces(self) -> Json:
        return await self._groupings("namespace", "namespace")

    async def tasks(self) -> Json:
        return await self._groupings("task", "task")

    # --- overview and status -----------------------------------------------------------------

    def _process(self) -> Json:
        ops = self.ops
        spool = ops.spool.describe() if ops.spool is not None else None
        return {
            "processId": os.getpid(),
            "uptimeSeconds": round(time.time() - self.history.started_at, 1),
            "activePartitions": ops.supervisor.active_partitions,
            "databaseUp": ops.db_health.up,
            "maintenanceMode": ops.maintenance.enabled,
            "spool": spool,
            "counters": self.metrics.snapshot(),
        }

    async def overview(self) -> Json:
        """``GET /api/v1/resources/overview``: every queue together, and this process."""
        self.history.sample()
        t = await self.store.totals()
        now = datetime.now(UTC)
        rates = self.history.latest_rates()
        try:
            pop_maintenance = (await self.consume.pop_maintenance()).enabled
        except ConsumeUnavailable:
            pop_maintenance = False
        return {
            "queues": int(t["queues"]),
            "partitions": int(t["partitions"]),
            "namespaces": int(t["namespaces"]),
            "tasks": int(t["tasks"]),
            "consumerGroups": int(t["named_groups"]),
            "messages": _counts(t),
            "lag": {
                "time": {"max": age_s(t["oldest_pending_at"], now)},
                "offset": {"total": max(0, int(t["undone"]) - int(t["processing"]))},
            },
            "oldestPendingAt": iso(t["oldest_pending_at"]),
            "throughput": {
                "ingestedPerSecond": rates["ingestedPerSecond"],
                "processedPerSecond": rates["processedPerSecond"],
                "popPerSecond": rates["popPerSecond"],
            },
            "maintenance": {"push": self.ops.maintenance.enabled, "pop": pop_maintenance},
            "process": self._process(),
            "timestamp": iso(now),
        }

    def _throughput(self, since: datetime) -> list[Json]:
        self.history.sample()
        series = self.history.series(since.timestamp())
        for point in series:
            point["timestamp"] = iso(datetime.fromtimestamp(point.pop("at"), UTC))
        return series

    async def status(self, args: Mapping[str, Any]) -> Json:
        """``GET /api/v1/status``: throughput of this process over the window, and totals."""
        since, until = params.window(args, default=timedelta(hours=1))
        overview = await self.overview()
        return {
            "timeRange": {"from": iso(since), "to": iso(until)},
            "throughput": self._throughput(since),
            "queues": {"total": overview["queues"], "partitions": overview["partitions"]},
            "messages": overview["messages"],
            "leases": {"active": overview["messages"]["processing"]},
            "deadLetterQueue": {"total": overview["messages"]["deadLetter"]},
            "workers": [self._process()],
        }

    async def analytics(self, args: Mapping[str, Any]) -> Json:
        """``GET /api/v1/status/analytics`` and ``/analytics/worker-metrics``: this process's
        rates over the window (the points it kept: every 10 s for the last hour)."""
        since, until = params.window(args, default=timedelta(hours=1))
        series = self._throughput(since)
        return {
            "timeRange": {"from": iso(since), "to": iso(until)},
            "interval": args.get("interval") or "10s",
            "processId": os.getpid(),
            "pointCount": len(series),
            "throughput": series,
        }

    async def system_metrics(self, args: Mapping[str, Any]) -> Json:
        since, until = params.window(args, default=timedelta(hours=1))
        series = self._throughput(since)
        return {
            "timeRange": {"from": iso(since), "to": iso(until)},
            "processId": os.getpid(),
            "points": [
                {
                    "timestamp": p["timestamp"],
                    "cpuPercent": p["cpuPercent"],
                    "rssBytes": p["rssBytes"],
                }
                for p in series
            ],
        }

    async def queue_lag(self, args: Mapping[str, Any]) -> Json:
        """``GET /api/v1/analytics/queue-lag``: per (group, queue), messages behind and the age
        of the oldest of them, now."""
        page = params.page(args)
        rows = await self.store.groups(
            group=None,
            queue=params.optional_name(args, "queue"),
            limit=page.limit,
            offset=page.offset,
        )
        now = datetime.now(UTC)
        return {
            "lag": [self._group_item(r, now) for r in rows],
            "pagination": {"limit": page.limit, "offset": page.offset},
        }

    async def queue_ops(self, args: Mapping[str, Any]) -> Json:
        """``GET /api/v1/analytics/queue-ops``: per queue, depth and flow figures now."""
        listed = await self.queues(args)
        return {"queues": listed["queues"], "pagination": listed["pagination"]}

    async def retention(self) -> Json:
        counters = self.metrics.snapshot()
        try:
            totals = await self.ops.retention_totals()
        except ConsumeUnavailable:
            totals = {}
        return {
            "allProcesses": totals,
            "thisProcess": {
                k: counters[k]
                for k in (
                    "retention_passes",
                    "retention_segments_removed",
                    "retention_messages_removed",
                    "dedup_rows_pruned",
                )
            },
            "intervalSeconds": self.settings.retention_interval_s,
        }

    async def postgres(self) -> Json:
        r = await self.store.postgres()
        reads = int(r["blks_read"]) + int(r["blks_hit"])
        return {
            "version": r["version"],
            "database": self.database,
            "databaseBytes": int(r["database_bytes"]),
            "connections": {
                "total": int(r["connections"]),
                "active": int(r["active"]),
                "max": int(r["max_connections"]),
                "poolSize": self.settings.db_pool_size,
            },
            "transactions": {
                "committed": int(r["xact_commit"]),
                "rolledBack": int(r["xact_rollback"]),
            },
            "cacheHitRatio": round(int(r["blks_hit"]) / reads, 4) if reads else 1.0,
            "deadlocks": int(r["deadlocks"]),
            "rows": {
                "inserted": int(r["tup_inserted"]),
                "updated": int(r["tup_updated"]),
                "deleted": int(r["tup_deleted"]),
            },
            "tables": r["tables"],
        }

    async def refresh(self) -> Json:
        """``POST /api/v1/stats/refresh``: figures are live; this drops the gauge cache."""
        self._gauges = None
        self.history.sample(force=True)
        return {"success": True, "message": "statistics are computed when read; cache dropped"}

    def metrics_json(self) -> Json:
        """``GET /metrics`` with ``Accept: application/json``: the original's figures for this
        process."""
        self.history.sample()
        c = self.metrics.snapshot()
        rates = self.history.latest_rates()
        last = self.history.points[-1] if self.history.points else None
        return {
            "uptime": round(time.time() - self.history.started_at, 1),
            "requests": {"total": c["push_requests"] + c["pop_requests"] + c["acks"], "rate": 0},
            "messages": {"total": c["push_items_queued"], "rate": rates["ingestedPerSecond"]},
            "database": {
                "poolSize": self.settings.db_pool_size,
                "idleConnections": None,
                "waitingRequests": 0,
            },
            "memory": {"rss": last.rss_bytes if last else 0},
            "cpu": {"seconds": round(last.cpu_s, 3) if last else 0.0},
            "processId": os.getpid(),
            "counters": c,
        }

    # --- messages ----------------------------------------------------------------------------

    @staticmethod
    def _message_item(r: Row) -> Json:
        return {
            "id": str(r["message_id"]),
            "transactionId": r["transaction_id"],
            "partitionId": str(r["partition_id"]),
            "queuePath": f"{r['queue_name']}/{r['partition_name']}",
            "queue": r["queue_name"],
            "partition": r["partition_name"],
            "namespace": r["namespace"],
            "task": r["task"],
            "offset": int(r["msg_offset"]),
            "status": r["status"],
            "traceId": None if r["trace_id"] is None else str(r["trace_id"]),
            "producerSub": r["producer_sub"],
            "createdAt": iso(r["created_at"]),
            "leaseExpiresAt": iso(r["lease_expires_at"]),
        }

    async def messages(self, args: Mapping[str, Any], *, queue: str | None = None) -> Json:
        """``GET /api/v1/messages``: stored messages, newest first, one page (no payloads)."""
        page = params.page(args, default_limit=50)
        since, until = params.window(args, default=timedelta(days=7))
        rows = await self.store.messages(
            queue=queue or params.optional_name(args, "queue"),
            partition=params.optional_name(args, "partition"),
            namespace=params.optional_name(args, "namespace"),
            task=params.optional_name(args, "task"),
            status=params.status(args),
            since=since,
            until=until,
            limit=page.limit,
            offset=page.offset,
        )
        return {
            "messages": [self._message_item(r) for r in rows],
            "pagination": {"limit": page.limit, "offset": page.offset},
            "timeRange": {"from": iso(since), "to": iso(until)},
        }

    async def message(self, partition_id: str, transaction_id: str) -> Json | None:
        """``GET /api/v1/messages/{partitionId}/{transactionId}``, with the payload."""
        row = await self.store.message(params.partition_id(partition_id), transaction_id)
        if row is None:
            return None
        groups = row["groups"] or []
        queue_mode = next((g for g in groups if g["name"] == QUEUE_MODE), None)
        if row["dlq"]:
            status = "dead_letter"
        elif queue_mode and queue_mode["consumed"]:
            status = "completed"
        elif queue_mode and queue_mode["leased"]:
            status = "processing"
        else:
            status = "pending"
        latest_dlq = row["dlq"][0] if row["dlq"] else None
        shown = decode_payload(row["payload"], str(row["message_id"]), self.ops.encryption)
        return {
            "id": str(row["message_id"]),
            "transactionId": row["transaction_id"],
            "partitionId": str(row["partition_id"]),
            "queuePath": f"{row['queue_name']}/{row['partition_name']}",
            "queue": row["queue_name"],
            "partition": row["partition_name"],
            "namespace": row["namespace"],
            "task": row["task"],
            "offset": int(row["msg_offset"]),
            "status": status,
            "payload": shown.value,
            "isEncrypted": shown.encrypted,
            "payloadError": shown.error,
            "traceId": None if row["trace_id"] is None else str(row["trace_id"]),
            "producerSub": row["producer_sub"],
            "createdAt": iso(row["created_at"]),
            "errorMessage": latest_dlq["errorMessage"] if latest_dlq else None,
            "retryCount": latest_dlq["retryCount"] if latest_dlq else None,
            "leaseExpiresAt": queue_mode["leaseExpiresAt"] if queue_mode else None,
            "queueConfig": {
                "leaseTime": row["lease_time_s"],
                "retryLimit": row["retry_limit"],
                "retryDelay": row["retry_delay_ms"],
                "ttl": row["ttl_s"],
                "priority": row["priority"],
            },
            "consumerGroups": groups,
            "deadLetters": row["dlq"] or [],
        }

    async def delete_message(self, partition_id: str, transaction_id: str) -> tuple[int, Json]:
        """``DELETE /api/v1/messages/{partitionId}/{transactionId}``: (HTTP status, answer)."""
        outcome = await self.store.delete_message(params.partition_id(partition_id), transaction_id)
        answer: Json = {
            "success": outcome == "deleted",
            "partitionId": partition_id,
            "transactionId": transaction_id,
        }
        if outcome == "deleted":
            return 200, {**answer, "message": "Message deleted"}
        if outcome == "leased":
            return 409, {**answer, "error": "message is leased by a consumer; try again later"}
        return 404, {**answer, "error": "Message not found"}

    # --- consumer groups ---------------------------------------------------------------------

    @staticmethod
    def _group_item(r: Row, now: datetime) -> Json:
        return {
            "name": r["consumer_group"],
            "queueName": r["queue_name"],
            "topics": [r["queue_name"]],
            "members": int(r["leased"]),
            "partitions": int(r["partitions"]),
            "totalLag": int(r["lag"]),
            "maxTimeLag": age_s(r["oldest_at"], now),
            "oldestPendingAt": iso(r["oldest_at"]),
            "state": "Stable" if int(r["lag"]) == 0 else "Lagging",
            "lastConsumedAt": iso(r["last_delivered_at"]),
            "subscriptionMode": r["subscription_mode"],
            "subscriptionTimestamp": iso(r["subscribed_at"]),
            "subscriptionCreatedAt": iso(r["subscription_created_at"]),
        }

    async def groups(self, args: Mapping[str, Any]) -> list[Json]:
        """``GET /api/v1/consumer-groups``: one entry per (group, queue), one page (without a
        ``limit``, the most a page holds: the original answers every group, and its clients
        ask without one)."""
        page = params.page(args, default_limit=params.MAX_LIMIT)
        rows = await self.store.groups(
            group=None,
            queue=params.optional_name(args, "queue"),
            limit=page.limit,
            offset=page.offset,
        )
        now = datetime.now(UTC)
        return [self._group_item(r, now) for r in rows]

    async def group(self, name: str, args: Mapping[str, Any]) -> Json | None:
        """``GET /api/v1/consumer-groups/{g}``: per queue, the group's partitions (a page)."""
        page = params.page(args)
        rows = await self.store.groups(group=name, queue=None, limit=params.MAX_LIMIT, offset=0)
        if not rows:
            return None
        now = datetime.now(UTC)
        answer: Json = {}
        for r in rows:
            parts = await self.store.group_partitions(
                name, int(r["queue_id"]), limit=page.limit, offset=page.offset
            )
            answer[r["queue_name"]] = {
                **self._group_item(r, now),
                "partitions": [
                    {
                        "partition": p["partition_name"],
                        "partitionId": str(p["partition_id"]),
                        "offset": int(p["cursor_offset"]),
                        "nextOffset": int(p["next_offset"]),
                        "offsetLag": int(p["lag"]),
                        "timeLagSeconds": age_s(p["oldest_at"], now),
                        "leaseActive": p["lease_expires_at"] is not None,
                        "leaseExpiresAt": iso(p["lease_expires_at"]),
                        "lastConsumedAt": iso(p["delivered_at"]),
                    }
                    for p in parts
                ],
                "partitionCount": int(r["partitions"]),
            }
        return answer

    async def lagging(self, args: Mapping[str, Any]) -> list[Json]:
        """``GET /api/v1/consumer-groups/lagging?minLagSeconds=N``: (group, queue) pairs whose
        oldest unconsumed message is at least N seconds old."""
        threshold = params.min_lag_seconds(args)
        page = params.page(args)
        rows = await self.store.groups(group=None, queue=None, limit=params.MAX_LIMIT, offset=0)
        now = datetime.now(UTC)
        items = [self._group_item(r, now) for r in rows if int(r["lag"]) > 0]
        lagging = [i for i in items if i["maxTimeLag"] >= threshold]
        lagging.sort(key=lambda i: i["maxTimeLag"], reverse=True)
        return lagging[page.offset : page.offset + page.limit]

    # --- gauges ------------------------------------------------------------------------------

    async def queue_gauges(self) -> dict[str, dict[str, float]]:
        """Per queue: depth, oldest pending age, DLQ depth and consumer-group lag, for
        Prometheus. Computed at most every ``GAUGE_CACHE_S`` seconds, for at most
        ``MAX_GAUGE_QUEUES`` queues (name order)."""
        now_mono = time.monotonic()
        if self._gauges is not None and now_mono - self._gauges[0] < GAUGE_CACHE_S:
            return self._gauges[1]
        rows = await self.store.queues(limit=MAX_GAUGE_QUEUES, offset=0)
        groups = await self.store.groups(group=None, queue=None, limit=params.MAX_LIMIT, offset=0)
        now = datetime.now(UTC)
        gauges: dict[str, dict[str, float]] = {
            "queue_depth": {},
            "queue_oldest_pending_age_seconds": {},
            "queue_dlq_depth": {},
            "queue_partitions": {},
            "consumer_group_lag": {},
        }
        for r in rows:
            counts = _counts(r)
            name = str(r["name"])
            gauges["queue_depth"][name] = counts["pending"] + counts["processing"]
            gauges["queue_oldest_pending_age_seconds"][name] = age_s(r["oldest_pending_at"], now)
            gauges["queue_dlq_depth"][name] = counts["deadLetter"]
            gauges["queue_partitions"][name] = int(r["partitions"])
        for g in groups:
            gauges["consumer_group_lag"][f"{g['queue_name']}\x00{g['consumer_group']}"] = int(
                g["lag"]
            )
        self._gauges = (now_mono, gauges)
        return gauges


def check_name(value: str, what: str) -> str:
    """A name from a path, checked like every other name."""
    from queen.consume import requests

    checked = requests.name(value, what)
    if checked is None:  # pragma: no cover - required=True never returns None
        raise InvalidRequest(f"{what} is required")
    return checked


def _holdings(queue: str, held: QueueHoldings) -> Json:
    return {
        "queue": queue,
        "queueId": str(held.queue_id),
        "namespace": held.namespace,
        "task": held.task,
        "partitions": held.partitions,
        "segments": held.segments,
        "messages": held.messages,
        "sidecarEntries": held.sidecar_entries,
        "options": {
            "dedupWindowSeconds": held.dedup_window_seconds,
            "retentionEnabled": held.retention_enabled,
            "retentionSeconds": held.retention_seconds,
            "completedRetentionSeconds": held.completed_retention_seconds,
            "maxWaitTimeSeconds": held.max_wait_time_seconds,
        },
    }

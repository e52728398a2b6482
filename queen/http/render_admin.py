"""The JSON bodies of the admin API (and of ``GET /metrics`` as JSON): the typed answers of
:mod:`queen.admin` (one value per answer, from its subject's module) in, wire dicts out.

With :mod:`queen.http.render` (the consume side, /health), the only place that knows the
camelCase shapes of these answers: the official clients and the original's dashboard read
them, and so do this broker's dashboard templates, which get the dicts built here. Timestamps
are ISO-8601 UTC with milliseconds, but for the times a message's detail has always passed on
from the database's JSON (:func:`_database_time`); ids of partitions and queues are strings.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from queen.admin.actions import BulkRetry, MessageDeadLettered, MessageRetry, QueueCleared
from queen.admin.database import DatabaseDetail, PostgresStats
from queen.admin.figures import MessageCounts
from queen.admin.gauges import QueueGauges
from queen.admin.groups import (
    LAGGING_AFTER_S,
    GroupOnQueue,
    GroupPartition,
    GroupStanding,
    LaggingPartition,
)
from queen.admin.history import RatePoint, Rates
from queen.admin.messages import MessageDeletion, MessageDetail, MessagePage, StoredMessage
from queen.admin.params import Page, TimeRange
from queen.admin.queues import (
    Depth,
    Groupings,
    PartitionFigures,
    QueueFigures,
    QueuePage,
    QueueResources,
    QueueStatus,
    QueueSummary,
)
from queen.admin.system import (
    Overview,
    ProcessMetrics,
    ProcessSeries,
    ProcessState,
    QueueFlowSeries,
    RetentionFigures,
    Standing,
    Status,
)
from queen.consume.policy import iso_utc
from queen.http.render import loop_status, spool_state

Json = dict[str, Any]

# --- shared parts ------------------------------------------------------------------------------


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else iso_utc(moment)


def _database_time(moment: datetime | None) -> str | None:
    """A time as PostgreSQL writes a ``timestamptz`` into JSON: microseconds without their
    trailing zeros, and the offset (``2026-04-26T10:59:28.26712+00:00``)."""
    if moment is None:
        return None
    text = moment.replace(microsecond=0).isoformat()
    if not moment.microsecond:
        return text
    return f"{text[:19]}.{moment.microsecond:06d}".rstrip("0") + text[19:]


def _started(p: RatePoint) -> str | None:
    """When the interval of a history point began: the original labels each bucket by its
    start, and its dashboard drops a bucket whose start is less than one bucket old as still
    aggregating (labelled by its end, every newest interval would be dropped)."""
    return _iso(p.at - timedelta(seconds=p.span_s))


def _page(page: Page) -> Json:
    return {"limit": page.limit, "offset": page.offset}


def _window(window: TimeRange) -> Json:
    return {"from": _iso(window.since), "to": _iso(window.until)}


def _counts(c: MessageCounts, *, leased_pending: bool = False) -> Json:
    """``leased_pending``: ``pending`` counts the messages inside a live lease too, as the
    original's partitions, its queue totals and ``/status/queues`` do (its
    ``/resources/queues``, namespaces and tasks do not)."""
    return {
        "total": c.total,
        "pending": c.pending + c.processing if leased_pending else c.pending,
        "processing": c.processing,
        "completed": c.completed,
        "failed": c.failed,
        "deadLetter": c.dead_letter,
    }


def _depth(d: Depth) -> Json:
    return {"total": d.total, "pending": d.pending, "processing": d.processing}


def _point(p: RatePoint) -> Json:
    """One interval of this process's history."""
    return {
        "seconds": p.span_s,
        "ingestedPerSecond": p.rates.ingested_per_s,
        "popPerSecond": p.rates.pop_per_s,
        "processedPerSecond": p.rates.processed_per_s,
        "deadLetterPerSecond": p.dead_letter_per_s,
        "pushRequestsPerSecond": p.push_requests_per_s,
        "ingested": p.ingested,
        "processed": p.processed,
        "cpuPercent": p.cpu_percent,
        "rssBytes": p.rss_bytes,
        "timestamp": _started(p),
    }


def _lag_point(p: RatePoint) -> Json:
    """The original's keys of a point of ``/status`` and ``/analytics/worker-metrics``: flow,
    errors and process figures of the interval. The original's event loop, thread pool and
    per-interval pool figures have no counterpart here: event loop lags are 0, the pool's
    and the interval's longest wait are null."""
    d = p.deltas
    acks, refused = d.get("acks", 0), d.get("acks_refused", 0)
    return {
        "popMessages": p.popped,
        "avgLagMs": p.average_lag_ms,
        "maxLagMs": None,
        "lagCount": p.popped,
        "pushMessages": p.ingested,
        "ackMessages": acks,
        "pushRequests": d.get("push_requests", 0),
        "popRequests": d.get("pop_requests", 0),
        "ackRequests": d.get("ack_requests", 0),
        "popEmpty": d.get("pop_empty", 0),
        "transactions": d.get("transactions", 0),
        "pushPerSecond": p.rates.ingested_per_s,
        "ackPerSecond": p.rates.processed_per_s,
        "dbErrors": d.get("push_transaction_failures", 0),
        "ackSuccess": acks - refused,
        "ackFailed": refused,
        "dlqCount": d.get("acks_dlq", 0),
        "avgEventLoopLagMs": 0,
        "maxEventLoopLagMs": 0,
        "avgFreeSlots": None,
        "minFreeSlots": None,
        "dbConnections": None,
        "avgJobQueueSize": 0,
        "maxJobQueueSize": 0,
        "backoffSize": 0,
        "jobsDone": 0,
        "queenCpuUserPct": p.cpu_user_percent,
        "queenCpuSysPct": p.cpu_system_percent,
        "queenRssMb": round(p.rss_bytes / 2**20, 1),
        "dbPoolActive": p.pool_active,
        "dbPoolIdle": None if p.pool_size is None else p.pool_size - (p.pool_active or 0),
        "dbPoolSize": p.pool_size,
    }


# --- queues ------------------------------------------------------------------------------------


def _queue(q: QueueSummary, *, leased_pending: bool = False) -> Json:
    return {
        "id": str(q.id),
        "name": q.name,
        "namespace": q.namespace,
        "task": q.task,
        "priority": q.priority,
        "createdAt": _iso(q.created_at),
        "partitions": q.partitions,
        "messages": _counts(q.messages, leased_pending=leased_pending),
        "oldestPendingAt": _iso(q.oldest_pending_at),
        "oldestPendingAgeSeconds": q.oldest_pending_age_s,
        "lastMessageAt": _iso(q.last_message_at),
    }


def _queue_pagination(page: QueuePage) -> Json:
    return {**_page(page.page), "total": page.total}


def queue_page(page: QueuePage, *, leased_pending: bool = False) -> Json:
    """``GET /api/v1/resources/queues`` and ``/status/queues`` (``leased_pending``: its
    ``pending`` counts leased messages too, as the original's)."""
    return {
        "queues": [_queue(q, leased_pending=leased_pending) for q in page.queues],
        "total": page.total,
        "pagination": _queue_pagination(page),
    }


def queue_lag(s: QueueFlowSeries) -> list[Json]:
    """``GET /api/v1/analytics/queue-lag``: per queue and minute (newest first), messages
    popped and how long they had waited."""
    return [
        {
            "bucketTime": _iso(p.minute),
            "queueName": p.queue,
            "popCount": p.pops,
            "avgLagMs": p.average_lag_ms,
            "maxLagMs": p.max_lag_ms,
        }
        for p in sorted(s.points, key=lambda p: (-p.minute.timestamp(), p.queue))
    ]


def queue_ops(s: QueueFlowSeries) -> Json:
    """``GET /api/v1/analytics/queue-ops``: per queue and minute (oldest first), what this
    process stored, popped and had acknowledged there; request, transaction, partition and
    parked counts are not kept per queue here and are null."""
    series = [
        {
            "bucket": _iso(p.minute),
            "queueName": p.queue,
            "pushMessages": p.pushes,
            "popMessages": p.pops,
            "popEmpty": p.empty_pops,
            "ackSuccess": p.acks - p.acks_refused,
            "ackFailed": p.acks_refused,
            "avgLagMs": p.average_lag_ms,
            "maxLagMs": p.max_lag_ms,
            "pushPerSecond": round(p.pushes / 60, 2),
            "popPerSecond": round(p.pops / 60, 2),
            "ackPerSecond": round(p.acks / 60, 2),
            "emptyPerSecond": round(p.empty_pops / 60, 2),
            **dict.fromkeys(UNKEPT_QUEUE_OPS),
        }
        for p in s.points
    ]
    return {
        "timeRange": _window(s.window),
        "bucketMinutes": 1,
        "series": series,
        "queues": sorted({p.queue for p in s.points}),
    }


UNKEPT_QUEUE_OPS = (
    "pushRequests",
    "ackRequests",
    "transactions",
    "partitionsCreated",
    "partitionsDeleted",
    "partitionCount",
    "parkedCount",
)


def parked_replicas(s: QueueFlowSeries) -> Json:
    """``GET /api/v1/analytics/queue-parked-replicas``: long polls are not counted per queue
    and replica here, so the series is empty."""
    return {"timeRange": _window(s.window), "bucketMinutes": 1, "series": [], "replicas": []}


def _partition(p: PartitionFigures) -> Json:
    counts = _counts(p.messages, leased_pending=True)
    return {
        "id": str(p.id),
        "name": p.name,
        "createdAt": _iso(p.created_at),
        "messages": counts,
        "stats": counts,
        "offsets": {"low": p.low_offset, "next": p.next_offset, "cursor": p.cursor_offset},
        # batches are not counted here
        "cursor": {"totalConsumed": p.messages.completed, "batchesConsumed": None},
        "leaseExpiresAt": _iso(p.lease_expires_at),
        "oldestPendingAt": _iso(p.oldest_pending_at),
        "oldestPendingAgeSeconds": p.oldest_pending_age_s,
        "lastActivity": _iso(p.newest_at),
        "oldestMessage": _iso(p.oldest_pending_at),  # the original's: its oldest pending
        "newestMessage": _iso(p.newest_at),
    }


def _partitions(f: QueueFigures) -> list[Json]:
    return [_partition(p) for p in f.partitions]


def _totals(f: QueueFigures) -> Json | None:
    """The queue's counts, and the same under ``messages`` (the original's detail has both)."""
    if f.summary is None:
        return None
    counts = _counts(f.summary.messages, leased_pending=True)
    return counts | {"messages": dict(counts)}


def queue_resources(r: QueueResources) -> Json:
    """``GET /api/v1/resources/queues/{q}``: what the queue holds, then the original's shape
    (``partitions``, first the holdings' count, is the page of partitions)."""
    f, held = r.figures, r.holdings
    return {
        "queue": f.queue.name,
        "queueId": str(held.queue_id),
        "namespace": held.namespace,
        "task": held.task,
        "partitions": _partitions(f),
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
        "id": str(f.queue.id),
        "name": f.queue.name,
        "createdAt": _iso(f.queue.created_at),
        "partitionCount": held.partitions,
        "pagination": _page(f.page),
        "totals": _totals(f),
    }


def queue_status(s: QueueStatus) -> Json:
    """``GET /api/v1/status/queues/{q}``."""
    f = s.figures
    q, o = f.queue, f.queue.options
    totals = _totals(f)
    return {
        "queue": {
            "id": str(q.id),
            "name": q.name,
            "namespace": q.namespace,
            "task": q.task,
            "priority": o.priority,
            "createdAt": _iso(q.created_at),
            "config": {
                "leaseTime": o.lease_time_s,
                "retryLimit": o.retry_limit,
                "retryDelay": o.retry_delay_ms,
                "ttl": o.ttl_s,
                "maxQueueSize": o.max_size,
                "deadLetterQueue": o.dead_letter_queue,
                "dedupWindowSeconds": o.dedup_window_s,
                "retentionSeconds": o.retention_s,
                "completedRetentionSeconds": o.completed_retention_s,
                "delayedProcessing": o.delayed_processing_s,
                "windowBuffer": o.window_buffer_s,
            },
        },
        "partitions": _partitions(f),
        "partitionCount": f.summary.partitions if f.summary else 0,
        "pagination": _page(f.page),
        "totals": totals,
        "messages": None if f.summary is None else _counts(f.summary.messages, leased_pending=True),
        "oldestPendingAt": _iso(f.summary.oldest_pending_at) if f.summary else None,
        "oldestPendingAgeSeconds": f.summary.oldest_pending_age_s if f.summary else 0.0,
        "consumerGroups": group_standings(s.consumer_groups),
    }


def groupings(g: Groupings) -> Json:
    """``GET /api/v1/resources/namespaces`` (``{"namespaces": [{"namespace": ...}]}``) and
    ``/tasks`` (the same with ``task``)."""
    return {
        f"{g.by}s": [
            {
                g.by: i.key,
                "queues": i.queues,
                "partitions": i.partitions,
                "messages": _depth(i.messages),
            }
            for i in g.items
        ]
    }


Labels = tuple[tuple[str, str], ...]


def queue_gauges(g: QueueGauges) -> dict[str, dict[Labels, float]]:
    """The labelled Prometheus families of ``/metrics``: per queue and per (queue, group)."""
    by_queue: dict[str, dict[Labels, float]] = {
        "queue_depth": {},
        "queue_oldest_pending_age_seconds": {},
        "queue_dlq_depth": {},
        "queue_partitions": {},
    }
    for q in g.queues:
        label = (("queue", q.name),)
        by_queue["queue_depth"][label] = q.messages.depth
        by_queue["queue_oldest_pending_age_seconds"][label] = q.oldest_pending_age_s
        by_queue["queue_dlq_depth"][label] = q.messages.dead_letter
        by_queue["queue_partitions"][label] = q.partitions
    lag: dict[Labels, float] = {
        (("queue", s.queue), ("consumer_group", s.name)): s.lag for s in g.groups
    }
    # the original broker's names for the dead letter figures
    dlq_total: dict[Labels, float] = {
        (("scope", "cluster"),): sum(q.messages.dead_letter for q in g.queues)
    }
    by_queue_dlq: dict[Labels, float] = {
        (("queue", q.name),): q.messages.dead_letter for q in g.queues
    }
    return {
        **by_queue,
        "consumer_group_lag": lag,
        "dlq_depth": dlq_total,
        "dlq_depth_by_queue": by_queue_dlq,
    }


QUEUE_GAUGE_HELP = {
    "queue_depth": "Messages of the queue not yet completed (per partition, by its consumer "
    "furthest behind).",
    "queue_oldest_pending_age_seconds": "Age of the queue's oldest pending message, in seconds.",
    "queue_dlq_depth": "Messages of the queue in the dead letter queue.",
    "queue_partitions": "Partitions of the queue.",
    "consumer_group_lag": "Messages a consumer group has not yet completed on a queue.",
    "dlq_depth": "Messages currently sitting in the dead-letter queue.",
    "dlq_depth_by_queue": "Messages in DLQ per queue.",
}


# --- this process and the whole broker ---------------------------------------------------------


def process(p: ProcessState) -> Json:
    """This process, as the overview and ``GET /api/v1/status`` (``workers``) show it."""
    return {
        "processId": p.process_id,
        "uptimeSeconds": p.uptime_s,
        "activePartitions": p.active_partitions,
        "databaseUp": p.database_up,
        "maintenanceMode": p.maintenance_mode,
        "spool": spool_state(p.spool) if p.spool is not None else None,
        "counters": p.counters,
    }


def _rates(r: Rates) -> Json:
    return {
        "ingestedPerSecond": r.ingested_per_s,
        "processedPerSecond": r.processed_per_s,
        "popPerSecond": r.pop_per_s,
    }


def standing(s: Standing) -> Json:
    """What this process knows without the database (the dashboard's outage view)."""
    return {
        "timestamp": _iso(s.at),
        "databaseDownSince": _iso(s.database_down_since),
        "throughput": _rates(s.rates),
        "maintenance": {"push": s.push_maintenance, "pop": s.pop_maintenance},
        "loops": {name: loop_status(status) for name, status in s.loops.items()},
        "process": process(s.process),
    }


def overview(o: Overview) -> Json:
    """``GET /api/v1/resources/overview``."""
    return {
        "queues": o.queues,
        "partitions": o.partitions,
        "namespaces": o.namespaces,
        "tasks": o.tasks,
        "consumerGroups": o.consumer_groups,
        "messages": _counts(o.messages),
        "lag": {
            # avg: how long messages popped lately had waited; max: the oldest pending's age;
            # the original's median and min, and its per-partition offset figures, are not
            # computed here (null)
            "time": {
                "avg": o.average_lag_s,
                "max": o.oldest_pending_age_s,
                "median": None,
                "min": None,
            },
            "offset": {
                "total": o.messages.pending,
                "avg": None,
                "median": None,
                "min": None,
                "max": None,
            },
        },
        "oldestPendingAt": _iso(o.oldest_pending_at),
        "throughput": _rates(o.rates),
        "maintenance": {"push": o.push_maintenance, "pop": o.pop_maintenance},
        "process": process(o.process),
        "timestamp": _iso(o.at),
        "statsAge": 0,  # the figures are read when asked, never from a cache
    }


def _per(part: float, whole: float) -> float:
    return round(part / whole, 2) if whole else 0


def status(s: Status) -> Json:
    """``GET /api/v1/status``, in the original's shape: ``queues`` is the list of queues
    holding messages; ``totals`` counts every queue and partition."""
    o = s.overview
    c = s.counters
    requests = {"push": c["push_requests"], "pop": c["pop_requests"], "ack": c["ack_requests"]}
    return {
        "timeRange": _window(s.window),
        "bucketMinutes": round(s.step_s / 60, 3),
        "pointCount": len(s.throughput),
        # newest first, as the original answers (and its dashboard reverses)
        "throughput": [_point(p) | _lag_point(p) for p in reversed(s.throughput)],
        "queues": [
            {
                "id": str(q.id),
                "name": q.name,
                "namespace": q.namespace,
                "task": q.task,
                "partitions": q.partitions,
                "totalConsumed": q.messages.completed,
            }
            for q in s.queues
        ],
        "totals": {"queues": o.queues, "partitions": o.partitions},
        # the service's counters since it started, as the original's (its totals of every
        # worker): stored, not yet popped, acknowledged, refused, dead-lettered
        "messages": {
            "total": int(c["push_items_queued"]),
            "pending": max(0, int(c["push_items_queued"] - c["pop_messages"])),
            "processing": 0,
            "completed": max(0, int(c["acks"] - c["acks_refused"])),
            "failed": int(c["acks_refused"]),
            "deadLetter": int(c["acks_dlq"]),
            "requests": requests,
            "batchEfficiency": {
                "push": _per(c["push_items_queued"], requests["push"]),
                "pop": _per(c["pop_messages"], requests["pop"]),
                "ack": _per(c["acks"], requests["ack"]),
            },
        },
        # every group's live leases, as the original counts them
        "leases": {
            "active": s.leases.active,
            "partitionsWithLeases": s.leases.partitions,
            "totalBatchSize": s.leases.messages,
            "totalAcked": s.leases.acked,
            "processingMessages": o.messages.processing,
        },
        "deadLetterQueue": {
            "total": o.messages.dead_letter,
            "totalMessages": o.messages.dead_letter,
            # of the window: the partitions its dead letters came from, its commonest errors
            "affectedPartitions": s.dead_letters.partitions,
            "topErrors": [{"error": e, "count": n} for e, n in s.dead_letters.top_errors],
        },
        "errors": {
            "dbErrors": c["push_transaction_failures"],
            "ackFailed": c["acks_refused"],
            "dlqMessages": c["acks_dlq"],
        },
        "workers": [
            process(o.process) | _worker(s.hostname, o.process.process_id, s.throughput, c)
        ],
        "statsAge": 0,  # the figures are read when asked, never from a cache
    }


def analytics(s: ProcessSeries) -> Json:
    """``GET /api/v1/status/analytics`` (and the first keys of ``/analytics/worker-metrics``):
    the original's ``dataPoints`` (the messages stored per ``interval``), then the history's
    buckets."""
    return {
        "dataPoints": [{"timestamp": _iso(at), "messages": n} for at, n in s.stored],
        "interval": s.interval,
        "from": _iso(s.window.since),
        "to": _iso(s.window.until),
        "timeRange": _window(s.window),
        "processId": s.process_id,
        "pointCount": len(s.points),
        "throughput": [_point(p) for p in s.points],
    }


def _worker(hostname: str, pid: int, points: list[RatePoint], c: dict[str, float]) -> Json:
    """This process as the original's one worker: its pool at the newest point (free slots:
    idle connections); no event loop or job queue is measured here (0)."""
    newest = points[-1] if points else None
    size = newest.pool_size if newest else None
    active = newest.pool_active if newest else None
    return {
        "hostname": hostname,
        "workerId": pid,
        "avgEventLoopLagMs": 0,
        "maxEventLoopLagMs": 0,
        "freeSlots": None if size is None else size - (active or 0),
        "dbConnections": size,
        "jobQueueSize": 0,
        "backoffSize": 0,
        "messagesProcessed": int(c.get("acks", 0)),
        "lastSeen": _iso(newest.at) if newest else None,
    }


def worker_metrics(s: ProcessSeries) -> Json:
    """``GET /api/v1/analytics/worker-metrics``: the original's ``timeSeries`` (newest first,
    as the original answers), this process as its one worker, and the service's totals;
    ``throughput`` (oldest first) is kept beside them."""
    c = s.counters

    def total(name: str) -> int:
        return int(c.get(name, 0))

    return {
        **analytics(s),
        "bucketMinutes": round(s.step_s / 60, 3),
        "timeSeries": [_point(p) | _lag_point(p) for p in reversed(s.points)],
        "workers": [_worker(s.hostname, s.process_id, s.points, c)],
        "queues": [],
        "summary": {
            "totalPushMessages": total("push_items_queued"),
            "totalPopMessages": total("pop_messages"),
            "totalAckMessages": total("acks"),
            "totalPushRequests": total("push_requests"),
            "totalPopRequests": total("pop_requests"),
            "totalAckRequests": total("ack_requests"),
            "totalDbErrors": total("push_transaction_failures"),
            "totalAckFailed": total("acks_refused"),
            "totalDlq": total("acks_dlq"),
            "pendingMessages": total("push_items_queued") - total("pop_messages"),
        },
    }


def _gauge(value: float | None) -> Json:
    """One figure of an interval in the original's aggregate shape: one reading per interval
    here, so avg, min, max and last are that reading."""
    return dict.fromkeys(("avg", "min", "max", "last"), value)


def _system_point(p: RatePoint) -> Json:
    """An interval in the original's ``metrics`` shape. CPU is in hundredths of a percent of
    one core (as the original's ``user_us``); this broker has no thread pools, so theirs are
    0."""
    idle = None if p.pool_size is None else p.pool_size - (p.pool_active or 0)
    no_pool = {"pool_size": _gauge(0), "queue_size": _gauge(0)}
    return {
        "timestamp": _started(p),
        "sampleCount": 1,
        "metrics": {
            "cpu": {
                "user_us": _gauge(round(p.cpu_user_percent * 100)),
                "system_us": _gauge(round(p.cpu_system_percent * 100)),
            },
            "memory": {"rss_bytes": _gauge(p.rss_bytes), "virtual_bytes": _gauge(p.virtual_bytes)},
            "database": {
                "pool_size": _gauge(p.pool_size),
                "pool_idle": _gauge(idle),
                "pool_active": _gauge(p.pool_active),
            },
            "threadpool": {"db": no_pool, "system": no_pool},
        },
    }


def system_metrics(s: ProcessSeries) -> Json:
    """``GET /api/v1/analytics/system-metrics``: this process as the original's one replica
    (its intervals oldest first), then ours: CPU and memory per point."""
    return {
        "timeRange": _window(s.window),
        "bucketMinutes": round(s.step_s / 60, 3),
        "pointCount": len(s.points),
        "replicaCount": 1,
        "replicas": [
            {
                "hostname": s.hostname,
                "port": None,
                "workerId": s.process_id,
                "timeSeries": [_system_point(p) for p in s.points],
            }
        ],
        "processId": s.process_id,
        "points": [
            {"timestamp": _started(p), "cpuPercent": p.cpu_percent, "rssBytes": p.rss_bytes}
            for p in s.points
        ],
    }


def _removed(p: RatePoint) -> Json:
    """What one interval of the history removed, in the original's keys: retention is not
    told apart by message status here (``completedRetentionMsgs`` is 0)."""
    d = p.deltas
    kept = d.get("retention_messages_removed", 0)
    evicted = d.get("eviction_messages_removed", 0)
    return {
        "bucket": _started(p),
        "retentionMsgs": kept,
        "completedRetentionMsgs": 0,
        "evictionMsgs": evicted,
        "totalMsgs": kept + evicted,
        "eventCount": d.get("retention_passes", 0),
    }


def retention(r: RetentionFigures) -> Json:
    """``GET /api/v1/analytics/retention``: the original's ``series`` (the history's intervals
    that removed something, oldest first) and ``totals`` over the window, then ours."""
    series = [row for row in map(_removed, r.points) if row["totalMsgs"]]
    keys = ("retentionMsgs", "completedRetentionMsgs", "evictionMsgs", "totalMsgs", "eventCount")
    return {
        "timeRange": _window(r.window) if r.window else None,
        "bucketMinutes": round(r.points[0].span_s / 60, 3) if r.points else 1,
        "series": series,
        "totals": {key: sum(row[key] for row in series) for key in keys},
        "allProcesses": r.all_processes,
        "thisProcess": r.this_process,
        "intervalSeconds": r.interval_s,
    }


def postgres(p: PostgresStats) -> Json:
    """``GET /api/v1/analytics/postgres-stats``."""
    ours = {
        "version": p.version,
        "database": p.database,
        "databaseBytes": p.database_bytes,
        "connections": {
            "total": p.connections,
            "active": p.active_connections,
            "max": p.max_connections,
            "poolSize": p.pool_size,
        },
        "transactions": {"committed": p.committed, "rolledBack": p.rolled_back},
        "cacheHitRatio": p.cache_hit_ratio,
        "deadlocks": p.deadlocks,
        "rows": {
            "inserted": p.rows_inserted,
            "updated": p.rows_updated,
            "deleted": p.rows_deleted,
        },
        "tables": [{"rows": t.rows, "bytes": t.bytes, "table": t.name} for t in p.tables],
    }
    return ours if p.detail is None else ours | _database_detail(p.detail)


def _percent(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 2) if whole else None


def _utc_seconds(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _database_detail(d: DatabaseDetail) -> Json:
    """The original's keys of ``/analytics/postgres-stats``; ratios in percent (null before
    any block was read). ``bufferUsage`` needs the pg_buffercache extension, which the broker
    does not install: it is empty."""
    return {
        "timestamp": iso_utc(datetime.now(UTC)),
        "databaseCache": {
            "database": d.name,
            "diskReads": d.disk_reads,
            "cacheHits": d.cache_hits,
            "cacheHitRatio": _percent(d.cache_hits, d.cache_hits + d.disk_reads),
        },
        "tableCache": [
            {
                "schema": t.schema,
                "table": t.name,
                "diskReads": t.heap_read,
                "cacheHits": t.heap_hit,
                "cacheHitRatio": _percent(t.heap_hit, t.heap_hit + t.heap_read),
            }
            for t in d.table_cache
        ],
        "indexCache": [
            {
                "schema": i.schema,
                "table": i.table,
                "index": i.name,
                "diskReads": i.read,
                "cacheHits": i.hit,
                "cacheHitRatio": _percent(i.hit, i.hit + i.read),
            }
            for i in d.index_cache
        ],
        "cacheSummary": {
            "tables": {
                "diskReads": d.tables_read,
                "cacheHits": d.tables_hit,
                "hitRatio": _percent(d.tables_hit, d.tables_hit + d.tables_read),
            },
            "indexes": {
                "diskReads": d.indexes_read,
                "cacheHits": d.indexes_hit,
                "hitRatio": _percent(d.indexes_hit, d.indexes_hit + d.indexes_read),
            },
        },
        "deadTuples": [
            {
                "schema": t.schema,
                "table": t.name,
                "deadTuples": t.dead,
                "liveTuples": t.live,
                "deadPercentage": _percent(t.dead, t.live),
                "lastVacuum": _utc_seconds(t.last_vacuum),
                "lastAutovacuum": _utc_seconds(t.last_autovacuum),
            }
            for t in d.dead_tuples
        ],
        "hotUpdates": [
            {
                "schema": t.schema,
                "table": t.name,
                "totalUpdates": t.updates,
                "hotUpdates": t.hot_updates,
                "hotUpdatePercentage": _percent(t.hot_updates, t.updates),
            }
            for t in d.hot_updates
        ],
        "activeQueries": [
            {
                "pid": q.pid,
                "duration": q.duration_s,
                "state": q.state,
                "query": q.query,
                "waitEventType": q.wait_event_type,
                "waitEvent": q.wait_event,
            }
            for q in d.running
        ],
        "autovacuumStatus": [
            {
                "table": t.name,
                "lastAutovacuum": _utc_seconds(t.last_autovacuum),
                "deadTuples": t.dead,
                "autovacuumCount": t.autovacuum_count,
                "autoanalyzeCount": t.autoanalyze_count,
            }
            for t in d.autovacuum_due
        ],
        "bufferConfig": {
            "sharedBuffers": d.shared_buffers_pages,
            "sharedBuffersSize": d.shared_buffers_size,
        },
        "bufferUsage": [],
        "tableSizes": [
            {
                "table": t.name,
                "totalSize": t.total_size,
                "totalSizeBytes": t.total_bytes,
                "tableSize": t.table_size,
                "tableSizeBytes": t.table_bytes,
                "indexSize": t.index_size,
                "indexSizeBytes": t.index_bytes,
            }
            for t in d.table_sizes
        ],
    }


def refreshed() -> Json:
    """``POST /api/v1/stats/refresh``."""
    return {"success": True, "message": "statistics are computed when read; cache dropped"}


def metrics(m: ProcessMetrics) -> Json:
    """``GET /metrics`` with ``Accept: application/json``."""
    return {
        "uptime": m.uptime_s,
        "requests": {"total": m.requests, "rate": 0},
        "messages": {"total": m.items_queued, "rate": m.ingested_per_s},
        "database": {
            "poolSize": m.pool_size,
            "idleConnections": m.pool_idle,
            "waitingRequests": 0,
        },
        "memory": {
            "rss": m.rss_bytes,
            # the original's Node-era keys, which a Python process has no meaning for
            "heapTotal": 0,
            "heapUsed": 0,
            "external": 0,
            "arrayBuffers": 0,
        },
        "cpu": {"user": m.cpu_user_us, "system": m.cpu_system_us, "seconds": m.cpu_s},
        "processId": m.process_id,
        "processes": m.processes,
        "counters": m.counters,
    }


# --- messages ----------------------------------------------------------------------------------


def _message_head(m: StoredMessage) -> Json:
    """Where a message is and how queue mode stands on it: the first keys of both shapes."""
    return {
        "id": m.message_id,
        "transactionId": m.transaction_id,
        "partitionId": str(m.partition_id),
        "queuePath": f"{m.queue}/{m.partition}",
        "queue": m.queue,
        "partition": m.partition,
        "namespace": m.namespace,
        "task": m.task,
        "offset": m.offset,
        "status": m.status,
    }


def _stored(m: StoredMessage) -> Json:
    body = {
        **_message_head(m),
        "traceId": m.trace_id,
        "producerSub": m.producer_sub,
        "createdAt": _iso(m.created_at),
        "leaseExpiresAt": _iso(m.lease_expires_at),
    }
    if m.total_groups is not None:
        # the original's keys: queue mode's status, and how the named groups stand on it
        body["queueStatus"] = m.status
        body["busStatus"] = {"consumedBy": m.consumed_by or 0, "totalGroups": m.total_groups}
    return body


def message_page(page: MessagePage) -> Json:
    """``GET /api/v1/messages``."""
    return {
        "messages": [_stored(m) for m in page.messages],
        "pagination": _page(page.page),
        "timeRange": _window(page.window),
    }


def queue_messages(page: MessagePage) -> list[Json]:
    """``GET /api/v1/status/queues/{q}/messages``: the page's rows alone, as the original
    answers that route."""
    return [_stored(m) for m in page.messages]


def message_detail(d: MessageDetail) -> Json:
    """``GET /api/v1/messages/{partitionId}/{transactionId}``: the message with its payload;
    ``errorMessage`` and ``retryCount`` are those of its newest DLQ copy."""
    m = d.message
    latest = d.dead_letters[0] if d.dead_letters else None
    return {
        **_message_head(m),
        "payload": d.payload.value,
        "isEncrypted": d.payload.encrypted,
        "payloadError": d.payload.error,
        "traceId": m.trace_id,
        "producerSub": m.producer_sub,
        "createdAt": _iso(m.created_at),
        "errorMessage": latest.error_message if latest else None,
        "retryCount": latest.retry_count if latest else None,
        "leaseExpiresAt": _database_time(m.lease_expires_at),
        "queueConfig": {
            "leaseTime": d.lease_time_s,
            "retryLimit": d.retry_limit,
            "retryDelay": d.retry_delay_ms,
            "ttl": d.ttl_s,
            "priority": d.priority,
        },
        "consumerGroups": [
            {
                "name": g.name,
                "leased": g.leased,
                "consumed": g.consumed,
                "leaseExpiresAt": _database_time(g.lease_expires_at),
            }
            for g in d.consumer_groups
        ],
        "deadLetters": [
            {
                "failedAt": _database_time(r.failed_at),
                "retryCount": r.retry_count,
                "errorMessage": r.error_message,
                "consumerGroup": r.consumer_group,
            }
            for r in d.dead_letters
        ],
    }


DELETION_STATUS = {"deleted": 200, "leased": 409, "missing": 404}


def message_deleted(d: MessageDeletion) -> tuple[Json, int]:
    """``DELETE /api/v1/messages/{partitionId}/{transactionId}``: the body and its status."""
    body: Json = {
        "success": d.outcome == "deleted",
        "partitionId": str(d.partition_id),
        "transactionId": d.transaction_id,
    }
    if d.outcome == "deleted":
        body["message"] = "Message deleted"
    elif d.outcome == "leased":
        body["error"] = "message is leased by a consumer; try again later"
    else:
        body["error"] = "Message not found"
    return body, DELETION_STATUS[d.outcome]


def message_retried(r: MessageRetry) -> Json:
    """``POST /api/v1/messages/{partitionId}/{transactionId}/retry`` (200)."""
    return {
        "retried": r.retried,
        "partitionId": str(r.partition_id),
        "transactionId": r.transaction_id,
        "consumerGroups": sorted({c.consumer_group for c in r.copies}),
        "copies": [{"consumerGroup": c.consumer_group, "offset": c.offset} for c in r.copies],
        "message": "Delivered again" if r.retried else "No dead letter of this message left",
    }


def bulk_retried(b: BulkRetry) -> Json:
    """``POST /api/v1/dlq/retry`` (200)."""
    return {
        "retried": b.retried,
        "queue": b.scope.queue,
        "consumerGroup": b.scope.consumer_group,
        "partition": b.scope.partition,
        "from": _iso(b.scope.since),
        "to": _iso(b.scope.until),
        "message": f"{b.retried} dead letter{'s' if b.retried != 1 else ''} delivered again",
    }


DEAD_LETTER_STATUS = {
    "moved": 200,
    "already": 200,
    "consumed": 409,
    "leased": 409,
    "no_group": 404,
    "missing": 404,
}


def message_dead_lettered(d: MessageDeadLettered) -> tuple[Json, int]:
    """``POST /api/v1/messages/{partitionId}/{transactionId}/dlq``: the body and its status."""
    group = d.request.consumer_group
    body: Json = {
        "moved": d.outcome == "moved",
        "partitionId": str(d.partition_id),
        "transactionId": d.transaction_id,
        "consumerGroup": group,
    }
    said = {
        "moved": ("message", f"Moved to the dead letter queue of {group}"),
        "already": ("message", f"Already in the dead letter queue of {group}"),
        "consumed": ("error", f"{group} has already consumed this message (or starts after it)"),
        "leased": ("error", f"message is leased by a consumer of {group}; try again later"),
        "no_group": ("error", f"consumer group {group} has never read this queue"),
        "missing": ("error", "Message not found"),
    }
    key, text = said[d.outcome]
    body[key] = text
    return body, DEAD_LETTER_STATUS[d.outcome]


def queue_cleared(c: QueueCleared) -> Json:
    """``DELETE /api/v1/queues/{queue}/clear`` (200)."""
    where = f"{c.queue}/{c.partition}" if c.partition else c.queue
    text = f"{c.cleared} message{'s' if c.cleared != 1 else ''} removed from {where}"
    if c.kept:
        text += f"; {c.kept} kept inside live leases"
    return {
        "cleared": c.cleared,
        "kept": c.kept,
        "queue": c.queue,
        "partition": c.partition,
        "message": text,
    }


# --- consumer groups ---------------------------------------------------------------------------


def group_state(g: GroupStanding) -> str:
    """The original's ``state``: ``Lagging`` when the oldest message the group has still to
    receive is over 5 minutes old, else ``Stable`` once it has acknowledged (or
    dead-lettered) a message it popped on the queue, else ``Dead``."""
    if g.max_time_lag_s > LAGGING_AFTER_S:
        return "Lagging"
    return "Stable" if g.acknowledged else "Dead"


def group_standing(g: GroupStanding) -> Json:
    """A group on one queue, as every list of groups shows it."""
    return {
        "name": g.name,
        "queueName": g.queue,
        "topics": [g.queue],
        "members": g.popped,  # the original's: partitions the group has popped
        "partitions": g.partitions,
        # the original's: of the partitions it popped, those where it has messages to
        # receive (totalLag, beside, is ours: every partition it will read)
        "partitionsWithLag": g.popped_lagging,
        "leasedPartitions": g.leased,
        "totalLag": g.lag,
        "maxTimeLag": g.max_time_lag_s,
        "lagMessages": g.lag,  # the original's queenctl reads these two
        "lagSeconds": int(g.max_time_lag_s),
        "oldestPendingAt": _iso(g.oldest_pending_at),
        "state": group_state(g),
        "lastConsumedAt": _iso(g.last_consumed_at),
        "subscriptionMode": g.subscription_mode,
        "subscriptionTimestamp": _iso(g.subscribed_at),
        "subscriptionCreatedAt": _iso(g.subscription_created_at),
    }


def group_standings(groups: list[GroupStanding]) -> list[Json]:
    """``GET /api/v1/consumer-groups``."""
    return [group_standing(g) for g in groups]


def lagging(rows: list[LaggingPartition]) -> list[Json]:
    """``GET /api/v1/consumer-groups/lagging``: one row per (group, queue, partition), the
    original's keys first, then queenctl's and the partition's as the other routes name
    them."""
    out = []
    for row in rows:
        g, p = row.standing, row.partition
        seconds = int(p.time_lag_s)
        out.append(
            {
                "consumer_group": g.name,
                "queue_name": g.queue,
                "partition_name": p.partition,
                "partition_id": str(p.partition_id),
                "worker_id": None,
                "offset_lag": p.lag,
                "time_lag_seconds": seconds,
                "lag_hours": round(seconds / 3600, 2),
                "oldest_unconsumed_at": _iso(p.oldest_at),
                "last_consumed_at": _iso(p.last_consumed_at),
                "name": g.name,
                "queueName": g.queue,
                # what queenctl's `lag --min-seconds` shows
                "queue": g.queue,
                "lagMessages": p.lag,
                "lagSeconds": seconds,
                **_group_partition(p),
            }
        )
    return out


def _group_partition(p: GroupPartition) -> Json:
    return {
        "partition": p.partition,
        "partitionId": str(p.partition_id),
        "offset": p.cursor_offset,
        "nextOffset": p.next_offset,
        "offsetLag": p.lag,
        "timeLagSeconds": p.time_lag_s,
        "leaseActive": p.lease_expires_at is not None,
        "leaseExpiresAt": _iso(p.lease_expires_at),
        "lastConsumedAt": _iso(p.last_consumed_at),
        "leaseExpiredAt": _iso(p.lease_expired_at),
        "stuck": p.stuck,
        # the original's: which worker holds it and how many it consumed, not kept here
        "workerId": None,
        "totalConsumed": None,
    }


def group_detail(found: list[GroupOnQueue]) -> Json:
    """``GET /api/v1/consumer-groups/{g}``: by queue name, the group's standing with its page
    of partitions in place of their count (``partitionCount``)."""
    return {
        g.standing.queue: {
            **group_standing(g.standing),
            "partitions": [_group_partition(p) for p in g.partitions],
            "partitionCount": g.standing.partitions,
        }
        for g in found
    }

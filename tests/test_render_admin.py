"""The admin API's JSON bodies, rendered from typed admin results: every key, its place and
the format of its value (ISO times with milliseconds, ids as strings, ints against floats), as
the official clients and the original's dashboard read them. No database: the admin API tests
check the values end to end.

Bodies are compared as the bytes they are sent as, so a key out of place or ``0`` for ``0.0``
fails."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson

from queen.admin.database import PostgresStats
from queen.admin.figures import MessageCounts
from queen.admin.gauges import QueueGauges
from queen.admin.groups import GroupOnQueue, GroupPartition, GroupStanding
from queen.admin.history import RatePoint, Rates
from queen.admin.messages import MessageDeletion, MessageDetail, MessagePage, StoredMessage
from queen.admin.params import Page, TimeRange
from queen.admin.payloads import Shown
from queen.admin.queues import (
    ConfiguredQueue,
    Depth,
    Grouping,
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
    QueueLagPoint,
    RetentionFigures,
    Status,
)
from queen.consume.policy import iso_utc
from queen.http import render_admin as render
from queen.metrics import render_labelled_gauges
from queen.records import QueueOptions
from queen.spool import SpoolState
from queen.storage.admin import DeadLetterRecord, GroupView, TableSize
from queen.storage.retention import QueueHoldings

AT = datetime(2026, 4, 26, 10, 59, 28, 267_891, tzinfo=UTC)
AT_ISO = "2026-04-26T10:59:28.267Z"
# a history point of 10 s ending at AT is labelled by its start, as the original's buckets are
POINT_START_ISO = "2026-04-26T10:59:18.267Z"
LATER = AT + timedelta(minutes=5)
LATER_ISO = "2026-04-26T11:04:28.267Z"
COUNTS = MessageCounts(total=7, pending=4, processing=1, completed=2, failed=3, dead_letter=1)
COUNTS_WIRE = {
    "total": 7,
    "pending": 4,
    "processing": 1,
    "completed": 2,
    "failed": 3,
    "deadLetter": 1,
}
# where the original's pending counts the leased messages too: partitions, queue totals
LEASED_WIRE = COUNTS_WIRE | {"pending": 5}
EMPTY = MessageCounts(0, 0, 0, 0, 0, 0)
EMPTY_WIRE = {k: 0 for k in COUNTS_WIRE}
WINDOW = TimeRange(AT - timedelta(hours=1), AT)
WINDOW_WIRE = {"from": "2026-04-26T09:59:28.267Z", "to": AT_ISO}


def same(body: Any, expected: Any) -> None:
    """Equal as sent: the same keys in the same order, the same values of the same types."""
    assert orjson.dumps(body) == orjson.dumps(expected)


SUMMARY = QueueSummary(
    id=12,
    name="orders",
    namespace="shop",
    task="ship",
    priority=2,
    created_at=AT,
    partitions=3,
    messages=COUNTS,
    oldest_pending_at=AT,
    oldest_pending_age_s=120.19,
    last_message_at=None,
)
SUMMARY_WIRE = {
    "id": "12",
    "name": "orders",
    "namespace": "shop",
    "task": "ship",
    "priority": 2,
    "createdAt": AT_ISO,
    "partitions": 3,
    "messages": COUNTS_WIRE,
    "oldestPendingAt": AT_ISO,
    "oldestPendingAgeSeconds": 120.19,
    "lastMessageAt": None,
}


def test_a_page_of_queues_counts_every_match() -> None:
    page = QueuePage([SUMMARY], total=41, page=Page(1, 40))
    pagination = {"limit": 1, "offset": 40, "total": 41}
    same(render.queue_page(page), {"queues": [SUMMARY_WIRE], "total": 41, "pagination": pagination})


def test_queue_lag_is_newest_first_and_queue_ops_oldest_first_with_unkept_figures_null() -> None:
    older = QueueLagPoint(AT - timedelta(minutes=1), "orders", 4, 1500.0, 2500.0)
    newer = QueueLagPoint(AT, "orders", 2, 10.5, 11.0)
    flow = QueueFlowSeries(WINDOW, [older, newer])
    same(
        render.queue_lag(flow),
        [
            {
                "bucketTime": AT_ISO,
                "queueName": "orders",
                "popCount": 2,
                "avgLagMs": 10.5,
                "maxLagMs": 11.0,
            },
            {
                "bucketTime": iso_utc(AT - timedelta(minutes=1)),
                "queueName": "orders",
                "popCount": 4,
                "avgLagMs": 1500.0,
                "maxLagMs": 2500.0,
            },
        ],
    )
    ops = render.queue_ops(flow)
    assert ops["queues"] == ["orders"] and ops["bucketMinutes"] == 1
    assert [(r["bucket"], r["popMessages"], r["popPerSecond"]) for r in ops["series"]] == [
        (iso_utc(AT - timedelta(minutes=1)), 4, 0.07),
        (AT_ISO, 2, 0.03),
    ]
    assert ops["series"][0]["pushMessages"] == 0 and ops["series"][0]["parkedCount"] is None


PARTITION = PartitionFigures(
    id=5,
    name="p1",
    created_at=AT,
    messages=COUNTS,
    low_offset=0,
    next_offset=5,
    cursor_offset=2,
    lease_expires_at=LATER,
    oldest_pending_at=None,
    oldest_pending_age_s=0.0,
    newest_at=AT,
)
PARTITION_WIRE = {
    "id": "5",
    "name": "p1",
    "createdAt": AT_ISO,
    "messages": LEASED_WIRE,
    "stats": LEASED_WIRE,
    "offsets": {"low": 0, "next": 5, "cursor": 2},
    "cursor": {"totalConsumed": 2, "batchesConsumed": None},
    "leaseExpiresAt": LATER_ISO,
    "oldestPendingAt": None,
    "oldestPendingAgeSeconds": 0.0,
    "lastActivity": AT_ISO,
    "oldestMessage": None,
    "newestMessage": AT_ISO,
}
OPTIONS = QueueOptions(lease_time_s=60, retry_limit=5, dead_letter_queue=True, priority=2)
QUEUE = ConfiguredQueue(12, "orders", "shop", "ship", AT, OPTIONS)
FIGURES = QueueFigures(QUEUE, SUMMARY, [PARTITION], Page(100, 0))


def test_queue_resources_lead_with_what_the_queue_holds_then_page_its_partitions() -> None:
    held = QueueHoldings(
        queue_id=12,
        namespace="shop",
        task="ship",
        dedup_window_seconds=3600,
        retention_seconds=0,
        completed_retention_seconds=60,
        partitions=3,
        segments=6,
        messages=7,
        sidecar_entries=7,
        retention_enabled=True,
        max_wait_time_seconds=0,
    )
    same(
        render.queue_resources(QueueResources(FIGURES, held)),
        {
            "queue": "orders",
            "queueId": "12",
            "namespace": "shop",
            "task": "ship",
            "partitions": [PARTITION_WIRE],  # the holdings' count is the page of partitions
            "segments": 6,
            "messages": 7,
            "sidecarEntries": 7,
            "options": {
                "dedupWindowSeconds": 3600,
                "retentionEnabled": True,
                "retentionSeconds": 0,
                "completedRetentionSeconds": 60,
                "maxWaitTimeSeconds": 0,
            },
            "id": "12",
            "name": "orders",
            "createdAt": AT_ISO,
            "partitionCount": 3,
            "pagination": {"limit": 100, "offset": 0},
            "totals": LEASED_WIRE | {"messages": LEASED_WIRE},
        },
    )


STANDING = GroupStanding(
    name="g1",
    queue="orders",
    partitions=2,
    leased=1,
    lag=7,
    max_time_lag_s=120.204,
    oldest_pending_at=AT,
    last_consumed_at=LATER,
    subscription_mode="all",
    subscribed_at=None,
    subscription_created_at=AT,
    lagging=2,
    popped=2,
    popped_lag=7,
    popped_lagging=2,
    acknowledged=True,
)
STANDING_WIRE = {
    "name": "g1",
    "queueName": "orders",
    "topics": ["orders"],
    "members": 2,
    "partitions": 2,
    "partitionsWithLag": 2,
    "leasedPartitions": 1,
    "totalLag": 7,
    "maxTimeLag": 120.204,
    "lagMessages": 7,
    "lagSeconds": 120,
    "oldestPendingAt": AT_ISO,
    "state": "Stable",  # behind, but by less than 5 minutes
    "lastConsumedAt": LATER_ISO,
    "subscriptionMode": "all",
    "subscriptionTimestamp": None,
    "subscriptionCreatedAt": AT_ISO,
}
CAUGHT_UP = GroupStanding(
    "__QUEUE_MODE__",
    "orders",
    3,
    0,
    0,
    0.0,
    None,
    LATER,
    None,
    None,
    None,
    popped=3,
    acknowledged=True,
)


def test_queue_status_shows_the_configuration_totals_and_groups() -> None:
    body = render.queue_status(QueueStatus(FIGURES, [STANDING]))
    same(
        body,
        {
            "queue": {
                "id": "12",
                "name": "orders",
                "namespace": "shop",
                "task": "ship",
                "priority": 2,
                "createdAt": AT_ISO,
                "config": {
                    "leaseTime": 60,
                    "retryLimit": 5,
                    "retryDelay": 1000,
                    "ttl": 3600,
                    "maxQueueSize": 0,
                    "deadLetterQueue": True,
                    "dedupWindowSeconds": 3600,
                    "retentionSeconds": 0,
                    "completedRetentionSeconds": 0,
                    "delayedProcessing": 0,
                    "windowBuffer": 0,
                },
            },
            "partitions": [PARTITION_WIRE],
            "partitionCount": 3,
            "pagination": {"limit": 100, "offset": 0},
            "totals": LEASED_WIRE | {"messages": LEASED_WIRE},
            "messages": LEASED_WIRE,
            "oldestPendingAt": AT_ISO,
            "oldestPendingAgeSeconds": 120.19,
            "consumerGroups": [STANDING_WIRE],
        },
    )
    gone = render.queue_status(QueueStatus(QueueFigures(QUEUE, None, [], Page(100, 0)), []))
    same(
        {k: gone[k] for k in list(gone)[1:]},
        {
            "partitions": [],
            "partitionCount": 0,
            "pagination": {"limit": 100, "offset": 0},
            "totals": None,
            "messages": None,
            "oldestPendingAt": None,
            "oldestPendingAgeSeconds": 0.0,
            "consumerGroups": [],
        },
    )


def test_namespaces_and_tasks_are_keyed_by_what_groups_them() -> None:
    items = [Grouping("shop", queues=2, partitions=5, messages=Depth(9, 4, 1))]
    wire = {"queues": 2, "partitions": 5, "messages": {"total": 9, "pending": 4, "processing": 1}}
    same(
        render.groupings(Groupings("namespace", items)),
        {"namespaces": [{"namespace": "shop", **wire}]},
    )
    same(render.groupings(Groupings("task", items)), {"tasks": [{"task": "shop", **wire}]})
    same(render.groupings(Groupings("task", [])), {"tasks": []})


SPOOL = SpoolState(Path("/var/spool/queen"), 0, 0, 0, 0.0, 0.0, True, 0, 0)
PROCESS = ProcessState(4242, 1234.6, 3, True, False, SPOOL, {"push_requests": 5, "acks": 2})
PROCESS_WIRE = {
    "processId": 4242,
    "uptimeSeconds": 1234.6,
    "activePartitions": 3,
    "databaseUp": True,
    "maintenanceMode": False,
    "spool": {
        "directory": "/var/spool/queen",
        "pendingItems": 0,
        "files": 0,
        "pendingBytes": 0,
        "oldestAgeSeconds": 0.0,
        "replayRate": 0.0,
        "healthy": True,
        "problem": None,
        "quarantined": {"ranges": 0, "bytes": 0},
    },
    "counters": {"push_requests": 5, "acks": 2},
}
OVERVIEW = Overview(
    queues=5,
    partitions=7,
    namespaces=2,
    tasks=1,
    consumer_groups=3,
    messages=COUNTS,
    oldest_pending_at=AT,
    oldest_pending_age_s=120.19,
    rates=Rates(ingested_per_s=9.1, pop_per_s=0.3, processed_per_s=0.2),
    push_maintenance=False,
    pop_maintenance=True,
    process=PROCESS,
    at=LATER,
)
POINT = RatePoint(
    at=AT,
    span_s=10.0,
    rates=Rates(0.7, 0.3, 0.2),
    dead_letter_per_s=0.0,
    push_requests_per_s=0.1,
    ingested=7,
    processed=2,
    cpu_percent=3.7,
    rss_bytes=40_001_234,
)
# the original's keys of a point of /status and /analytics/worker-metrics, for POINT (no
# counter deltas: every count 0; what has no counterpart here 0 or null)
ORIGINAL_POINT_WIRE = {
    "popMessages": 0,
    "avgLagMs": None,
    "maxLagMs": None,
    "lagCount": 0,
    "pushMessages": 7,
    "ackMessages": 0,
    "pushRequests": 0,
    "popRequests": 0,
    "ackRequests": 0,
    "popEmpty": 0,
    "transactions": 0,
    "pushPerSecond": 0.7,
    "ackPerSecond": 0.2,
    "dbErrors": 0,
    "ackSuccess": 0,
    "ackFailed": 0,
    "dlqCount": 0,
    "avgEventLoopLagMs": 0,
    "maxEventLoopLagMs": 0,
    "avgFreeSlots": None,
    "minFreeSlots": None,
    "dbConnections": None,
    "avgJobQueueSize": 0,
    "maxJobQueueSize": 0,
    "backoffSize": 0,
    "jobsDone": 0,
    "queenCpuUserPct": 0.0,
    "queenCpuSysPct": 0.0,
    "queenRssMb": 38.1,
    "dbPoolActive": None,
    "dbPoolIdle": None,
    "dbPoolSize": None,
}
POINT_WIRE = {
    "seconds": 10.0,
    "ingestedPerSecond": 0.7,
    "popPerSecond": 0.3,
    "processedPerSecond": 0.2,
    "deadLetterPerSecond": 0.0,
    "pushRequestsPerSecond": 0.1,
    "ingested": 7,
    "processed": 2,
    "cpuPercent": 3.7,
    "rssBytes": 40_001_234,
    "timestamp": POINT_START_ISO,
}


def test_the_overview_puts_every_queue_together_with_this_process() -> None:
    same(
        render.overview(OVERVIEW),
        {
            "queues": 5,
            "partitions": 7,
            "namespaces": 2,
            "tasks": 1,
            "consumerGroups": 3,
            "messages": COUNTS_WIRE,
            "lag": {
                "time": {"avg": 0.0, "max": 120.19, "median": None, "min": None},
                "offset": {"total": 4, "avg": None, "median": None, "min": None, "max": None},
            },
            "oldestPendingAt": AT_ISO,
            "throughput": {
                "ingestedPerSecond": 9.1,
                "processedPerSecond": 0.2,
                "popPerSecond": 0.3,
            },
            "maintenance": {"push": False, "pop": True},
            "process": PROCESS_WIRE,
            "timestamp": LATER_ISO,
            "statsAge": 0,
        },
    )
    without_spool = render.process(ProcessState(1, 0.0, 0, False, True, None, {}))
    assert without_spool["spool"] is None and without_spool["databaseUp"] is False


STATUS_COUNTERS = {
    "push_requests": 10,
    "pop_requests": 4,
    "ack_requests": 0,
    "push_items_queued": 25,
    "pop_messages": 6,
    "acks": 0,
    "push_transaction_failures": 1,
    "acks_refused": 2,
    "acks_dlq": 3,
}


def test_status_analytics_and_system_metrics_share_the_history_points() -> None:
    same(
        render.status(Status(WINDOW, [POINT], OVERVIEW, [SUMMARY], 10.0, STATUS_COUNTERS)),
        {
            "timeRange": WINDOW_WIRE,
            "bucketMinutes": 0.167,
            "pointCount": 1,
            "throughput": [POINT_WIRE | ORIGINAL_POINT_WIRE],
            "queues": [
                {
                    "id": "12",
                    "name": "orders",
                    "namespace": "shop",
                    "task": "ship",
                    "partitions": 3,
                    "totalConsumed": SUMMARY.messages.completed,
                }
            ],
            "totals": {"queues": 5, "partitions": 7},
            # the service's counters: stored, not yet popped, acknowledged, refused,
            # dead-lettered
            "messages": {
                "total": 25,
                "pending": 19,
                "processing": 0,
                "completed": 0,
                "failed": 2,
                "deadLetter": 3,
                "requests": {"push": 10, "pop": 4, "ack": 0},
                "batchEfficiency": {"push": 2.5, "pop": 1.5, "ack": 0},
            },
            "leases": {
                "active": 0,
                "partitionsWithLeases": 0,
                "totalBatchSize": 0,
                "totalAcked": 0,
                "processingMessages": 1,
            },
            "deadLetterQueue": {
                "total": 1,
                "totalMessages": 1,
                "affectedPartitions": 0,
                "topErrors": [],
            },
            "errors": {"dbErrors": 1, "ackFailed": 2, "dlqMessages": 3},
            "workers": [
                PROCESS_WIRE
                | {
                    "hostname": "",
                    "workerId": 4242,
                    "avgEventLoopLagMs": 0,
                    "maxEventLoopLagMs": 0,
                    "freeSlots": None,  # POINT knows no pool
                    "dbConnections": None,
                    "jobQueueSize": 0,
                    "backoffSize": 0,
                    "messagesProcessed": 0,
                    "lastSeen": AT_ISO,
                }
            ],
            "statsAge": 0,
        },
    )
    hour = AT.replace(minute=0, second=0, microsecond=0)
    series = ProcessSeries(WINDOW, "hour", 4242, [POINT, POINT], stored=[(hour, 14)])
    same(
        render.analytics(series),
        {
            "dataPoints": [{"timestamp": "2026-04-26T10:00:00.000Z", "messages": 14}],
            "interval": "hour",
            "from": WINDOW_WIRE["from"],
            "to": WINDOW_WIRE["to"],
            "timeRange": WINDOW_WIRE,
            "processId": 4242,
            "pointCount": 2,
            "throughput": [POINT_WIRE, POINT_WIRE],
        },
    )
    system = render.system_metrics(series)
    assert system["processId"] == 4242 and system["replicaCount"] == 1
    assert (
        system["points"]
        == [{"timestamp": POINT_START_ISO, "cpuPercent": 3.7, "rssBytes": 40_001_234}] * 2
    )
    [replica] = system["replicas"]
    assert replica["workerId"] == 4242 and len(replica["timeSeries"]) == 2
    metrics = replica["timeSeries"][0]["metrics"]
    rss = metrics["memory"]["rss_bytes"]
    assert rss == dict.fromkeys(("avg", "min", "max", "last"), 40_001_234)
    assert metrics["database"]["pool_active"]["last"] is None  # POINT knows no pool


def test_retention_postgres_refresh_and_metrics_json() -> None:
    retention = RetentionFigures({"segments_removed": 4}, {"retention_passes": 1}, 10.0)
    same(
        render.retention(retention),
        {
            "timeRange": None,
            "bucketMinutes": 1,
            "series": [],
            "totals": {
                "retentionMsgs": 0,
                "completedRetentionMsgs": 0,
                "evictionMsgs": 0,
                "totalMsgs": 0,
                "eventCount": 0,
            },
            "allProcesses": {"segments_removed": 4},
            "thisProcess": {"retention_passes": 1},
            "intervalSeconds": 10.0,
        },
    )
    stats = PostgresStats(
        version="17.2",
        database="embedded PostgreSQL at /data",
        database_bytes=8_656_575,
        connections=4,
        active_connections=1,
        max_connections=200,
        pool_size=6,
        committed=90,
        rolled_back=2,
        cache_hit_ratio=0.9987,
        deadlocks=0,
        rows_inserted=11,
        rows_updated=12,
        rows_deleted=13,
        tables=[TableSize("segments", 49_152, 6)],
    )
    same(
        render.postgres(stats),
        {
            "version": "17.2",
            "database": "embedded PostgreSQL at /data",
            "databaseBytes": 8_656_575,
            "connections": {"total": 4, "active": 1, "max": 200, "poolSize": 6},
            "transactions": {"committed": 90, "rolledBack": 2},
            "cacheHitRatio": 0.9987,
            "deadlocks": 0,
            "rows": {"inserted": 11, "updated": 12, "deleted": 13},
            "tables": [{"rows": 6, "bytes": 49_152, "table": "segments"}],
        },
    )
    same(
        render.refreshed(),
        {"success": True, "message": "statistics are computed when read; cache dropped"},
    )
    figures = ProcessMetrics(
        1234.6, 9, 7, 9.1, 6, 5, 50_000_000, 12.5, 10_000_000, 2_500_000, 4242, 2, {"acks": 2}
    )
    same(
        render.metrics(figures),
        {
            "uptime": 1234.6,
            "requests": {"total": 9, "rate": 0},
            "messages": {"total": 7, "rate": 9.1},
            "database": {"poolSize": 6, "idleConnections": 5, "waitingRequests": 0},
            "memory": {
                "rss": 50_000_000,
                "heapTotal": 0,
                "heapUsed": 0,
                "external": 0,
                "arrayBuffers": 0,
            },
            "cpu": {"user": 10_000_000, "system": 2_500_000, "seconds": 12.5},
            "processId": 4242,
            "processes": 2,
            "counters": {"acks": 2},
        },
    )


MESSAGE = StoredMessage(
    partition_id=6,
    queue="orders",
    partition="p2",
    namespace="shop",
    task="ship",
    offset=1,
    message_id="01a2340c-0393-7000-8001-84c803337018",
    transaction_id="b2",
    status="processing",
    trace_id=None,
    producer_sub="alice",
    created_at=AT,
    lease_expires_at=LATER,
)
MESSAGE_HEAD = {
    "id": "01a2340c-0393-7000-8001-84c803337018",
    "transactionId": "b2",
    "partitionId": "6",
    "queuePath": "orders/p2",
    "queue": "orders",
    "partition": "p2",
    "namespace": "shop",
    "task": "ship",
    "offset": 1,
    "status": "processing",
}


def test_a_page_of_messages_has_no_payloads() -> None:
    same(
        render.message_page(MessagePage([MESSAGE], Page(50, 0), WINDOW)),
        {
            "messages": [
                {
                    **MESSAGE_HEAD,
                    "traceId": None,
                    "producerSub": "alice",
                    "createdAt": AT_ISO,
                    "leaseExpiresAt": LATER_ISO,
                }
            ],
            "pagination": {"limit": 50, "offset": 0},
            "timeRange": WINDOW_WIRE,
        },
    )


def test_a_message_detail_passes_its_group_and_dlq_times_on_as_the_database_wrote_them() -> None:
    lease = datetime(2026, 12, 2, 0, 3, 52, 385_790, tzinfo=UTC)
    failed = datetime(2026, 12, 1, 23, 58, 52, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    detail = MessageDetail(
        message=MESSAGE,
        payload=Shown({"n": 2}, encrypted=True, error=None),
        consumer_groups=[
            GroupView("__QUEUE_MODE__", consumed=False, leased=True, lease_expires_at=lease),
            GroupView("g1", consumed=True, leased=None, lease_expires_at=None),
        ],
        dead_letters=[
            DeadLetterRecord("g1", "boom: unparsable", 2, failed),
            DeadLetterRecord("g1", "older", 1, failed - timedelta(days=1)),
        ],
        lease_time_s=300,
        retry_limit=3,
        retry_delay_ms=1000,
        ttl_s=3600,
        priority=0,
    )
    same(
        render.message_detail(detail),
        {
            **MESSAGE_HEAD,
            "payload": {"n": 2},
            "isEncrypted": True,
            "payloadError": None,
            "traceId": None,
            "producerSub": "alice",
            "createdAt": AT_ISO,
            "errorMessage": "boom: unparsable",  # the newest DLQ copy's
            "retryCount": 2,
            "leaseExpiresAt": "2026-04-26T11:04:28.267891+00:00",
            "queueConfig": {
                "leaseTime": 300,
                "retryLimit": 3,
                "retryDelay": 1000,
                "ttl": 3600,
                "priority": 0,
            },
            "consumerGroups": [  # the keys in the order the database's JSON keeps them
                {
                    "name": "__QUEUE_MODE__",
                    "leased": True,
                    "consumed": False,
                    "leaseExpiresAt": "2026-12-02T00:03:52.38579+00:00",
                },
                {"name": "g1", "leased": None, "consumed": True, "leaseExpiresAt": None},
            ],
            "deadLetters": [
                {
                    "failedAt": "2026-12-01T23:58:52+05:30",
                    "retryCount": 2,
                    "errorMessage": "boom: unparsable",
                    "consumerGroup": "g1",
                },
                {
                    "failedAt": "2026-11-30T23:58:52+05:30",
                    "retryCount": 1,
                    "errorMessage": "older",
                    "consumerGroup": "g1",
                },
            ],
        },
    )
    plain = MessageDetail(MESSAGE, Shown(None, False, "unreadable"), [], [], 1, 0, 0, 0, 0)
    body = render.message_detail(plain)
    assert (body["errorMessage"], body["retryCount"], body["deadLetters"]) == (None, None, [])
    assert body["payload"] is None and body["payloadError"] == "unreadable"


def test_a_deletion_says_what_became_of_the_message() -> None:
    ids = {"partitionId": "6", "transactionId": "b2"}
    body, status = render.message_deleted(MessageDeletion(6, "b2", "deleted"))
    same(body, {"success": True, **ids, "message": "Message deleted"})
    assert status == 200
    body, status = render.message_deleted(MessageDeletion(6, "b2", "leased"))
    same(
        body, {"success": False, **ids, "error": "message is leased by a consumer; try again later"}
    )
    assert status == 409
    body, status = render.message_deleted(MessageDeletion(6, "b2", "missing"))
    same(body, {"success": False, **ids, "error": "Message not found"})
    assert status == 404


def test_groups_are_stable_when_caught_up() -> None:
    caught_up = render.group_standing(CAUGHT_UP)
    assert caught_up["state"] == "Stable" and caught_up["maxTimeLag"] == 0.0
    assert list(caught_up) == list(STANDING_WIRE)
    same(render.group_standings([STANDING]), [STANDING_WIRE])


def test_a_group_state_means_what_the_originals_does() -> None:
    """Lagging: its oldest message to receive is over 5 minutes old (a few messages behind
    is no lag); Stable: it acknowledged on the queue; Dead: it never did (popping alone is
    not enough)."""
    assert render.group_state(STANDING) == "Stable"
    late = dataclasses.replace(STANDING, max_time_lag_s=300.5)
    assert render.group_state(late) == "Lagging"
    popped_only = dataclasses.replace(STANDING, acknowledged=False, max_time_lag_s=12.0)
    assert render.group_state(popped_only) == "Dead"
    never = dataclasses.replace(popped_only, last_consumed_at=None, popped=0)
    assert render.group_state(never) == "Dead"
    assert render.group_standing(never)["members"] == 0
    assert render.group_state(dataclasses.replace(never, max_time_lag_s=301.0)) == "Lagging"


def test_a_groups_partitions_with_lag_are_of_those_it_reads_its_lag_of_every_one() -> None:
    """The original's partitionsWithLag counts the partitions the group reads (popped);
    totalLag stays ours: every partition it will read."""
    wide = dataclasses.replace(STANDING, lag=40, lagging=5, popped_lag=7, popped_lagging=2)
    body = render.group_standing(wide)
    assert body["partitionsWithLag"] == 2 and body["totalLag"] == 40


def test_a_group_detail_replaces_the_partition_count_with_the_page_of_partitions() -> None:
    leased = GroupPartition("p1", 5, 0, 5, 5, 120.204, LATER, AT)
    idle = GroupPartition("p2", 6, 2, 2, 0, 0.0, None, None)
    body = render.group_detail([GroupOnQueue(STANDING, [leased, idle])])
    same(
        body,
        {
            "orders": {
                **STANDING_WIRE,
                "partitions": [
                    {
                        "partition": "p1",
                        "partitionId": "5",
                        "offset": 0,
                        "nextOffset": 5,
                        "offsetLag": 5,
                        "timeLagSeconds": 120.204,
                        "leaseActive": True,
                        "leaseExpiresAt": LATER_ISO,
                        "lastConsumedAt": AT_ISO,
                        "leaseExpiredAt": None,
                        "stuck": None,
                        "workerId": None,
                        "totalConsumed": None,
                    },
                    {
                        "partition": "p2",
                        "partitionId": "6",
                        "offset": 2,
                        "nextOffset": 2,
                        "offsetLag": 0,
                        "timeLagSeconds": 0.0,
                        "leaseActive": False,
                        "leaseExpiresAt": None,
                        "lastConsumedAt": None,
                        "leaseExpiredAt": None,
                        "stuck": None,
                        "workerId": None,
                        "totalConsumed": None,
                    },
                ],
                "partitionCount": 2,
            }
        },
    )
    assert list(body["orders"])[4] == "partitions"


def test_queue_gauges_are_labelled_families_under_one_help_and_type_each() -> None:
    empty = QueueSummary(13, 'a"b', "", "", 0, AT, 1, EMPTY, None, 0.0, None)
    text = render_labelled_gauges(
        render.queue_gauges(QueueGauges([SUMMARY, empty], [STANDING, CAUGHT_UP]))
    )
    helps = [line for line in text.splitlines() if line.startswith("# HELP")]
    assert helps == [f"# HELP queen_{name} {name.replace('_', ' ')}" for name in QUEUE_NAMES]
    text = "\n".join(line for line in text.splitlines() if not line.startswith("# HELP")) + "\n"
    # (prometheus_client writes every sample as a float and a sample's labels by name)
    assert text == (
        "# TYPE queen_queue_depth gauge\n"
        'queen_queue_depth{queue="orders"} 5.0\n'
        'queen_queue_depth{queue="a\\"b"} 0.0\n'
        "# TYPE queen_queue_oldest_pending_age_seconds gauge\n"
        'queen_queue_oldest_pending_age_seconds{queue="orders"} 120.19\n'
        'queen_queue_oldest_pending_age_seconds{queue="a\\"b"} 0.0\n'
        "# TYPE queen_queue_dlq_depth gauge\n"
        'queen_queue_dlq_depth{queue="orders"} 1.0\n'
        'queen_queue_dlq_depth{queue="a\\"b"} 0.0\n'
        "# TYPE queen_queue_partitions gauge\n"
        'queen_queue_partitions{queue="orders"} 3.0\n'
        'queen_queue_partitions{queue="a\\"b"} 1.0\n'
        "# TYPE queen_consumer_group_lag gauge\n"
        'queen_consumer_group_lag{consumer_group="g1",queue="orders"} 7.0\n'
        'queen_consumer_group_lag{consumer_group="__QUEUE_MODE__",queue="orders"} 0.0\n'
        "# TYPE queen_dlq_depth gauge\n"
        'queen_dlq_depth{scope="cluster"} 1.0\n'
        "# TYPE queen_dlq_depth_by_queue gauge\n"
        'queen_dlq_depth_by_queue{queue="orders"} 1.0\n'
        'queen_dlq_depth_by_queue{queue="a\\"b"} 0.0\n'
    )
    assert render_labelled_gauges(render.queue_gauges(QueueGauges([], []))).count("# TYPE") == 7
    described = render_labelled_gauges(
        render.queue_gauges(QueueGauges([SUMMARY], [])), render.QUEUE_GAUGE_HELP
    )
    assert "# HELP queen_queue_depth Messages of the queue not yet completed" in described


QUEUE_NAMES = (
    "queue_depth",
    "queue_oldest_pending_age_seconds",
    "queue_dlq_depth",
    "queue_partitions",
    "consumer_group_lag",
    "dlq_depth",
    "dlq_depth_by_queue",
)

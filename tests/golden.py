"""The original broker's answers to its dashboard's read routes (and a few more), for one fixed
data set: the sequence that makes the data (:func:`sequence`, driven over HTTP against either
broker), the routes asked (:data:`ROUTES`, with the parameters the app sends), and the comparison of
this broker's answer with the original's (:func:`compare`, with :data:`RULES` per route).

``python -m tests.golden_capture`` runs the sequence against the original and writes its
answers to ``tests/golden/original/``; ``tests/test_golden_original.py`` runs it against this
broker and compares.

Every key path of the original's answer must be in ours with the same JSON type (an integer
and a float are both numbers; null matches anything: a figure the original had not computed).
Then each path is one of:

- ``equal``: deterministic for this data (counts, totals, names, states): the same value;
- the default, ``type``: volatile (ids, times, CPU, memory, rates of a bucket that depends on
  when the sequence ran): the type alone;
- ``differs``: a figure with no meaning here (said why in :data:`RULES`, and in
  docs/operating.md): neither value nor type is compared, and the test names it.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

ORDERS = "orders"
PAYMENTS = "payments"
EMAILS = "emails"
TRACE_NAME = "order-flow"

# a request of the sequence: method, path (with query), JSON body
Step = tuple[str, str, Any]


def _pop(queue: str, partition: str, batch: int, group: str | None = None, extra: str = "") -> str:
    query = f"batch={batch}&wait=false"
    if group:
        query += f"&consumerGroup={group}"
    return f"/api/v1/pop/queue/{queue}/partition/{partition}?{query}{extra}"


def _ack(message: dict[str, Any], status: str, group: str | None) -> Step:
    body = {
        "transactionId": message["transactionId"],
        "partitionId": message["partitionId"],
        "leaseId": message["leaseId"],
        "status": status,
        "consumerGroup": group,
    }
    if status != "completed":
        body["error"] = "card declined"
    return ("POST", "/api/v1/ack", body)


def _items(queue: str, partition: str, prefix: str, first: int, count: int) -> list[Any]:
    return [
        {
            "queue": queue,
            "partition": partition,
            "transactionId": f"{prefix}-{n}",
            "payload": {"n": n, "partition": partition},
        }
        for n in range(first, first + count)
    ]


def _messages(answer: Any) -> list[dict[str, Any]]:
    return list(answer["messages"]) if isinstance(answer, dict) else []


def sequence() -> Generator[Step, Any, dict[str, str]]:
    """The fixed data set, one request at a time: each answer (parsed JSON, or None for an
    empty answer) is sent back in. Every pop names its partition, so both brokers lease the
    same messages. Returns the ids it learned (``"queue/partition"``: its partition id).

    - orders (namespace shop, task fulfilment): p-0..p-3 with 10 messages each, then 2 more
      each and a new partition p-4 with 3 that no one pops;
    - billing on orders: p-0 popped (10), 8 acknowledged and 2 dead-lettered, three traced;
      p-1 popped and acknowledged (10); p-2 popped and acknowledged (4 of 10);
    - audit on orders: p-0 popped (5) and held (a live lease); p-3 popped (10), 4 acknowledged;
    - shipping on orders, subscribed to new messages: an empty pop of the queue before the
      late ones;
    - payments (namespace shop): acct-0 and acct-1 with 8 each; queue mode pops acct-0 (8),
      acknowledges 6 and dead-letters 2; ledger pops acct-1 (5) and acknowledges them;
    - emails: 6 messages in Default; queue mode holds a lease on 3.
    """
    ids: dict[str, str] = {}
    options = {"leaseTime": 600, "retryLimit": 1, "retryDelay": 0}
    yield (
        "POST",
        "/api/v1/configure",
        {"queue": ORDERS, "namespace": "shop", "task": "fulfilment", "options": options},
    )
    yield (
        "POST",
        "/api/v1/configure",
        {"queue": PAYMENTS, "namespace": "shop", "options": {"leaseTime": 600}},
    )
    yield ("POST", "/api/v1/configure", {"queue": EMAILS, "options": {"leaseTime": 600}})
    for p in range(4):
        yield ("POST", "/api/v1/push", {"items": _items(ORDERS, f"p-{p}", f"order-{p}", 0, 10)})
    for p in range(2):
        yield ("POST", "/api/v1/push", {"items": _items(PAYMENTS, f"acct-{p}", f"pay-{p}", 0, 8)})
    yield ("POST", "/api/v1/push", {"items": _items(EMAILS, "Default", "mail", 0, 6)})

    got = _messages((yield ("GET", _pop(ORDERS, "p-0", 10, "billing"), None)))
    for n, message in enumerate(got):
        ids[f"{ORDERS}/p-0"] = message["partitionId"]
        if n < 3:
            yield (
                "POST",
                "/api/v1/traces",
                {
                    "transactionId": message["transactionId"],
                    "partitionId": message["partitionId"],
                    "consumerGroup": "billing",
                    "eventType": "error" if n == 2 else "processing",
                    "traceNames": [TRACE_NAME, f"order-{message['transactionId']}"],
                    "data": {"text": f"invoiced {message['transactionId']}"},
                },
            )
        yield _ack(message, "dlq" if n in (3, 7) else "completed", "billing")
    for partition, batch in (("p-1", 10), ("p-2", 4)):
        for message in _messages((yield ("GET", _pop(ORDERS, partition, batch, "billing"), None))):
            yield _ack(message, "completed", "billing")
    yield ("GET", _pop(ORDERS, "p-0", 5, "audit"), None)
    got = _messages((yield ("GET", _pop(ORDERS, "p-3", 10, "audit"), None)))
    for message in got[:4]:
        yield _ack(message, "completed", "audit")
    yield (
        "GET",
        f"/api/v1/pop/queue/{ORDERS}?batch=10&wait=false&consumerGroup=shipping"
        "&subscriptionMode=new",
        None,
    )

    got = _messages((yield ("GET", _pop(PAYMENTS, "acct-0", 8), None)))
    for n, message in enumerate(got):
        yield _ack(message, "dlq" if n in (2, 5) else "completed", None)
    for message in _messages((yield ("GET", _pop(PAYMENTS, "acct-1", 5, "ledger"), None))):
        yield _ack(message, "completed", "ledger")
    yield ("GET", _pop(EMAILS, "Default", 3), None)

    for p in range(4):
        yield ("POST", "/api/v1/push", {"items": _items(ORDERS, f"p-{p}", f"order-{p}", 10, 2)})
    yield ("POST", "/api/v1/push", {"items": _items(ORDERS, "p-4", "order-4", 0, 3)})
    return ids


@dataclass(frozen=True)
class Route:
    """A route of the original, with the parameters its dashboard app sends. ``path`` may
    hold ``{window}`` (``from`` and ``to`` of the last hour, as the app's default range
    asks), ``{window15}`` (the last 15 minutes) and ``{orders/p-0}`` (that partition's id).
    A route with another ``method`` than GET changes the data: it is asked after every
    read."""

    name: str
    path: str
    accept: str = "application/json, text/plain, */*"  # what axios sends
    method: str = "GET"


ROUTES: tuple[Route, ...] = (
    Route("resources-overview", "/api/v1/resources/overview"),
    Route("resources-namespaces", "/api/v1/resources/namespaces"),
    Route("resources-tasks", "/api/v1/resources/tasks"),
    Route("resources-queues", "/api/v1/resources/queues"),
    Route("resources-queue", f"/api/v1/resources/queues/{ORDERS}"),
    Route("resources-partitions", f"/api/v1/resources/partitions?queue={ORDERS}"),
    Route("messages", "/api/v1/messages?limit=100&offset=0"),
    Route("message", "/api/v1/messages/{orders/p-0}/order-0-0"),
    # dead-lettered by billing: its dead letter's error and retries
    Route("message-dead-letter", "/api/v1/messages/{orders/p-0}/order-0-3"),
    Route("traces-by-name", f"/api/v1/traces/by-name/{TRACE_NAME}?limit=50&offset=0"),
    Route("traces-names", "/api/v1/traces/names"),
    Route("traces-message", "/api/v1/traces/{orders/p-0}/order-0-0"),
    Route("status", "/api/v1/status?{window}"),
    Route("status-queues", "/api/v1/status/queues?limit=500"),
    Route("status-queue", f"/api/v1/status/queues/{ORDERS}"),
    # the original's limit does not bound this list (here it does): a page holding them all
    Route("status-queue-messages", f"/api/v1/status/queues/{ORDERS}/messages?limit=100"),
    Route("status-analytics", "/api/v1/status/analytics?{window}"),
    Route("consumer-groups", "/api/v1/consumer-groups"),
    Route("consumer-group", "/api/v1/consumer-groups/billing"),
    Route("consumer-groups-lagging", "/api/v1/consumer-groups/lagging?minLagSeconds=0"),
    Route("dlq", "/api/v1/dlq"),
    Route("health", "/health"),
    Route("metrics", "/metrics"),
    Route("system-maintenance", "/api/v1/system/maintenance"),
    Route("system-maintenance-pop", "/api/v1/system/maintenance/pop"),
    Route("analytics-system-metrics", "/api/v1/analytics/system-metrics?{window}"),
    Route("analytics-worker-metrics", "/api/v1/analytics/worker-metrics?{window}"),
    Route("analytics-queue-lag", "/api/v1/analytics/queue-lag?{window}"),
    Route("analytics-queue-ops", "/api/v1/analytics/queue-ops?{window15}"),
    Route("analytics-queue-parked-replicas", "/api/v1/analytics/queue-parked-replicas?{window}"),
    Route("analytics-retention", "/api/v1/analytics/retention?{window}"),
    Route("analytics-postgres-stats", "/api/v1/analytics/postgres-stats"),
    Route("migration-status", "/api/v1/migration/status"),
    # last: a message no one leased (pushed after every pop of p-0) is deleted
    Route("message-delete", "/api/v1/messages/{orders/p-0}/order-0-11", method="DELETE"),
)


def _window(minutes: int, now: datetime) -> str:
    since = now - timedelta(minutes=minutes)

    def iso(moment: datetime) -> str:
        return quote(moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"))

    return f"from={iso(since)}&to={iso(now)}"


def resolve(route: Route, ids: dict[str, str], now: datetime | None = None) -> str:
    """The route's path with its placeholders filled."""
    now = now or datetime.now(UTC)
    path = route.path.replace("{window}", _window(60, now))
    path = path.replace("{window15}", _window(15, now))
    return re.sub(r"\{([^}]+)\}", lambda m: quote(str(ids[m.group(1)]), safe=""), path)


# --- comparison ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    """How one route's answer is compared. Paths are dotted key paths with ``[]`` for every
    element of a list (``queues[].messages.pending``); ``*`` matches one key of any name.

    - ``equal``: these paths hold the same value in both answers;
    - ``differs``: path -> why its figure has no counterpart here (neither value nor type is
      compared; every path under it is skipped too);
    - ``order``: for a list path, the key its elements are matched by (the original's order
      is not asserted there); lists without one are matched by position;
    - ``status``: the original's HTTP status for this route, when not 200.
    """

    equal: tuple[str, ...] = ()
    differs: dict[str, str] = field(default_factory=dict)
    order: dict[str, str] = field(default_factory=dict)
    status: int = 200
    sums: tuple[str, ...] = ()  # list element paths whose sum over the list is the same


_Q = "queues[]"
_COUNTS = ("total", "pending", "processing", "completed", "failed", "deadLetter")
_NO_WORKERS = "one broker process answers here, the original has a worker per thread"
_NOT_MEASURED = "not measured here (null): no event loop, job queue or per-interval pool"
_MESSAGE_STATUS = (
    "here queue mode's status, only the leased messages processing; the original marks every "
    "message after queue mode's cursor processing while its lease lives, and in a partition "
    "no queue mode reads, a message completed once every group that read it consumed it"
)
_MESSAGE_DIFFERS = {  # a message's detail, dead-lettered or not
    "consumerGroups[].consumed": "a message stored before a group subscribed to new messages is "
    "behind its cursor here (consumed: it will never receive it); the original says not consumed "
    "(billing's and audit's agree)",
    "mode": "the original's summary of how the message's queue is consumed is not answered here",
    "queueConfig.ttl": "the original's default ttl of a configured queue",
}
_SERIES_SUMS = (
    "ingested",
    "processed",
    "popMessages",
    "dlqCount",
    "ackFailed",
    "dbErrors",
)

RULES: dict[str, Rules] = {
    "resources-overview": Rules(
        equal=("queues", "partitions", "namespaces", "tasks", *(f"messages.{k}" for k in _COUNTS)),
        differs={
            "lag.offset": "per-partition offset averages of the original's statistics cache "
            "are not kept here (null)",
            "lag.time.median": "not computed here (null)",
            "lag.time.min": "the original's constant 0; not computed here (null)",
        },
    ),
    "resources-namespaces": Rules(
        equal=tuple(
            f"namespaces[].{k}"
            for k in ("namespace", "queues", "partitions", "messages.total", "messages.pending")
        ),
        order={"namespaces[]": "namespace"},
    ),
    "resources-tasks": Rules(
        equal=tuple(
            f"tasks[].{k}"
            for k in ("task", "queues", "partitions", "messages.total", "messages.pending")
        ),
        order={"tasks[]": "task"},
    ),
    "resources-queues": Rules(
        equal=tuple(
            f"{_Q}.{k}"
            for k in (
                "name",
                "namespace",
                "task",
                "partitions",
                "messages.total",
                "messages.pending",
                "messages.processing",
            )
        ),
        order={_Q: "name"},
    ),
    "resources-queue": Rules(
        equal=(
            "name",
            "namespace",
            "task",
            "partitions[].name",
            *(f"partitions[].stats.{k}" for k in _COUNTS),
            *(f"totals.{k}" for k in _COUNTS),
        ),
        order={"partitions[]": "name"},
    ),
    "resources-partitions": Rules(status=404),
    "messages": Rules(
        equal=(
            "messages[].transactionId",
            "messages[].queue",
            "messages[].partition",
            "messages[].queuePath",
            "messages[].namespace",
            "messages[].task",
        ),
        order={"messages[]": "queue+transactionId"},
        differs={
            "mode": "the original's summary of how the listed queues are consumed (bus, queue "
            "or hybrid) is not answered here",
            "messages[].busStatus": "the original counts the groups of its statistics cache",
            "messages[].status": _MESSAGE_STATUS,
            "messages[].queueStatus": _MESSAGE_STATUS,
            "messages[].queuePriority": "the queue's priority is not joined into the list here",
            "messages[].leaseExpiresAt": "queue mode's lease of a message's partition, here "
            "only while the message is inside it",
        },
    ),
    "message": Rules(
        equal=(
            "transactionId",
            "queue",
            "partition",
            "queuePath",
            "namespace",
            "task",
            "payload",
            "status",
            "queueConfig.leaseTime",
            "queueConfig.retryLimit",
            "queueConfig.retryDelay",
            "queueConfig.priority",
            "consumerGroups[].name",
        ),
        order={"consumerGroups[]": "name"},
        differs=_MESSAGE_DIFFERS,
    ),
    "message-dead-letter": Rules(
        equal=(
            "transactionId",
            "queue",
            "partition",
            "queuePath",
            "payload",
            "status",
            "errorMessage",
            "retryCount",
            "consumerGroups[].name",
        ),
        order={"consumerGroups[]": "name"},
        differs=_MESSAGE_DIFFERS,
    ),
    "message-delete": Rules(equal=("success", "transactionId")),
    "traces-by-name": Rules(
        equal=(
            "total",
            "traces[].transaction_id",
            "traces[].consumer_group",
            "traces[].event_type",
            "traces[].data",
            "traces[].partition_name",
            "traces[].queue_name",
            "traces[].trace_names",
        ),
        order={"traces[]": "transaction_id"},
        differs={"traces[].message_payload": "the traced message's payload is not joined here"},
    ),
    "traces-names": Rules(
        equal=(
            "total",
            "trace_names[].trace_name",
            "trace_names[].trace_count",
            "trace_names[].message_count",
            "pagination.limit",
            "pagination.offset",
        ),
        order={"trace_names[]": "trace_name"},
    ),
    "traces-message": Rules(
        equal=(
            "traces[].consumer_group",
            "traces[].event_type",
            "traces[].data",
            "traces[].trace_names",
        ),
    ),
    "status": Rules(
        equal=(
            "bucketMinutes",
            f"{_Q}.name",
            f"{_Q}.namespace",
            f"{_Q}.task",
            f"{_Q}.partitions",
            f"{_Q}.totalConsumed",
            *(f"messages.{k}" for k in _COUNTS),
            "messages.requests.push",
            "messages.requests.pop",
            "messages.requests.ack",
            "messages.batchEfficiency.push",
            "messages.batchEfficiency.pop",
            "messages.batchEfficiency.ack",
            "leases.active",
            "leases.partitionsWithLeases",
            "deadLetterQueue.totalMessages",
            "errors.dbErrors",
            "errors.ackFailed",
            "errors.dlqMessages",
        ),
        sums=tuple(f"throughput[].{k}" for k in _SERIES_SUMS),
        order={_Q: "name"},
        differs={
            "workers": _NO_WORKERS,
            "throughput[].maxLagMs": "the longest wait of an interval is not measured here",
            "throughput[].minFreeSlots": _NOT_MEASURED,
            "leases.totalBatchSize": "a lease's first size is not kept here: this is what the "
            "leases still hold (the original's totalBatchSize less totalAcked)",
            "leases.totalAcked": "acks inside a lease move its cursor here; these are acks "
            "recorded out of order",
            "deadLetterQueue.affectedPartitions": "the original writes 0",
        },
    ),
    "status-queues": Rules(
        equal=(
            *(
                f"{_Q}.{k}"
                for k in (
                    "name",
                    "namespace",
                    "task",
                    "partitions",
                    "messages.total",
                    "messages.pending",
                    "messages.processing",
                )
            ),
            "pagination.limit",
            "pagination.offset",
        ),
        order={_Q: "name"},
    ),
    "status-queue": Rules(
        equal=(
            "queue.name",
            "queue.namespace",
            "queue.task",
            "queue.priority",
            "queue.config.leaseTime",
            "queue.config.retryLimit",
            "queue.config.retryDelay",
            "queue.config.maxQueueSize",
            "queue.config.deadLetterQueue",
            "partitions[].name",
            *(f"partitions[].messages.{k}" for k in _COUNTS),
            *(f"partitions[].stats.{k}" for k in _COUNTS),
            *(f"totals.{k}" for k in _COUNTS),
            *(f"totals.messages.{k}" for k in _COUNTS),
        ),
        order={"partitions[]": "name"},
        differs={
            "partitions[].cursor": "the original adds up its consumers' counters once per "
            "statistics row (a product of its joins); not kept here",
            "queue.config.ttl": "the original's default ttl of a configured queue",
        },
    ),
    "status-queue-messages": Rules(
        equal=("[].transactionId", "[].queue", "[].partition", "[].queuePath"),
        order={"[]": "transactionId"},
        differs={"[].status": _MESSAGE_STATUS},
    ),
    "status-analytics": Rules(
        equal=("interval",),
        sums=("dataPoints[].messages",),
    ),
    "consumer-groups": Rules(
        equal=tuple(
            f"[].{k}"
            for k in ("name", "queueName", "topics", "members", "partitionsWithLag", "state")
        ),
        order={"[]": "name+queueName"},
        differs={
            "[].subscriptionMode": "the original writes null for a group subscribed to every "
            "message (it records no subscription); here 'all'",
        },
    ),
    "consumer-group": Rules(
        equal=(
            "*.partitions[].partition",
            "*.partitions[].offsetLag",
            "*.partitions[].leaseActive",
        ),
        order={"*.partitions[]": "partition"},
        differs={"*.partitions[].totalConsumed": "a partition's consumed count is not kept here"},
    ),
    "consumer-groups-lagging": Rules(
        equal=("[].consumer_group", "[].queue_name", "[].partition_name", "[].offset_lag"),
        order={"[]": "consumer_group+queue_name+partition_name"},
        differs={
            "[].worker_id": "no worker holds a partition here",
            "[].last_consumed_at": "the original's time of a group's last ack there; here its "
            "last pop (null before one)",
        },
    ),
    "dlq": Rules(
        equal=(
            "messages[].consumerGroup",
            "messages[].transactionId",
            "messages[].queue",
            "messages[].partition",
            "messages[].errorMessage",
            "messages[].retryCount",
            "messages[].data",
        ),
        order={"messages[]": "consumerGroup+transactionId"},
    ),
    "health": Rules(
        equal=("status", "database"),
        differs={
            "queen": "the original's build and process figures",
            "shared_state": "the original's state sync between servers",
            "worker_id": _NO_WORKERS,
        },
    ),
    "metrics": Rules(),
    "system-maintenance": Rules(equal=("maintenanceMode",)),
    "system-maintenance-pop": Rules(equal=("popMaintenanceMode",)),
    "analytics-system-metrics": Rules(
        equal=("bucketMinutes",),
        differs={
            "replicas[].port": "one port is the service's; not named per replica here",
            "replicas[].workerId": "the process id here (a number)",
            "replicas[].timeSeries[].metrics.registries": "the original's response registries",
            "replicas[].timeSeries[].metrics.shared_state": "the original's state sync "
            "between servers",
        },
    ),
    "analytics-worker-metrics": Rules(
        equal=(
            "bucketMinutes",
            *(
                f"summary.{k}"
                for k in (
                    "totalPushMessages",
                    "totalPopMessages",
                    "totalAckMessages",
                    "totalPushRequests",
                    "totalPopRequests",
                    "totalAckRequests",
                    "totalDbErrors",
                    "totalAckFailed",
                    "totalDlq",
                    "pendingMessages",
                )
            ),
        ),
        sums=tuple(
            f"timeSeries[].{k}"
            for k in (
                "pushMessages",
                "popMessages",
                "ackMessages",
                "dlqCount",
                "ackFailed",
                "dbErrors",
            )
        ),
        differs={
            "workers": _NO_WORKERS,
            "queues": "per-queue pops of the window are in /analytics/queue-lag here",
            "timeSeries[].avgFreeSlots": _NOT_MEASURED,
            "timeSeries[].minFreeSlots": _NOT_MEASURED,
            "timeSeries[].dbConnections": _NOT_MEASURED,
            "timeSeries[].maxLagMs": "the longest wait of an interval is not measured here",
        },
    ),
    "analytics-queue-lag": Rules(
        sums=("[].popCount",),
        differs={
            "[]": "the original writes a row per worker, queue and minute; here one per queue "
            "and minute of every process together (the pops are compared summed)"
        },
    ),
    "analytics-queue-ops": Rules(
        equal=("bucketMinutes", "queues"),
        sums=tuple(
            f"series[].{k}"
            for k in ("pushMessages", "popMessages", "popEmpty", "ackSuccess", "ackFailed")
        ),
        differs={
            "series": "the original writes a row per worker and minute; here one per queue and "
            "minute of every process together, and requests, transactions, partition counts "
            "and parked pops are not kept per queue (null)",
        },
    ),
    "analytics-queue-parked-replicas": Rules(equal=("bucketMinutes", "series", "replicas")),
    "analytics-retention": Rules(equal=("bucketMinutes", "series", "totals")),
    "analytics-postgres-stats": Rules(
        differs={
            "cacheSummary": "cache hit ratios of this database (null before a block is read)",
            "tableCache": "this broker's tables",
            "indexCache": "this broker's indexes",
            "tableSizes": "this broker's tables",
            "deadTuples": "this broker's tables",
            "hotUpdates": "this broker's tables",
            "bufferUsage": "pg_buffercache is not installed here",
        },
    ),
    "migration-status": Rules(equal=("status",)),
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _matches(pattern: str, path: str) -> bool:
    a, b = pattern.split("."), path.split(".")
    return len(a) == len(b) and all(x == "*" or x == y for x, y in zip(a, b, strict=True))


def _under(pattern: str, path: str) -> bool:
    a, b = pattern.split("."), path.split(".")
    return len(a) <= len(b) and all(x == "*" or x == y for x, y in zip(a, b, strict=False))


@dataclass
class Outcome:
    """What one comparison found: the paths compared by value, by type, skipped as differing,
    and every mismatch."""

    equal: list[str] = field(default_factory=list)
    typed: list[str] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def _pair_lists(
    path: str, theirs: list[Any], ours: list[Any], rules: Rules, out: Outcome
) -> Iterator[tuple[Any, Any]]:
    key = next((k for p, k in rules.order.items() if _matches(p, path)), None)
    if key is None:
        if len(ours) < len(theirs):
            out.problems.append(f"{path}: {len(ours)} elements here, {len(theirs)} there")
        yield from zip(theirs, ours, strict=False)
        return
    by_key = {_pick(item, key): item for item in ours if isinstance(item, dict)}
    for item in theirs:
        wanted = _pick(item, key)
        if wanted not in by_key:
            out.problems.append(f"{path}: no element with {key}={wanted!r} here")
            continue
        yield item, by_key[wanted]


def _pick(item: Any, key: str) -> Any:
    parts = []
    for part in key.split("+"):
        value = item
        for step in part.split("."):
            value = value.get(step) if isinstance(value, dict) else None
        parts.append(value)
    return tuple(parts) if len(parts) > 1 else parts[0]


def _walk(path: str, theirs: Any, ours: Any, rules: Rules, out: Outcome) -> None:
    if any(_under(p, path) for p in rules.differs):
        out.skipped.add(path)
        return
    if path and any(_matches(p, path) for p in rules.equal):
        out.equal.append(path)
        if theirs != ours:
            out.problems.append(f"{path}: {ours!r} here, {theirs!r} there")
        return
    if theirs is None:
        return  # the original had not computed it: any type will do
    if _kind(theirs) != _kind(ours):
        where = "missing" if ours is None and path else f"a {_kind(ours)}"
        out.problems.append(f"{path or '(answer)'}: {where} here, a {_kind(theirs)} there")
        return
    if isinstance(theirs, dict):
        for key, value in theirs.items():
            sub = f"{path}.{key}" if path else key
            if key not in ours:
                if any(_under(p, sub) for p in rules.differs):
                    out.skipped.add(sub)
                else:
                    out.problems.append(f"{sub}: missing here")
                continue
            _walk(sub, value, ours[key], rules, out)
    elif isinstance(theirs, list):
        sub = f"{path}[]"
        if any(_under(p, sub) for p in rules.differs):
            out.skipped.add(sub)
            return
        for a, b in _pair_lists(sub, theirs, ours, rules, out):
            _walk(sub, a, b, rules, out)
    elif path:
        out.typed.append(path)


def _total(answer: Any, path: str) -> float:
    """The sum over a list of one key of its elements (``throughput[].ingested``)."""
    head, key = path.split("[].", 1)
    items: Any = answer
    for step in head.split(".") if head else ():
        items = items.get(step) if isinstance(items, dict) else None
    return sum((i.get(key) or 0) for i in (items or []) if isinstance(i, dict))


def compare(route: str, theirs: Any, ours: Any) -> Outcome:
    """This broker's answer ``ours`` against the original's ``theirs`` for ``route``."""
    out = Outcome()
    rules = RULES.get(route, Rules())
    _walk("", theirs, ours, rules, out)
    for path in rules.sums:
        out.equal.append(f"sum {path}")
        a, b = _total(theirs, path), _total(ours, path)
        if a != b:
            out.problems.append(f"sum {path}: {b!r} here, {a!r} there")
    out.problems = list(dict.fromkeys(out.problems))
    out.equal = list(dict.fromkeys(out.equal))
    out.typed = list(dict.fromkeys(out.typed))
    return out

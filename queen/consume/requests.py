"""Validation of consume-side requests: pop parameters, acks, transactions, admin calls.

Pure functions, no I/O. The HTTP routes and the embedding API both build their requests here,
so both refuse the same input with the same messages (:class:`InvalidRequest`, HTTP 400).
The rules of a pop (:func:`checked_pop`), of a queue's configuration, of a queue name to
delete and of a lease extension are applied by the consume service itself, whoever calls it;
the readers here (:func:`pop_request`, :func:`lease_seconds`) only read the wire's types.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from queen.consume.errors import InvalidRequest
from queen.consume.policy import parse_timestamp, subscription_of
from queen.intake import prepare_push
from queen.model import InvalidPush
from queen.names import name_problem, text_problem
from queen.records import (
    QUEUE_MODE,
    AckItem,
    AckStatus,
    DlqQuery,
    PopRequest,
    SeekTarget,
    TransactionRequest,
    TxAck,
    TxPush,
)

_STATUSES: dict[str, AckStatus] = {
    "completed": "completed",
    "success": "completed",
    "failed": "failed",
    "dlq": "dlq",
    "retry": "retry",
}
_MAX_BIGINT = (1 << 63) - 1
MAX_TIMEOUT_MS = 3_600_000
MAX_PARTITIONS = 1000
MAX_LEASE_SECONDS = 86_400 * 7
NEVER_LEASE = "00000000-0000-0000-0000-000000000000"
"""Stands for a lease id that is not a UUID: it can never be a live lease."""


def name(value: Any, what: str, *, required: bool = True) -> str | None:
    """A queue, partition or consumer-group name; ``None`` when absent and not required."""
    if value is None or value == "":
        if required:
            raise InvalidRequest(f"{what} is required")
        return None
    problem = name_problem(value)
    if problem is not None:
        raise InvalidRequest(f"{what} {problem}")
    return value  # type: ignore[no-any-return]


def text(value: str, what: str) -> str:
    """A free text bound for a text column (a transaction id, an error message): refused when
    it holds what PostgreSQL text cannot (NUL, unpaired surrogates)."""
    problem = text_problem(value)
    if problem is not None:
        raise InvalidRequest(f"{what} {problem}")
    return value


def group_of(value: Any) -> str:
    """The consumer group an API call names; none (or null) means queue mode."""
    return name(value, "consumerGroup", required=False) or QUEUE_MODE


# --- pop -------------------------------------------------------------------------------------


def flag(value: str | bool | None, what: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    if type(value) is bool:
        return value
    lowered = str(value).strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidRequest(f"{what} must be true or false")


def _parsed(value: str | int | None, what: str) -> int | None:
    if value is None or value == "":
        return None
    if type(value) is bool:
        raise InvalidRequest(f"{what} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"{what} must be an integer") from None


def count(value: str | int | None, what: str, lowest: int, highest: int) -> int | None:
    number = _parsed(value, what)
    if number is not None and not lowest <= number <= highest:
        raise InvalidRequest(f"{what} must be between {lowest} and {highest}")
    return number


def integer(value: str | int | None, what: str) -> int | None:
    """An integer parameter read for its type only, its range left to the rules that follow:
    a value beyond 64 bits is taken as the nearest 64-bit one, so those rules word the error
    with their own range."""
    number = _parsed(value, what)
    return None if number is None else max(-_MAX_BIGINT, min(_MAX_BIGINT, number))


def pop_request(
    args: Mapping[str, Any], *, queue: str | None, partition: str | None = None
) -> PopRequest:
    """Read the query parameters of a pop route: their types only (the rules are
    :func:`checked_pop`'s, which the consume service applies)."""
    try:
        subscription = subscription_of(args.get("subscriptionMode"), args.get("subscriptionFrom"))
    except ValueError:
        raise InvalidRequest("subscriptionFrom must be 'now' or an ISO-8601 timestamp") from None
    timeout = integer(args.get("timeout"), "timeout")
    return PopRequest(
        queue=queue,
        partition=partition,
        namespace=args.get("namespace") or "",
        task=args.get("task") or "",
        consumer_group=args.get("consumerGroup") or QUEUE_MODE,
        batch=integer(args.get("batch"), "batch"),
        partitions=integer(args.get("partitions"), "partitions"),
        wait=flag(args.get("wait"), "wait", False),
        timeout_ms=30_000 if timeout is None else timeout,
        auto_ack=flag(args.get("autoAck"), "autoAck", False),
        subscription=subscription,
        autopilot=flag(args.get("autopilot"), "autopilot", False),
    )


def checked_pop(request: PopRequest, max_batch: int) -> PopRequest:
    """The rules of a pop on a typed request (whoever made it): names, a queue or a
    namespace/task, the ranges of batch, partitions and timeout."""
    queue = name(request.queue, "queue", required=False)
    namespace = name(request.namespace, "namespace", required=False) or ""
    task = name(request.task, "task", required=False) or ""
    if queue is None and not (namespace or task):
        raise InvalidRequest("a queue, a namespace or a task is required")
    count(request.batch, "batch", 1, max_batch)
    count(request.partitions, "partitions", 1, MAX_PARTITIONS)
    count(request.timeout_ms, "timeout", 0, MAX_TIMEOUT_MS)
    return dataclasses.replace(
        request,
        queue=queue,
        partition=name(request.partition, "partition", required=False),
        namespace=namespace,
        task=task,
        consumer_group=group_of(request.consumer_group),
    )


# --- acks ------------------------------------------------------------------------------------


def _partition_id(value: Any, where: str) -> int | None:
    if value is None or value == "":
        raise InvalidRequest(f"{where}partitionId is required to ensure message uniqueness")
    if type(value) is int:
        return value if 0 < value <= _MAX_BIGINT else None
    if type(value) is not str:
        raise InvalidRequest(f"{where}partitionId must be a string")
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    number = int(text)
    return number if 0 < number <= _MAX_BIGINT else None


def partition_id(value: Any, where: str = "") -> int | None:
    """A ``partitionId`` as a client sends it back; None when it names no partition here."""
    return _partition_id(value, where)


def _lease_id(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if type(value) is not str:
        raise InvalidRequest(f"{where}leaseId must be a string")
    return _canonical_lease(value)


@functools.lru_cache(maxsize=1024)
def _canonical_lease(value: str) -> str:
    """A lease id as PostgreSQL writes the uuid (NEVER_LEASE when it is none). The acks of one
    batch mostly share one lease id: they parse it once."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return NEVER_LEASE


def ack_item(raw: Any, *, where: str = "", group: Any = None, default_status: str = "") -> AckItem:
    """Validate one acknowledgment object. ``group`` overrides the item's consumerGroup."""
    if type(raw) is not dict:
        raise InvalidRequest(f"{where.rstrip('.') or 'body'} must be an object")
    transaction_id = raw.get("transactionId")
    if transaction_id is None or transaction_id == "":
        transaction_id = raw.get("id")
    if type(transaction_id) is not str or not transaction_id:
        raise InvalidRequest(f"{where}transactionId is required")
    text(transaction_id, f"{where}transactionId")
    status_text = raw.get("status", default_status) or default_status
    if type(status_text) is not str or status_text.lower() not in _STATUSES:
        raise InvalidRequest(f"{where}status must be one of completed, success, failed, dlq, retry")
    error = raw.get("error")
    if error is not None and type(error) is not str:
        raise InvalidRequest(f"{where}error must be a string or null")
    if error is not None:
        text(error, f"{where}error")
    return AckItem(
        transaction_id=transaction_id,
        partition_id=_partition_id(raw.get("partitionId"), where),
        status=_STATUSES[status_text.lower()],
        consumer_group=group_of(raw.get("consumerGroup") if group is None else group),
        error=error,
        lease_id=_lease_id(raw.get("leaseId"), where),
    )


def checked_ack(item: AckItem) -> AckItem:
    """The rules of an ack on a typed item (the embedding API's): a transaction id, a known
    status, a valid group name; a lease id that is not a UUID can never match a live lease."""
    if type(item.transaction_id) is not str or not item.transaction_id:
        raise InvalidRequest("transactionId is required")
    text(item.transaction_id, "transactionId")
    if item.status not in ("completed", "failed", "dlq", "retry"):
        raise InvalidRequest("status must be one of completed, failed, dlq, retry")
    if item.error is not None and type(item.error) is not str:
        raise InvalidRequest("error must be a string or null")
    if item.error is not None:
        text(item.error, "error")
    return dataclasses.replace(
        item,
        consumer_group=group_of(item.consumer_group),
        lease_id=_lease_id(item.lease_id, ""),
    )


def ack_batch(body: Any) -> list[AckItem]:
    """``POST /api/v1/ack/batch``: ``{"acknowledgments": [...], "consumerGroup": g|null}``."""
    if type(body) is not dict:
        raise InvalidRequest("body must be a JSON object")
    items = body.get("acknowledgments")
    if type(items) is not list:
        raise InvalidRequest("acknowledgments array is required")
    group = group_of(body.get("consumerGroup"))
    return [
        ack_item(raw, where=f"acknowledgments[{i}].", group=group, default_status="completed")
        for i, raw in enumerate(items)
    ]


# --- transactions ----------------------------------------------------------------------------


def transaction_request(body: Any) -> TransactionRequest:
    """``POST /api/v1/transaction``. Push items keep their ``traceId``."""
    if type(body) is not dict:
        raise InvalidRequest("body must be a JSON object")
    for rider in ("kv", "timers"):
        if body.get(rider):
            raise InvalidRequest(f"{rider} operations are not supported by this broker")
    operations = body.get("operations")
    if type(operations) is not list:
        raise InvalidRequest("operations array is required")
    if not operations:
        raise InvalidRequest("operations array cannot be empty")
    required_raw = body.get("requiredLeases") or []
    if type(required_raw) is not list or any(type(x) is not str for x in required_raw):
        raise InvalidRequest("requiredLeases must be an array of lease ids")
    required = list(dict.fromkeys(_lease_id(x, "requiredLeases: ") for x in required_raw))
    acks: list[TxAck] = []
    pushes: list[TxPush] = []
    flat = 0
    for i, op in enumerate(operations):
        where = f"operations[{i}]."
        if type(op) is not dict:
            raise InvalidRequest(f"operations[{i}] must be an object")
        kind = op.get("type")
        if kind == "ack":
            # an ack without a lease id acts under the required lease holding its partition
            acks.append(TxAck(flat, ack_item(op, where=where, default_status="completed")))
            flat += 1
        elif kind == "push":
            try:
                prepared = prepare_push(op.get("items"), keep_trace_ids=True)
            except InvalidPush as exc:
                raise InvalidRequest(f"{where}{exc}") from None
            pushes.append(TxPush(flat, prepared))
            flat += prepared.count
        else:
            raise InvalidRequest(f"{where}type must be 'ack' or 'push'")
    return TransactionRequest(
        acks=acks,
        pushes=pushes,
        required_leases=[x for x in required if x is not None],
        size=flat,
    )


# --- admin -----------------------------------------------------------------------------------


def dlq_query(args: Mapping[str, Any]) -> DlqQuery:
    def moment(key: str) -> datetime | None:
        text = args.get(key)
        if not text:
            return None
        try:
            return parse_timestamp(text)
        except ValueError:
            raise InvalidRequest(f"{key} must be an ISO-8601 timestamp") from None

    return DlqQuery(
        queue=name(args.get("queue"), "queue", required=False),
        consumer_group=name(args.get("consumerGroup"), "consumerGroup", required=False),
        partition=name(args.get("partition"), "partition", required=False),
        since=moment("from"),
        until=moment("to"),
        limit=count(args.get("limit"), "limit", 1, 10_000) or 100,
        offset=count(args.get("offset"), "offset", 0, _MAX_BIGINT) or 0,
    )


def lease_seconds(body: Any) -> int | None:
    """The optional ``{"seconds": n}`` of a lease extension (an empty body is fine); its
    range is :func:`checked_lease_seconds`'s."""
    if body is None or body == {}:
        return None
    if type(body) is not dict:
        raise InvalidRequest("body must be a JSON object or empty")
    return integer(body.get("seconds"), "seconds")


def checked_lease_seconds(seconds: int | None) -> int | None:
    """How long a lease extension is: none (the queue's lease time), or 1 s to a week."""
    return count(seconds, "seconds", 1, MAX_LEASE_SECONDS)


def lease_id(value: Any) -> str:
    if type(value) is not str or not value:
        raise InvalidRequest("leaseId is required")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRequest("leaseId must be a UUID") from None


def subscription_timestamp(body: Any) -> datetime:
    if type(body) is not dict or body.get("subscriptionTimestamp") in (None, ""):
        raise InvalidRequest("subscriptionTimestamp is required")
    value = body["subscriptionTimestamp"]
    if type(value) is not str:
        raise InvalidRequest("subscriptionTimestamp must be an ISO-8601 string")
    try:
        return parse_timestamp(value)
    except ValueError:
        raise InvalidRequest("subscriptionTimestamp must be an ISO-8601 timestamp") from None


def seek_target(body: Any, *, empty_means_end: bool = False) -> SeekTarget:
    """``{"toEnd": true}`` or ``{"timestamp": ISO}`` (``toEnd`` wins when both are given);
    with ``empty_means_end`` (one partition) an empty body or ``{}`` means the end."""
    if empty_means_end and (body is None or body == {}):
        return SeekTarget(to_end=True)
    if type(body) is not dict:
        raise InvalidRequest("body must be a JSON object")
    to_end = body.get("toEnd", False)
    if type(to_end) is not bool:
        raise InvalidRequest("toEnd must be true or false")
    if to_end:
        return SeekTarget(to_end=True)
    value = body.get("timestamp")
    if value is None or value == "":
        raise InvalidRequest("Must specify either 'toEnd': true or 'timestamp'")
    if type(value) is not str:
        raise InvalidRequest("timestamp must be an ISO-8601 string")
    try:
        return SeekTarget(to_end=False, at=parse_timestamp(value))
    except ValueError:
        raise InvalidRequest("timestamp must be an ISO-8601 timestamp") from None


def enabled_flag(body: Any) -> bool:
    if type(body) is not dict or type(body.get("enabled")) is not bool:
        raise InvalidRequest("enabled (boolean) is required")
    return bool(body["enabled"])

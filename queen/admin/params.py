"""Query parameters of the admin API, validated. Pure functions; bad input raises
:class:`queen.consume.errors.InvalidRequest` (HTTP 400)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from queen.consume import requests
from queen.consume.errors import InvalidRequest
from queen.consume.policy import parse_timestamp
from queen.records import QUEUE_MODE

MAX_LIMIT = 1000
MAX_OFFSET = 1_000_000
MESSAGE_STATUSES = ("pending", "processing", "completed", "dead_letter")


@dataclass(frozen=True, slots=True)
class Page:
    limit: int
    offset: int


def page(args: Mapping[str, Any], *, default_limit: int = 100) -> Page:
    """``limit`` (1..1000) and ``offset`` (0..1,000,000): every list is bounded."""
    limit = requests.count(args.get("limit"), "limit", 1, MAX_LIMIT)
    offset = requests.count(args.get("offset"), "offset", 0, MAX_OFFSET)
    return Page(default_limit if limit is None else limit, offset or 0)


def moment(args: Mapping[str, Any], key: str) -> datetime | None:
    text = args.get(key)
    if not text:
        return None
    try:
        return parse_timestamp(str(text))
    except ValueError:
        raise InvalidRequest(f"{key} must be an ISO-8601 timestamp") from None


def window(
    args: Mapping[str, Any], *, default: timedelta, now: datetime | None = None
) -> tuple[datetime, datetime]:
    """``from``/``to``: by default the last ``default`` until now; ``from`` must precede ``to``."""
    now = now or datetime.now(UTC)
    until = moment(args, "to") or now
    since = moment(args, "from") or until - default
    if since >= until:
        raise InvalidRequest("from must be before to")
    return since, until


def optional_name(args: Mapping[str, Any], key: str) -> str | None:
    return requests.name(args.get(key), key, required=False)


def status(args: Mapping[str, Any]) -> str | None:
    value = args.get("status")
    if not value:
        return None
    if value == "dlq":
        value = "dead_letter"
    if value not in MESSAGE_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(MESSAGE_STATUSES)}")
    return str(value)


def transaction_id(args: Mapping[str, Any]) -> str | None:
    """``transactionId``: a message's transaction id to look for (at most 256 characters)."""
    value = args.get("transactionId")
    if not value:
        return None
    if len(value) > 256:
        raise InvalidRequest("transactionId must be at most 256 characters")
    return requests.text(str(value), "transactionId")


def partition_id(value: str) -> int:
    """A partition id in a path: our ids are positive integers."""
    if not value.isdigit() or len(value) > 18:
        raise InvalidRequest("partitionId must be a partition id (a positive integer)")
    return int(value)


PARTITION_ORDERS = ("name", "pending", "oldest", "lease")


def partition_order(args: Mapping[str, Any]) -> str:
    """``sort`` of a queue's partitions: ``name`` (the default), ``pending`` (most first),
    ``oldest`` (oldest pending message first) or ``lease`` (soonest lease end first)."""
    value = args.get("sort") or "name"
    if value not in PARTITION_ORDERS:
        raise InvalidRequest(f"sort must be one of {', '.join(PARTITION_ORDERS)}")
    return str(value)


def min_lag_seconds(args: Mapping[str, Any]) -> int:
    value = requests.count(args.get("minLagSeconds"), "minLagSeconds", 0, 10 * 365 * 86400)
    return 60 if value is None else value


MAX_ERROR_MESSAGE = 10_000


@dataclass(frozen=True, slots=True)
class RetryFilter:
    """Which dead letters a bulk retry takes: a queue's, narrowed by group, partition and
    failure time (inclusive)."""

    queue: str
    consumer_group: str | None = None
    partition: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class DeadLetterRequest:
    """Moving a message to a group's DLQ by hand (queue mode when no group is named)."""

    consumer_group: str
    error_message: str | None


def _object(body: Any, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if body is None:
        return {}
    if type(body) is not dict:
        raise InvalidRequest("the body must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return body


def _body_name(body: Mapping[str, Any], key: str) -> str | None:
    """An optional name in a body: absent or null is none; an empty string is refused (it
    would widen the action to everything)."""
    if body.get(key) == "":
        raise InvalidRequest(f"{key} must not be empty (leave it out for all)")
    return requests.name(body.get(key), key, required=False)


def _body_moment(body: Mapping[str, Any], key: str) -> datetime | None:
    value = body.get(key)
    if value is not None and type(value) is not str:
        raise InvalidRequest(f"{key} must be an ISO-8601 string")
    return moment(body, key)


def retry_filter(body: Any) -> RetryFilter:
    """The body of ``POST /api/v1/dlq/retry``: ``queue`` (required), ``consumerGroup``,
    ``partition``, ``from`` and ``to`` (failure times, inclusive)."""
    fields = _object(body, ("queue", "consumerGroup", "partition", "from", "to"))
    queue = requests.name(fields.get("queue"), "queue")
    assert queue is not None
    since, until = _body_moment(fields, "from"), _body_moment(fields, "to")
    if since is not None and until is not None and since > until:
        raise InvalidRequest("from must not be after to")
    return RetryFilter(
        queue=queue,
        consumer_group=_body_name(fields, "consumerGroup"),
        partition=_body_name(fields, "partition"),
        since=since,
        until=until,
    )


def dead_letter_request(body: Any) -> DeadLetterRequest:
    """The optional body of ``POST /api/v1/messages/{p}/{tx}/dlq``: ``consumerGroup`` (queue
    mode when absent) and ``errorMessage``."""
    fields = _object(body, ("consumerGroup", "errorMessage"))
    error = fields.get("errorMessage")
    if error is not None and type(error) is not str:
        raise InvalidRequest("errorMessage must be a string")
    if error is not None and len(error) > MAX_ERROR_MESSAGE:
        raise InvalidRequest(f"errorMessage must be at most {MAX_ERROR_MESSAGE} characters")
    if error is not None:
        requests.text(error, "errorMessage")
    return DeadLetterRequest(_body_name(fields, "consumerGroup") or QUEUE_MODE, error or None)

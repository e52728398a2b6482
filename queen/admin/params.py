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
    return str(value)


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

"""The query parameters every admin read shares, validated: pages, time windows, names in a
query string or a path. Pure functions; bad input raises
:class:`queen.consume.errors.InvalidRequest` (HTTP 400). Each subject's typed query is parsed
by its own module from these (:func:`queen.admin.queues.queue_query`, ...), once, by HTTP.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from queen.consume import requests
from queen.consume.errors import InvalidRequest
from queen.consume.policy import parse_timestamp

Args = Mapping[str, Any]  # a query string (or a JSON body) as read

MAX_LIMIT = 1000
MAX_OFFSET = 1_000_000


@dataclass(frozen=True, slots=True)
class Page:
    limit: int
    offset: int


FIRST_PAGE = Page(100, 0)  # a list's page when none is asked


class TimeRange(NamedTuple):
    """The window a list or a series covers: ``since`` up to ``until``."""

    since: datetime
    until: datetime


def page(args: Args, *, default_limit: int = 100) -> Page:
    """``limit`` (1..1000) and ``offset`` (0..1,000,000): every list is bounded."""
    limit = requests.count(args.get("limit"), "limit", 1, MAX_LIMIT)
    offset = requests.count(args.get("offset"), "offset", 0, MAX_OFFSET)
    return Page(default_limit if limit is None else limit, offset or 0)


def paged(args: Args) -> bool:
    """Whether the client asked for a page (``limit`` or ``offset``) at all."""
    return bool(args.get("limit")) or bool(args.get("offset"))


def moment(args: Args, key: str) -> datetime | None:
    text = args.get(key)
    if not text:
        return None
    try:
        return parse_timestamp(str(text))
    except ValueError:
        raise InvalidRequest(f"{key} must be an ISO-8601 timestamp") from None


def window(args: Args, *, default: timedelta, now: datetime | None = None) -> TimeRange:
    """``from``/``to``: by default the last ``default`` until now; ``from`` must precede ``to``."""
    now = now or datetime.now(UTC)
    until = moment(args, "to") or now
    since = moment(args, "from") or until - default
    if since >= until:
        raise InvalidRequest("from must be before to")
    return TimeRange(since, until)


def optional_name(args: Args, key: str) -> str | None:
    return requests.name(args.get(key), key, required=False)


def name_in_path(value: str, what: str) -> str:
    """A name from a path, checked like every other name."""
    checked = requests.name(value, what)
    if checked is None:  # pragma: no cover - required=True never returns None
        raise InvalidRequest(f"{what} is required")
    return checked


def partition_id(value: str) -> int:
    """A partition id in a path: our ids are positive integers."""
    if not value.isdigit() or len(value) > 18:
        raise InvalidRequest("partitionId must be a partition id (a positive integer)")
    return int(value)


async def every_row(fetch: Callable[..., Awaitable[Sequence[Any]]]) -> list[Any]:
    """Every row of a paged store read, ``fetch(limit=..., offset=...)`` a page of
    :data:`MAX_LIMIT` at a time."""
    rows: list[Any] = []
    while True:
        got = await fetch(limit=MAX_LIMIT, offset=len(rows))
        rows.extend(got)
        if len(got) < MAX_LIMIT:
            return rows

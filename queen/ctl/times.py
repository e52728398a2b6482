"""Durations and points in time as the operator commands take them.

A duration is a number of seconds (``2.5``) or a Go-style duration (``500ms``, ``10s``,
``1m30s``, ``2h``), as queenctl's flags take them. A point in time is an ISO-8601 / RFC 3339
timestamp, a date (``2026-05-06``, midnight UTC), Unix seconds (``1714998000``), ``now``, or a
time ago (``15m ago``, ``2h``, ``1d``, ``1w``); the broker is always sent ISO-8601 in UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import click

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DAYS = re.compile(r"(\d+)([dw])")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def duration_s(text: str) -> float:
    """Seconds in ``text`` (see the module); ``ValueError`` if it is neither form."""
    raw = text.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    days = _DAYS.fullmatch(raw)
    if days:
        return int(days.group(1)) * (86400.0 if days.group(2) == "d" else 7 * 86400.0)
    pos, total = 0, 0.0
    while pos < len(raw):
        part = _PART.match(raw, pos)
        if part is None:
            raise ValueError(f"not a duration: {text!r} (e.g. 2.5, 500ms, 10s, 1m30s)")
        total += float(part.group(1)) * _UNITS[part.group(2)]
        pos = part.end()
    if not raw:
        raise ValueError("empty duration")
    return total


class Duration(click.ParamType[float]):
    """A duration option: seconds, or a Go-style duration."""

    name = "duration"

    def __init__(self, minimum: float = 0.0) -> None:
        self.minimum = minimum

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            try:
                seconds = duration_s(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if seconds < self.minimum:
            self.fail(f"{value} is less than {self.minimum:g} s", param, ctx)
        return seconds


def moment(text: str, *, now: datetime | None = None) -> datetime | None:
    """The point in time ``text`` names (UTC); ``None`` for ``beginning``/``earliest``/
    ``start``. ``ValueError`` when it is none of the forms of the module."""
    raw = text.strip()
    low = raw.lower()
    now = now or datetime.now(UTC)
    if not raw:
        raise ValueError("empty time")
    if low == "now":
        return now
    if low in ("beginning", "earliest", "start"):
        return None
    ago = low.removesuffix(" ago").strip()
    try:
        if not re.fullmatch(r"\d+(\.\d*)?", ago):  # a bare number is Unix seconds, not an age
            return now - timedelta(seconds=duration_s(ago))
    except ValueError:
        pass
    if re.fullmatch(r"\d{10,}", raw):
        return datetime.fromtimestamp(int(raw), UTC)
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (ISO-8601, a date, Unix seconds, now, or e.g. '15m ago')"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def iso(at: datetime) -> str:
    """``at`` as the broker takes it: ISO-8601 in UTC with milliseconds."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_moment(text: str, what: str) -> str:
    """``text`` (see :func:`moment`) as ISO-8601 for the broker; the beginning is the epoch.
    A bad value is a usage error naming ``what``."""
    from queen.ctl.client import usage

    try:
        at = moment(text)
    except ValueError as exc:
        raise usage(f"{what}: {exc}") from None
    return iso(at if at is not None else EPOCH)

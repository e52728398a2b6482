"""Recent counter history of the broker, for rates and charts.

:class:`History` keeps a reading of the service's counters (:meth:`queen.metrics.Figures.read`:
this process alone, or every worker of ``queen serve --workers N`` summed) every ``step_s``
seconds for ``span_s`` seconds (a ring; the oldest point falls off). Rates are differences
between points, so every worker answers the same rates. Sampling is synchronous and cheap (a
dict copy, or reading the workers' few small files): :meth:`sample` is called by the admin
reads and by :meth:`run`, the loop that keeps it going while the broker serves.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import trio

from queen.metrics import Figures, LocalFigures, Metrics
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.admin")


@dataclass(frozen=True, slots=True)
class Rates:
    """Per-second rates of this process over one interval of its history."""

    ingested_per_s: float  # items pushed and queued
    pop_per_s: float  # messages popped
    processed_per_s: float  # acks


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One interval of the service's history, ending ``at``; ``average_lag_ms``: how long
    the messages popped in it had waited (None when none was)."""

    at: datetime
    span_s: float
    rates: Rates
    dead_letter_per_s: float
    push_requests_per_s: float
    ingested: int
    processed: int
    cpu_percent: float
    rss_bytes: int  # at the end of the interval
    popped: int = 0
    average_lag_ms: float | None = None
    # what each counter of the service went up by in the interval
    deltas: dict[str, int] = field(default_factory=dict)
    cpu_user_percent: float = 0.0
    cpu_system_percent: float = 0.0
    # this process's connection pool at the end of the interval (None when not known)
    pool_size: int | None = None
    pool_active: int | None = None
    virtual_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Point:
    at: float  # time.time()
    counters: dict[str, float]
    cpu_s: float  # user + system CPU seconds of the broker processes
    rss_bytes: int
    pool: tuple[int, int] | None = None  # this process's connection pool: size, in use


def _average_ms(before: Point, after: Point) -> float | None:
    pops = after.counters.get("pop_messages", 0) - before.counters.get("pop_messages", 0)
    if pops <= 0:
        return None
    waited = after.counters.get("pop_lag_seconds", 0) - before.counters.get("pop_lag_seconds", 0)
    return round(1000 * waited / pops, 1)


class History:
    def __init__(
        self,
        figures: Figures | Metrics,
        *,
        step_s: float = 10.0,
        span_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        pool: Callable[[], tuple[int, int] | None] | None = None,
    ) -> None:
        """``pool``: how this process's connection pool stands (size, in use), read with
        every point (none without it)."""
        self.figures = LocalFigures(figures) if isinstance(figures, Metrics) else figures
        self.pool = pool
        self.step_s = step_s
        self.clock = clock
        self.points: deque[Point] = deque(maxlen=max(2, int(span_s / step_s) + 1))
        self.started_at = clock()

    def sample(self, *, force: bool = False) -> None:
        """Record a point unless the newest one is younger than ``step_s`` (or ``force``)."""
        now = self.clock()
        if not force and self.points and now - self.points[-1].at < self.step_s:
            return
        reading = self.figures.read()
        pool = self.pool() if self.pool is not None else None
        self.points.append(Point(now, reading.counters, reading.cpu_s, reading.rss_bytes, pool))

    def series(self, since: float | None = None) -> list[RatePoint]:
        """One entry per interval between consecutive points (those ending at ``since`` or
        later): per-second rates of pushes, pops, acks and DLQ moves, CPU share and memory at
        its end. Rates are rounded to two places, CPU to one."""
        out: list[RatePoint] = []
        for before, after in itertools.pairwise(list(self.points)):
            if since is not None and after.at < since:
                continue
            span = max(after.at - before.at, 1e-9)

            def delta(name: str, b: Point = before, a: Point = after) -> int:
                return int(a.counters.get(name, 0) - b.counters.get(name, 0))

            def rate(name: str, s: float = span) -> float:
                return round(delta(name) / s, 2)

            def cpu_share(name: str, s: float = span) -> float:
                return round(delta(name) / 1e4 / s, 2)  # microseconds per second, in percent

            out.append(
                RatePoint(
                    at=datetime.fromtimestamp(after.at, UTC),
                    span_s=round(span, 3),
                    rates=Rates(
                        ingested_per_s=rate("push_items_queued"),
                        pop_per_s=rate("pop_messages"),
                        processed_per_s=rate("acks"),
                    ),
                    dead_letter_per_s=rate("acks_dlq"),
                    push_requests_per_s=rate("push_requests"),
                    ingested=delta("push_items_queued"),
                    processed=delta("acks"),
                    cpu_percent=round(100 * (after.cpu_s - before.cpu_s) / span, 1),
                    rss_bytes=after.rss_bytes,
                    popped=delta("pop_messages"),
                    average_lag_ms=_average_ms(before, after),
                    deltas={name: delta(name) for name in after.counters},
                    cpu_user_percent=cpu_share("cpu_user_microseconds"),
                    cpu_system_percent=cpu_share("cpu_system_microseconds"),
                    pool_size=after.pool[0] if after.pool else None,
                    pool_active=after.pool[1] if after.pool else None,
                    virtual_bytes=int(after.counters.get("process_virtual_memory_bytes", 0)),
                )
            )
        return out

    def average_lag_s(self, span_s: float = 300.0) -> float:
        """How long the messages popped over about the last ``span_s`` seconds had waited, on
        average (pop time less creation); 0 when none was popped."""
        points = list(self.points)
        if len(points) < 2:
            return 0.0
        last = points[-1]
        first = next((p for p in points if p.at >= last.at - span_s), points[0])
        pops = last.counters.get("pop_messages", 0) - first.counters.get("pop_messages", 0)
        waited = last.counters.get("pop_lag_seconds", 0) - first.counters.get("pop_lag_seconds", 0)
        return round(waited / pops, 3) if pops > 0 else 0.0

    def latest_rates(self) -> Rates:
        """The rates of the newest interval (zeros before there are two points)."""
        series = self.series()
        return series[-1].rates if series else Rates(0.0, 0.0, 0.0)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample every ``step_s`` until cancelled. Owns nothing but the ring; an error in a
        sample is logged (and reported to the loop's supervision) and the loop goes on."""
        self.sample(force=True)
        task_status.started()
        while True:
            await trio.sleep(self.step_s)
            try:
                self.sample()
            except Exception as exc:  # a sample must never end the process
                log.exception("metrics history sample failed")
                report_failure(exc)
            else:
                report_ok()


class LagHistory:
    """Each consumer group's lag on each queue it reads, every ``step_s`` for ``span_s``
    (rings per (group, queue); a pair not seen for ``span_s`` is forgotten). Fed by
    :meth:`queen.admin.groups.ConsumerGroups.sample_lag` from its loop."""

    def __init__(self, *, step_s: float = 30.0, span_s: float = 3600.0) -> None:
        self.step_s = step_s
        self.span_s = span_s
        self._size = max(2, int(span_s / step_s) + 1)
        self._rings: dict[tuple[str, str], deque[tuple[float, int]]] = {}

    def record(self, at: float, lags: dict[tuple[str, str], int]) -> None:
        for key, lag in lags.items():
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = deque(maxlen=self._size)
            ring.append((at, lag))
        for key in [k for k, ring in self._rings.items() if at - ring[-1][0] > self.span_s]:
            del self._rings[key]

    def series(self, group: str, queue: str) -> list[tuple[datetime, int]]:
        """The lag samples of ``group`` on ``queue``, oldest first."""
        ring = self._rings.get((group, queue), ())
        return [(datetime.fromtimestamp(at, UTC), lag) for at, lag in ring]


def bucket_minutes(span_s: float) -> int:
    """The original's bucket for a window of ``span_s`` seconds: a minute up to an hour, 5
    minutes up to 6 hours, 15 up to a day, an hour up to a week, else 6 hours."""
    minutes = span_s / 60
    for most, size in ((60, 1), (360, 5), (1440, 15), (10080, 60)):
        if minutes <= most:
            return size
    return 360


def buckets(points: list[RatePoint], minutes: int) -> list[RatePoint]:
    """``points`` (the history's intervals, oldest first) gathered into buckets of
    ``minutes``, aligned on the clock as the original's are (a bucket of 5 minutes starts at
    a minute divisible by 5), each holding the intervals that began in it: what every counter
    went up by, summed; rates over the bucket's whole length (so a bucket still filling reads
    low, as the original's do, and its dashboard leaves it out); CPU shares averaged over the
    intervals' time; memory and the pool as at the end of its newest interval. A bucket is
    labelled by its start: ``at`` is its end and ``span_s`` its length."""
    width = 60 * minutes
    groups: dict[int, list[RatePoint]] = {}
    for p in points:
        began = p.at.timestamp() - p.span_s
        groups.setdefault(int(began // width), []).append(p)
    out: list[RatePoint] = []
    for key in sorted(groups):
        group = groups[key]
        newest = group[-1]
        deltas: dict[str, int] = {}
        for p in group:
            for name, value in p.deltas.items():
                deltas[name] = deltas.get(name, 0) + value
        took = sum(p.span_s for p in group) or 1.0
        popped = sum(p.popped for p in group)
        waited = sum((p.average_lag_ms or 0) * p.popped for p in group)

        def rate(name: str, d: dict[str, int] = deltas) -> float:
            return round(d.get(name, 0) / width, 2)

        def share(values: list[tuple[float, float]], t: float = took) -> float:
            return round(sum(v * s for v, s in values) / t, 2)

        out.append(
            RatePoint(
                at=datetime.fromtimestamp((key + 1) * width, UTC),
                span_s=float(width),
                rates=Rates(
                    ingested_per_s=rate("push_items_queued"),
                    pop_per_s=rate("pop_messages"),
                    processed_per_s=rate("acks"),
                ),
                dead_letter_per_s=rate("acks_dlq"),
                push_requests_per_s=rate("push_requests"),
                ingested=sum(p.ingested for p in group),
                processed=sum(p.processed for p in group),
                cpu_percent=round(share([(p.cpu_percent, p.span_s) for p in group]), 1),
                rss_bytes=newest.rss_bytes,
                popped=popped,
                average_lag_ms=round(waited / popped, 1) if popped else None,
                deltas=deltas,
                cpu_user_percent=share([(p.cpu_user_percent, p.span_s) for p in group]),
                cpu_system_percent=share([(p.cpu_system_percent, p.span_s) for p in group]),
                pool_size=newest.pool_size,
                pool_active=newest.pool_active,
                virtual_bytes=newest.virtual_bytes,
            )
        )
    return out

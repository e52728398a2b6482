"""This process and the whole broker: the overview, ``GET /api/v1/status``, this process's
history over a window (the analytics series), the per-queue flow of each minute, what
retention removed, ``/metrics`` as JSON, and what the dashboard shows while the database is
away (:meth:`SystemReads.standing`, from this process's memory alone)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from queen.admin import params
from queen.admin.figures import MessageCounts, age_s, consumer_counts, need_store
from queen.admin.history import History, RatePoint, Rates, bucket_minutes, buckets
from queen.admin.params import Args, TimeRange
from queen.admin.queues import QueueQuery, QueueReads, QueueSummary, queue_query
from queen.consume.errors import ConsumeUnavailable
from queen.consume.service import ConsumeService
from queen.flow import FlowRow, SharedFlow
from queen.metrics import Figures, Metrics
from queen.operations import Operations
from queen.settings import Settings
from queen.spool import SpoolState
from queen.storage.admin import DeadLetterSummary, Leases, PgAdminStore
from queen.supervision import LoopStatus

RETENTION_COUNTERS = (
    "retention_passes",
    "retention_segments_removed",
    "retention_messages_removed",
    "dedup_rows_pruned",
)
SERIES_WINDOW = timedelta(hours=1)  # the window of a series when none is asked

# --- queries -----------------------------------------------------------------------------------


def series_window(args: Args) -> TimeRange:
    """``from`` and ``to`` of a series: by default the last hour."""
    return params.window(args, default=SERIES_WINDOW)


@dataclass(frozen=True, slots=True)
class StatusQuery:
    """``GET /api/v1/status``: the window of the service's history, and the queues to list
    (``queue``: that one alone)."""

    window: TimeRange
    queue: str | None
    queues: QueueQuery


def status_query(args: Args) -> StatusQuery:
    """``from``, ``to``, ``queue``, and the list's ``limit``, ``offset``, ``search``,
    ``namespace`` and ``task``."""
    window = series_window(args)
    queue = params.optional_name(args, "queue")
    return StatusQuery(window, queue, queue_query(args, search=queue))


INTERVALS = {"minute": 60, "hour": 3600, "day": 86400}


@dataclass(frozen=True, slots=True)
class SeriesQuery:
    """This process's history over ``window``; ``interval`` (``minute``, ``hour`` or
    ``day``; another is taken as ``hour``, as the original takes it) is the step of the
    messages stored over the window (``GET /api/v1/status/analytics``)."""

    window: TimeRange
    interval: str = "hour"


def series_query(args: Args) -> SeriesQuery:
    """``from``, ``to`` and ``interval``."""
    return SeriesQuery(series_window(args), args.get("interval") or "hour")


@dataclass(frozen=True, slots=True)
class FlowQuery:
    """The per-queue flow over ``window``, of ``queue`` alone when given."""

    window: TimeRange
    queue: str | None = None


def flow_query(args: Args) -> FlowQuery:
    """``from``, ``to`` and ``queue``."""
    return FlowQuery(series_window(args), params.optional_name(args, "queue"))


# --- answers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessState:
    """How this broker process stands. ``spool`` is None when the spool is off; ``counters``
    are the service's :class:`queen.metrics.Metrics` totals (every worker of ``--workers N``
    summed)."""

    process_id: int
    uptime_s: float
    active_partitions: int
    database_up: bool
    maintenance_mode: bool
    spool: SpoolState | None
    counters: dict[str, float]


@dataclass(frozen=True, slots=True)
class Standing:
    """What this process knows without asking the database, ``at``: shown by the dashboard
    while the database is away. ``database_down_since`` is None while it answers; ``rates``
    are the newest interval's; ``pop_maintenance`` is the switch as last read."""

    at: datetime
    database_down_since: datetime | None
    process: ProcessState
    push_maintenance: bool
    pop_maintenance: bool
    loops: dict[str, LoopStatus]
    rates: Rates


@dataclass(frozen=True, slots=True)
class Overview:
    """Every queue together (partition by partition the consumer furthest behind there;
    ``completed``: the acknowledgements the service took since it started, as the original
    counts them), the service's latest rates and this process's state, measured ``at``;
    ``average_lag_s``: how long the messages popped over the last five minutes had waited,
    on average."""

    queues: int
    partitions: int
    namespaces: int
    tasks: int
    consumer_groups: int  # named groups
    messages: MessageCounts
    oldest_pending_at: datetime | None
    oldest_pending_age_s: float
    rates: Rates
    push_maintenance: bool
    pop_maintenance: bool
    process: ProcessState
    at: datetime
    average_lag_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Status:
    """``GET /api/v1/status``: the service's history over the window, the overview, the
    queues holding messages, the history's step and the service's counter totals; the leases
    live now and the window's dead letters (:class:`queen.storage.admin.Leases`,
    :class:`queen.storage.admin.DeadLetterSummary`)."""

    window: TimeRange
    throughput: list[RatePoint]
    overview: Overview
    queues: list[QueueSummary]
    step_s: float
    counters: dict[str, float]
    leases: Leases = field(default_factory=Leases)
    hostname: str = ""
    dead_letters: DeadLetterSummary = field(default_factory=DeadLetterSummary)


@dataclass(frozen=True, slots=True)
class ProcessSeries:
    """This process's history over a window, in the original's buckets (``step_s`` long:
    :func:`queen.admin.history.bucket_minutes`); ``stored``: per ``interval`` of the
    window (its start), the messages this service stored then."""

    window: TimeRange
    interval: str
    process_id: int
    points: list[RatePoint]
    step_s: float = 60.0
    counters: dict[str, float] = field(default_factory=dict)
    hostname: str = ""
    stored: list[tuple[datetime, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ProcessMetrics:
    """``GET /metrics`` as JSON: the service's counters (every worker summed), this
    process's id and uptime."""

    uptime_s: float
    requests: int  # pushes, pops and acks
    items_queued: int
    ingested_per_s: float
    pool_size: int
    pool_idle: int | None  # this process's pool (None without PostgreSQL)
    rss_bytes: int
    cpu_s: float
    cpu_user_us: int
    cpu_system_us: int
    process_id: int
    processes: int  # broker processes live now (1, or the workers of --workers N)
    counters: dict[str, float]


@dataclass(frozen=True, slots=True)
class RetentionFigures:
    """What retention and dedup pruning removed: every process together (the database's
    totals, empty without PostgreSQL) and this process (its counters)."""

    all_processes: dict[str, int]
    this_process: dict[str, int]
    interval_s: float
    # the service's history over the asked window: what each interval removed
    window: TimeRange | None = None
    points: list[RatePoint] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QueueLagPoint:
    """One minute of one queue: the messages popped from it and how long they had waited
    (milliseconds); messages stored, pops that found nothing, acks taken and refused."""

    minute: datetime
    queue: str
    pops: int
    average_lag_ms: float
    max_lag_ms: float
    pushes: int = 0
    empty_pops: int = 0
    acks: int = 0
    acks_refused: int = 0


@dataclass(frozen=True, slots=True)
class QueueFlowSeries:
    """``GET /api/v1/analytics/queue-lag`` and ``/queue-ops``: per queue and minute over the
    window; ``every_process``: the figures of every broker process on the database (else of
    the answering process alone: the database did not answer, or there is none)."""

    window: TimeRange
    points: list[QueueLagPoint]
    every_process: bool = False


_METRIC_FIELDS = frozenset(Metrics().snapshot())
_SECONDS = frozenset({"push_transaction_seconds", "pop_lag_seconds"})


def acks_taken(counters: Mapping[str, float]) -> int:
    """The acknowledgements the service took since it started (completed and dead-lettered
    alike; refused ones not): the original's ``completed`` of the overview and status."""
    return max(0, int(counters.get("acks", 0) - counters.get("acks_refused", 0)))


def _whole(counters: Mapping[str, float]) -> dict[str, float]:
    """The :class:`Metrics` counters of a reading, counts as integers."""
    return {k: v if k in _SECONDS else int(v) for k, v in counters.items() if k in _METRIC_FIELDS}


class SystemReads:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        ops: Operations,
        *,
        history: History,
        figures: Figures,
        queues: QueueReads,
        store: PgAdminStore | None,
        consume: ConsumeService | None,
        flow: SharedFlow | None = None,
    ) -> None:
        """``store`` and ``consume`` are None without PostgreSQL (the reads that need them
        then raise :class:`ConsumeUnavailable`); ``figures``: how the service's counters are
        read; ``flow``: every process's per-queue flow (None: this process's alone)."""
        self.settings = settings
        self.metrics = metrics
        self.ops = ops
        self.history = history
        self.figures = figures
        self.queues = queues
        self._store = store
        self._consume = consume
        self._flow = flow

    @property
    def store(self) -> PgAdminStore:
        return need_store(self._store)

    def _process(self) -> ProcessState:
        ops = self.ops
        return ProcessState(
            process_id=os.getpid(),
            uptime_s=round(time.time() - self.history.started_at, 1),
            active_partitions=ops.supervisor.active_partitions,
            database_up=ops.db_health.up,
            maintenance_mode=ops.maintenance.enabled,
            spool=ops.spool_state(),
            counters=_whole(self.figures.read().counters),
        )

    async def _pop_maintenance(self) -> bool:
        """The pop switch as last read (off without the consume side)."""
        if self._consume is None:
            return False
        try:
            return (await self._consume.pop_maintenance()).enabled
        except ConsumeUnavailable:
            return False

    async def standing(self) -> Standing:
        """This process from its own memory (no database read): what the dashboard shows
        while the database is away."""
        self.history.sample()
        ops = self.ops
        down = ops.db_health.down_since
        pop_maintenance = await self._pop_maintenance()
        return Standing(
            at=datetime.now(UTC),
            database_down_since=None if down is None else datetime.fromtimestamp(down, UTC),
            process=self._process(),
            push_maintenance=ops.maintenance.enabled,
            pop_maintenance=pop_maintenance,
            loops=ops.service_loops(),
            rates=self.history.latest_rates(),
        )

    async def overview(self) -> Overview:
        """``GET /api/v1/resources/overview``: every queue together, and this process."""
        self.history.sample()
        t = await self.store.totals()
        now = datetime.now(UTC)
        rates = self.history.latest_rates()
        pop_maintenance = await self._pop_maintenance()
        return Overview(
            queues=t.queues,
            partitions=t.partitions,
            namespaces=t.namespaces,
            tasks=t.tasks,
            consumer_groups=t.named_groups,
            messages=replace(
                consumer_counts(
                    held=t.held,
                    undone=t.most_undone,
                    processing=t.most_processing,
                    done=t.most_done,
                    dead=t.dead_letter,
                    failed=t.failed,
                ),
                completed=acks_taken(self.figures.read().counters),
            ),
            oldest_pending_at=t.oldest_pending_at,
            oldest_pending_age_s=age_s(t.oldest_pending_at, now),
            rates=rates,
            push_maintenance=self.ops.maintenance.enabled,
            pop_maintenance=pop_maintenance,
            process=self._process(),
            at=now,
            average_lag_s=self.history.average_lag_s(),
        )

    def _throughput(self, since: datetime) -> list[RatePoint]:
        self.history.sample()
        return self.history.series(since.timestamp())

    def _bucketed(self, window: TimeRange) -> tuple[list[RatePoint], float]:
        """The history over ``window`` in the original's buckets for it, and their length
        in seconds: its dashboard reads a bucket's figures as a minute's (or more), and
        leaves out the one still filling."""
        since, until = window
        minutes = bucket_minutes((until - since).total_seconds())
        return buckets(self._throughput(since), minutes), 60.0 * minutes

    def _stored(self, window: TimeRange, interval: str) -> list[tuple[datetime, int]]:
        """Per ``interval`` from the one holding the window's start to the one holding its
        end: the messages this service stored in it (as far as its history goes back)."""
        since, until = window
        step = INTERVALS.get(interval, 3600)
        first, last = int(since.timestamp() // step), int(until.timestamp() // step)
        if last - first > 10_000:  # a window of years asked by the minute: its end only
            first = last - 10_000
        counts = dict.fromkeys(range(first, last + 1), 0)
        for p in self._throughput(since):
            key = int((p.at.timestamp() - p.span_s) // step)
            if key in counts:
                counts[key] += p.ingested
        return [(datetime.fromtimestamp(k * step, UTC), n) for k, n in counts.items()]

    async def status(self, query: StatusQuery) -> Status:
        """``GET /api/v1/status``: the service's throughput over the window, totals, and the
        queues holding messages (one page; filters ``queue``, ``namespace``, ``task``)."""
        since, until = query.window
        overview = await self.overview()
        listed = await self.queues.page(query.queues)
        active = [
            q
            for q in listed.queues
            if q.messages.total > 0 and (query.queue is None or q.name == query.queue)
        ]
        points, step_s = self._bucketed(query.window)
        return Status(
            query.window,
            points,
            overview,
            active,
            step_s,
            self.figures.read().counters,
            await self.store.live_leases(),
            socket.gethostname(),
            await self.store.dead_letter_summary(since, until, query.queue),
        )

    async def series(self, query: SeriesQuery) -> ProcessSeries:
        """``GET /api/v1/status/analytics``, ``/analytics/worker-metrics`` and
        ``/analytics/system-metrics``: the service's history over the window (what it kept:
        the last hour) in the original's buckets, with its counter totals."""
        points, step_s = self._bucketed(query.window)
        interval = query.interval if query.interval in INTERVALS else "hour"
        return ProcessSeries(
            window=query.window,
            interval=interval,
            process_id=os.getpid(),
            points=points,
            step_s=step_s,
            counters=self.figures.read().counters,
            hostname=socket.gethostname(),
            stored=self._stored(query.window, interval),
        )

    async def queue_flow(self, query: FlowQuery, *, popped_only: bool = False) -> QueueFlowSeries:
        """``GET /api/v1/analytics/queue-lag`` (``popped_only``: the minutes with pops) and
        ``/queue-ops``: per queue and minute of the window, what every broker process on the
        database stored, popped and had acknowledged, and how long the popped had waited
        (this process's alone while the database does not answer, or without PostgreSQL)."""
        since, until = query.window
        every = False
        rows: list[FlowRow] = []
        if self._flow is not None:
            shared = await self._flow.rows(since.timestamp(), until.timestamp(), query.queue)
            rows, every = shared.rows, shared.every
        elif self._consume is not None:
            rows = self._consume.flow.rows(since.timestamp(), until.timestamp(), query.queue)
        return QueueFlowSeries(
            query.window,
            [
                QueueLagPoint(
                    minute=datetime.fromtimestamp(minute, UTC),
                    queue=name,
                    pops=f.pops,
                    average_lag_ms=round(1000 * f.lag_sum_s / f.pops, 1) if f.pops else 0,
                    max_lag_ms=round(1000 * f.lag_max_s, 1),
                    pushes=f.pushes,
                    empty_pops=f.empty_pops,
                    acks=f.acks,
                    acks_refused=f.acks_refused,
                )
                for minute, name, f in rows
                if f.pops or not popped_only
            ],
            every_process=every,
        )

    async def retention(self, window: TimeRange) -> RetentionFigures:
        """``GET /api/v1/analytics/retention``: what retention removed, in total and per
        interval of the service's history over the window."""
        counters = self.metrics.snapshot()
        try:
            totals = await self.ops.retention_totals()
        except ConsumeUnavailable:
            totals = {}
        return RetentionFigures(
            all_processes=totals,
            this_process={k: counters[k] for k in RETENTION_COUNTERS},
            interval_s=self.settings.retention_interval_s,
            window=window,
            points=self._bucketed(window)[0],
        )

    def refresh(self) -> None:
        """``POST /api/v1/stats/refresh``: figures are live (read when asked); this takes a
        history sample now."""
        self.history.sample(force=True)

    def metrics_json(self) -> ProcessMetrics:
        """``GET /metrics`` with ``Accept: application/json``: the original's figures for this
        process."""
        self.history.sample()
        reading = self.figures.read()
        c = _whole(reading.counters)
        rates = self.history.latest_rates()
        gauges = self.ops.gauges()
        return ProcessMetrics(
            uptime_s=round(time.time() - self.history.started_at, 1),
            requests=int(c["push_requests"] + c["pop_requests"] + c["acks"]),
            items_queued=int(c["push_items_queued"]),
            ingested_per_s=rates.ingested_per_s,
            pool_size=self.settings.db_pool_size,
            pool_idle=int(gauges["db_pool_idle"]) if "db_pool_idle" in gauges else None,
            rss_bytes=reading.rss_bytes,
            cpu_s=round(reading.cpu_s, 3),
            cpu_user_us=int(reading.counters.get("cpu_user_microseconds", 0)),
            cpu_system_us=int(reading.counters.get("cpu_system_microseconds", 0)),
            process_id=os.getpid(),
            processes=reading.processes,
            counters=c,
        )

"""Operating one broker: how it is (``/health``, the ``/metrics`` gauges), the maintenance switch,
retention on demand, and waiting for the spool to drain.

:class:`Operations` owns no task and no state of its own: it reads what the other rooms keep
(database health, the switches, the loops' states, the actors' registry, the spool) and asks
them to act. Its answers are typed (:class:`Health`); HTTP renders them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import trio
from trio_util import RepeatedEvent

from queen.actors.supervisor import Supervisor
from queen.consume.errors import ConsumeUnavailable
from queen.encryption import EncryptionStatus, QueueEncryption
from queen.health import DatabaseHealth
from queen.maintenance import MaintenanceSwitch
from queen.metrics import PUBLISH_INTERVAL_S, Figures
from queen.retention import RetentionLoop
from queen.spool import Spool, SpoolState
from queen.storage.retention import PassOutcome, QueueHoldings
from queen.supervision import Loops, LoopStatus

HEALTH_WAIT_S = 0.5  # longest /health waits for a fresh answer from the database
# A loop failing in another worker of the service: its details are that worker's.
ELSEWHERE = "failing in another worker of this service (its /health or log says why)"


@dataclass(frozen=True, slots=True)
class Health:
    """What ``/health`` reports (rendered by :func:`queen.http.render.health`). ``status`` is
    ``healthy``, ``degraded`` (a background loop fails) or ``unhealthy`` (no database); the
    sections ``encryption``, ``loops`` and ``spool`` are their owners' typed states."""

    healthy: bool
    status: str
    version: str
    active_partitions: int
    maintenance_mode: bool
    encryption: EncryptionStatus
    loops: dict[str, LoopStatus]
    spool: SpoolState | None


class Operations:
    def __init__(
        self,
        *,
        db_health: DatabaseHealth,
        maintenance: MaintenanceSwitch,
        encryption: QueueEncryption,
        loops: Loops,
        supervisor: Supervisor,
        changed: RepeatedEvent,
        figures: Figures,
        spool: Spool | None = None,
        retention: RetentionLoop | None = None,
        pool_stats: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.db_health = db_health
        self.maintenance = maintenance
        self.encryption = encryption
        self.loops = loops
        self.supervisor = supervisor
        self.figures = figures  # this process's counters, or the service's (--workers N)
        self.spool = spool
        self.changed = changed  # set whenever the spool, the switches or health change
        self._retention = retention
        self._pool_stats = pool_stats
        version()  # read now, while descriptors are free

    async def health(self) -> Health:
        """How this broker is, within about half a second whatever the database does.

        Healthy means the database answers: a fresh probe if one answers within
        ``HEALTH_WAIT_S``, else the state the probes and the writers last saw. A failing
        background loop does not make the broker unhealthy (it still stores pushes): the status
        is then ``degraded`` and ``loops`` says which loop fails and why.
        """
        healthy = await self.db_health.check(HEALTH_WAIT_S)
        statuses = self.service_loops()
        failing = any(loop.state == "failing" for loop in statuses.values())
        status = "unhealthy" if not healthy else "degraded" if failing else "healthy"
        return Health(
            healthy=healthy,
            status=status,
            version=version(),
            active_partitions=self.supervisor.active_partitions,
            maintenance_mode=self.maintenance.enabled,
            encryption=self.encryption.status(),
            loops=statuses,
            spool=self.spool_state(),
        )

    def service_loops(self) -> dict[str, LoopStatus]:
        """The background loops of the whole service: this process's states, and (with
        ``--workers N``) a loop another worker last published as failing shown failing, with
        that said, whichever worker answers."""
        statuses = self.loops.statuses()
        for name in self.figures.failing_elsewhere():
            mine = statuses.get(name)
            if mine is None or mine.state != "failing":
                statuses[name] = LoopStatus(
                    state="failing",
                    errors=mine.errors if mine is not None else 0,
                    last_error=ELSEWHERE,
                )
        return statuses

    def labelled_metrics(self) -> dict[str, tuple[str, dict[str, float]]]:
        """The /metrics families with a label: errors and state of each background loop."""
        failing = set(self.loops.failing())
        return {
            "background_errors": ("loop", self.loops.errors()),
            "background_loop_failing": (
                "loop",
                {name: float(name in failing) for name in self.loops.states},
            ),
        }

    def prometheus_text(self) -> str:
        """The counters and gauges of ``/metrics``: the whole service's (every worker of
        ``--workers N``), ``# HELP`` and ``# TYPE`` included."""
        return self.figures.exposition(self.gauges(), self.labelled_metrics())

    def publish_figures(self) -> None:
        """Make this process's figures visible to the other workers now."""
        self.figures.publish(self.gauges(), self.labelled_metrics())

    async def run_figures(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Publish this process's figures every :data:`PUBLISH_INTERVAL_S` (with
        ``--workers N``; a lone process is read directly and needs no loop)."""
        self.publish_figures()
        task_status.started()
        while True:
            await trio.sleep(PUBLISH_INTERVAL_S)
            self.publish_figures()

    def gauges(self) -> dict[str, float]:
        """Point-in-time values for /metrics, beside the counters."""
        values: dict[str, float] = {
            # with --workers N, one sample per worker (labelled pid and worker)
            "process_id": float(os.getpid()),
            "database_up": float(self.db_health.up),
            "maintenance_mode": float(self.maintenance.enabled),
        }
        if self._pool_stats is not None:
            size, active = self._pool_stats()
            values.update(db_pool_size=size, db_pool_idle=size - active, db_pool_active=active)
        state = self.spool_state()
        if state is not None:
            values.update(
                spool_pending_items=state.pending_items,
                spool_files=state.files,
                spool_oldest_age_seconds=state.oldest_age_s,
                spool_replay_rate=state.replay_rate,
                spool_quarantined_ranges=state.quarantined_ranges,
                spool_quarantined_bytes=state.quarantined_bytes,
            )
        return values

    def spool_state(self) -> SpoolState | None:
        """The spool now (None when the spool is off)."""
        return self.spool.state() if self.spool is not None else None

    async def set_maintenance(self, enabled: bool) -> None:
        """Switch maintenance mode for every broker process sharing the database."""
        await self.maintenance.set(enabled)

    async def wait_spool_empty(self) -> None:
        """Return once nothing is left in this broker's spool (everything replayed)."""
        if self.spool is None:
            return
        while self.spool.index.total or self.spool.index.file_count:
            await self.changed.wait()

    async def run_retention_pass(self) -> PassOutcome:
        """Remove expired segments and prune the dedup sidecar now (one bounded pass); the
        retention loop also runs one every ``retention_interval_s``."""
        return await self._retention_loop().run_pass()

    async def queue_holdings(self, queue: str) -> QueueHoldings | None:
        """What a queue holds (segments, messages, sidecar entries, retention options), or
        None if unknown."""
        return await self._retention_loop().store.holdings(queue)

    async def retention_totals(self) -> dict[str, int]:
        """What retention and pruning removed so far, all broker processes together."""
        return await self._retention_loop().store.totals()

    def _retention_loop(self) -> RetentionLoop:
        if self._retention is None:
            raise ConsumeUnavailable("retention needs the PostgreSQL store")
        return self._retention


@functools.cache
def version() -> str:
    """Read once: /health must not need a file (or a free descriptor) to answer."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("queen-trio")
    except PackageNotFoundError:
        return "0+unknown"

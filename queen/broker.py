"""The broker object: the push path, and the consume side, retention, the spool and the
maintenance switch reached through it. :func:`queen.lifecycle.open_broker` builds and runs one::

    async with queen.open_broker(queen.Settings(database_url=...)) as broker:
        results = await broker.push([{"queue": "orders", "payload": {"id": 1}}])
        popped = await broker.pop("orders", batch=10)
        await broker.ack(popped.messages)
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from queen.actors.batcher import Batcher
from queen.actors.supervisor import Supervisor
from queen.broadcast import Signal
from queen.consume import requests
from queen.consume.errors import ConsumeUnavailable
from queen.consume.options import parse_options
from queen.consume.results import (
    AckResult,
    LeaseExtension,
    PopResult,
    QueueConfigured,
    QueueDeleted,
    TransactionResult,
)
from queen.consume.service import ConsumeService
from queen.encryption import QueueEncryption
from queen.health import DatabaseHealth
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.push import PushedItem, PushService
from queen.records import CycleRequest, TransactionRequest
from queen.retention import RetentionLoop
from queen.settings import Settings
from queen.spool import Replayer, SpoolIndex, SpoolWriter
from queen.spool import describe as describe_spool
from queen.storage.admin import PgAdminStore
from queen.storage.base import Store
from queen.storage.consume import PgConsumeStore
from queen.storage.retention import PassOutcome, QueueHoldings
from queen.storage.streams import PgStreamsStore
from queen.streams.service import StreamsService

log = logging.getLogger("queen.broker")

HEALTH_WAIT_S = 0.5  # longest /health waits for a fresh answer from the database


class Broker:
    """The broker as an object: the push path here, the consume side in :attr:`consume`.

    The HTTP app is a thin layer over this. The consume methods below validate exactly as
    the HTTP routes do (raising :class:`queen.consume.errors.InvalidRequest`) and return the
    same answers.
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        batcher: Batcher,
        supervisor: Supervisor,
        metrics: Metrics,
        *,
        database: str,
        db_health: DatabaseHealth,
        maintenance: MaintenanceSwitch,
        encryption: QueueEncryption | None = None,
        spool: SpoolParts | None,
        changed: Signal,
        push_service: PushService,
        consume: ConsumeService | None = None,
        retention: RetentionLoop | None = None,
        admin_store: PgAdminStore | None = None,
    ) -> None:
        self._consume = consume
        self.admin_store = admin_store  # the admin API's reads (PostgreSQL only)
        self._streams: StreamsService | None = None
        self._retention = retention
        self.settings = settings
        self.store = store
        self.batcher = batcher
        self.supervisor = supervisor
        self.metrics = metrics
        self.database = database
        self.db_health = db_health
        self.maintenance = maintenance
        self.encryption = encryption or QueueEncryption(None, None, refresh_s=1.0)
        self.spool = spool
        self._changed = changed
        self.push_service = push_service
        _version()  # read now, while descriptors are free

    @property
    def closing(self) -> bool:
        return self.push_service.closing

    @property
    def consume(self) -> ConsumeService:
        """The consume side; raises :class:`ConsumeUnavailable` on a store other than
        PostgreSQL (the in-memory store of the actor tests)."""
        if self._consume is None:
            raise ConsumeUnavailable("consuming needs the PostgreSQL store")
        return self._consume

    @property
    def streams(self) -> StreamsService:
        """The streams side (``/streams/v1/*``), on the consume side's store and wake-ups."""
        if self._streams is None:
            consume = self.consume
            if not isinstance(consume.store, PgConsumeStore):
                raise ConsumeUnavailable("streaming queries need the PostgreSQL store")
            self._streams = StreamsService(PgStreamsStore(consume.store.pool), consume)
        return self._streams

    def stop_waiting(self) -> None:
        """Make long-polling pops answer "nothing" now (a server shutting down calls this
        first, so its requests finish promptly)."""
        if self._consume is not None:
            self._consume.stop_waiting()

    async def configure(
        self,
        queue: str,
        options: dict[str, Any] | None = None,
        *,
        namespace: str | None = None,
        task: str | None = None,
    ) -> QueueConfigured:
        """Create or reconfigure ``queue`` (``POST /api/v1/configure``); options missing from
        ``options`` go back to their defaults."""
        checked = requests.name(queue, "queue")
        assert checked is not None
        return await self.consume.configure(
            checked,
            requests.name(namespace, "namespace", required=False) or "",
            requests.name(task, "task", required=False) or "",
            parse_options(options),
        )

    async def delete_queue(self, queue: str) -> QueueDeleted:
        checked = requests.name(queue, "queue")
        assert checked is not None
        return await self.consume.delete_queue(checked)

    async def pop(
        self,
        queue: str | None = None,
        partition: str | None = None,
        *,
        namespace: str | None = None,
        task: str | None = None,
        consumer_group: str | None = None,
        batch: int | None = None,
        partitions: int | None = None,
        wait: bool = False,
        timeout_ms: int = 30_000,
        auto_ack: bool = False,
        subscription_mode: str | None = None,
        subscription_from: str | None = None,
        autopilot: bool = False,
    ) -> PopResult:
        """Pop from ``queue`` (one ``partition``, or any), or from every queue matching
        ``namespace``/``task``. ``consumer_group`` None is queue mode. Without ``batch`` a pop
        delivers one message, or with ``autopilot`` as many as the broker chooses. The result
        is empty when nothing was deliverable (by ``timeout_ms`` with ``wait``)."""
        args = {
            "namespace": namespace,
            "task": task,
            "consumerGroup": consumer_group,
            "batch": batch,
            "partitions": partitions,
            "wait": wait,
            "timeout": timeout_ms,
            "autoAck": auto_ack,
            "subscriptionMode": subscription_mode,
            "subscriptionFrom": subscription_from,
            "autopilot": autopilot,
        }
        request = requests.pop_request(
            args, queue=queue, partition=partition, max_batch=self.settings.pop_max_batch
        )
        return await self.consume.pop(request)

    async def ack(
        self, acks: dict[str, Any] | Sequence[dict[str, Any]], *, consumer_group: str | None = None
    ) -> list[AckResult]:
        """Acknowledge popped messages (dicts as :attr:`PopResult.messages` holds them, with an
        optional ``status`` (default ``completed``) and ``error``). One result per ack."""
        many = [acks] if isinstance(acks, dict) else list(acks)
        items = [
            requests.ack_item(
                raw, where=f"acks[{i}].", group=consumer_group, default_status="completed"
            )
            for i, raw in enumerate(many)
        ]
        return await self.consume.ack(items)

    async def extend_lease(self, lease_id: str, seconds: int | None = None) -> LeaseExtension:
        """Extend a lease by ``seconds`` (default: the queue's lease time)."""
        return await self.consume.extend_lease(
            requests.lease_id(lease_id), requests.lease_seconds({"seconds": seconds})
        )

    async def transaction(
        self,
        operations: list[dict[str, Any]],
        *,
        required_leases: list[str] | None = None,
        producer_sub: str | None = None,
    ) -> TransactionResult:
        """Apply ack and push operations atomically (``POST /api/v1/transaction``)."""
        request = requests.transaction_request(
            {"operations": operations, "requiredLeases": required_leases or []}
        )
        return await self.transact(request, producer_sub)

    async def transact(
        self, request: TransactionRequest, producer_sub: str | None = None
    ) -> TransactionResult:
        """Apply a validated transaction (:meth:`ConsumeService.transaction`: its pushed
        partitions are held for the write). Raises :class:`PartitionsBusy` when a partition
        cannot be written to the database now (nothing is applied then)."""
        return await self.consume.transaction(request, producer_sub)

    async def cycle(self, request: CycleRequest, producer_sub: str | None = None) -> dict[str, Any]:
        """Apply one streaming cycle (state changes, sink pushes, source ack) atomically
        (:meth:`StreamsService.cycle`: its sink partitions are held for the write)."""
        return await self.streams.cycle(request, producer_sub)

    async def push(
        self, items: Sequence[dict[str, Any]] | list[Any], producer_sub: str | None = None
    ) -> list[PushedItem]:
        """Push ``items`` (the JSON items of ``POST /api/v1/push``) and return one result per
        item, in order.

        ``producer_sub`` is the trusted producer identity stored with every message (the HTTP
        layer passes the validated token's ``sub``). Raises :class:`queen.model.InvalidPush`
        for a body that breaks a rule (nothing is stored) and :class:`BrokerClosed` during
        shutdown.
        """
        return (await self.push_service.push(items, producer_sub)).items()

    async def health(self) -> Health:
        """How this broker is, within about half a second whatever the database does.

        Healthy means the database answers: a fresh probe if one answers within
        ``HEALTH_WAIT_S``, else the state the probes and the writers last saw. A failing
        background loop does not make the broker unhealthy (it still stores pushes): the status
        is then ``degraded`` and ``loops`` says which loop fails and why.
        """
        healthy = await self.db_health.check(HEALTH_WAIT_S)
        loops = self.supervisor.loops
        status = "unhealthy" if not healthy else "degraded" if loops.failing() else "healthy"
        return Health(
            healthy=healthy,
            status=status,
            version=_version(),
            active_partitions=self.supervisor.active_partitions,
            maintenance_mode=self.maintenance.enabled,
            encryption=self.encryption.describe(),
            loops=loops.describe(),
            spool=self.spool.describe() if self.spool is not None else None,
        )

    def labelled_metrics(self) -> dict[str, tuple[str, dict[str, float]]]:
        """The /metrics families with a label: errors and state of each background loop."""
        loops = self.supervisor.loops
        failing = set(loops.failing())
        return {
            "background_errors": ("loop", loops.errors()),
            "background_loop_failing": (
                "loop",
                {name: float(name in failing) for name in loops.states},
            ),
        }

    def gauges(self) -> dict[str, float]:
        """Point-in-time values for /metrics, beside the counters."""
        values: dict[str, float] = {
            # Counters are per process: the process id tells the workers behind one port apart.
            "process_id": float(os.getpid()),
            "database_up": float(self.db_health.up),
            "maintenance_mode": float(self.maintenance.enabled),
        }
        if self.spool is not None:
            state = self.spool.describe()
            values.update(
                spool_pending_items=state["pendingItems"],
                spool_files=state["files"],
                spool_oldest_age_seconds=state["oldestAgeSeconds"],
                spool_replay_rate=state["replayRate"],
                spool_quarantined_ranges=state["quarantined"]["ranges"],
                spool_quarantined_bytes=state["quarantined"]["bytes"],
            )
        return values

    async def run_retention_pass(self) -> PassOutcome:
        """Remove expired segments and prune the dedup sidecar now (one bounded pass); the
        supervisor also runs one every ``retention_interval_s``."""
        if self._retention is None:
            raise ConsumeUnavailable("retention needs the PostgreSQL store")
        return await self._retention.run_pass()

    async def queue_holdings(self, queue: str) -> QueueHoldings | None:
        """What a queue holds (segments, messages, sidecar entries, retention options), or
        None if unknown."""
        if self._retention is None:
            raise ConsumeUnavailable("queue statistics need the PostgreSQL store")
        return await self._retention.store.holdings(queue)

    async def retention_totals(self) -> dict[str, int]:
        """What retention and pruning removed so far, all broker processes together."""
        if self._retention is None:
            raise ConsumeUnavailable("retention needs the PostgreSQL store")
        return await self._retention.store.totals()

    async def wait_spool_empty(self) -> None:
        """Return once nothing is left in this broker's spool (everything replayed)."""
        if self.spool is None:
            return
        while self.spool.index.total or self.spool.index.file_count:
            await self._changed.wait()

    async def set_maintenance(self, enabled: bool) -> None:
        """Switch maintenance mode for every broker process sharing the database."""
        await self.maintenance.set(enabled)

    async def _drain(self) -> None:
        """Phase two of shutdown: wait for accepted pushes to finish."""
        await self.push_service.drain()


@functools.cache
def _version() -> str:
    """Read once: /health must not need a file (or a free descriptor) to answer."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("queen-trio")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True, slots=True)
class Health:
    """What ``/health`` reports (rendered by :func:`queen.http.render.health`). ``status`` is
    ``healthy``, ``degraded`` (a background loop fails) or ``unhealthy`` (no database); the
    sections ``encryption``, ``loops`` and ``spool`` are as their owners describe them."""

    healthy: bool
    status: str
    version: str
    active_partitions: int
    maintenance_mode: bool
    encryption: dict[str, Any]
    loops: dict[str, dict[str, Any]]
    spool: dict[str, Any] | None


@dataclass(slots=True)
class SpoolParts:
    """The spool of one broker: index, writer, replay loop."""

    index: SpoolIndex
    writer: SpoolWriter
    replayer: Replayer | None = None

    def describe(self) -> dict[str, Any]:
        return describe_spool(self.index, self.writer, self.replayer)

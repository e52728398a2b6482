"""How a broker is assembled, run and shut down: :func:`open_broker`, the one way to run one
(``queen serve`` and applications embedding the broker alike).

Three steps, each its own function:

- **Stores** (:func:`queen.storage.bundle.open_stores`): the database (an embedded PostgreSQL
  when no URL is set), its pool, the schema, and every store as one :class:`Stores` bundle
  (or :func:`~queen.storage.bundle.push_only` over the in-memory store of the actor tests).
- **Assembly** (:func:`assemble`): every component built over the bundle, nothing started.
  What is absent from the bundle (the consume side without PostgreSQL) is absent here.
- **Run** (:func:`_running`): the spool writer, the batcher and the supervisor (the actors'
  registry) started in a nursery of their own, each ready when ``start`` returns; then the
  supervised background loops in the loops' own nursery (the embedded server's watch, the
  database health probe, the maintenance switch and encrypted-queue refreshes, the push
  listener, retention, the spool replay, the admin history's sampling, the per-queue flow's
  flush, and with ``--workers N`` the publishing of this process's figures to the other
  workers). On exit, shutdown in two phases: new pushes are refused at once and waiting pops
  answer "nothing", pushes already accepted get ``shutdown_grace_s`` to finish, then
  everything left is cancelled; the per-queue flow is flushed a last time.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio
from trio_util import RepeatedEvent

from queen.actors.batcher import Batcher
from queen.actors.partition import WriteRouter
from queen.actors.supervisor import Supervisor
from queen.admin.service import AdminService
from queen.broker import Broker
from queen.budget import ByteBudget
from queen.cipher import PayloadCipher, parse_key
from queen.consume.service import ConsumeService
from queen.encryption import QueueEncryption
from queen.errors import StoreError
from queen.flow import SharedFlow
from queen.health import DatabaseHealth
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Figures, LocalFigures, Metrics, SharedFigures
from queen.operations import Operations
from queen.push import PushService
from queen.retention import RetentionLoop
from queen.settings import Settings
from queen.spool import Replayer, Spool, SpoolIndex, SpoolRouter, SpoolWriter
from queen.storage.base import Store
from queen.storage.bundle import Stores, open_stores, push_only
from queen.streams.service import StreamsService
from queen.supervision import Loops

log = logging.getLogger("queen.broker")


@asynccontextmanager
async def open_broker(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    spool: bool = True,
    shared_figures: tuple[Path, str] | None = None,
) -> AsyncIterator[Broker]:
    """Run a broker inside the caller's Trio program; see the module docstring.

    ``store`` replaces the database entirely (tests drive actors with an in-memory store).
    ``spool=False`` turns the spool off: a push that cannot reach the database answers
    ``failed`` instead of ``buffered``. ``shared_figures`` (a worker of ``queen serve
    --workers N``: the parent's metrics directory and this worker's id) makes ``/metrics``
    and the rates the whole service's (:class:`queen.metrics.SharedFigures`); without it they
    are this process's.
    """
    settings = settings or Settings.from_env()
    async with _stores(settings, store) as stores:
        parts = assemble(settings, stores, spool=spool, shared_figures=shared_figures)
        async with _running(parts, stores) as broker:
            yield broker


@asynccontextmanager
async def _stores(settings: Settings, store: Store | None) -> AsyncIterator[Stores]:
    if store is not None:
        yield push_only(store)
        return
    async with open_stores(settings) as stores:
        yield stores


@dataclass(slots=True)
class Parts:
    """One broker's components, built and not started."""

    settings: Settings
    metrics: Metrics
    changed: RepeatedEvent
    loops: Loops
    db_health: DatabaseHealth
    maintenance: MaintenanceSwitch
    encryption: QueueEncryption
    batcher: Batcher
    supervisor: Supervisor
    push: PushService
    spool: Spool | None
    consume: ConsumeService | None
    streams: StreamsService | None
    retention: RetentionLoop | None
    ops: Operations
    admin: AdminService
    broker: Broker
    flow: SharedFlow | None = None  # every process's per-queue flow (None without PostgreSQL)


def assemble(
    settings: Settings,
    stores: Stores,
    *,
    spool: bool = True,
    shared_figures: tuple[Path, str] | None = None,
) -> Parts:
    """Build every component of one broker over ``stores``; start nothing."""
    metrics = Metrics()
    figures: Figures = (
        SharedFigures(metrics, *shared_figures) if shared_figures else LocalFigures(metrics)
    )
    # Set whenever the spool, a switch or the database's health changes; a waiter checks what
    # it cares about first, then waits, then checks again (a set with no waiter is not kept).
    changed = RepeatedEvent()
    loops = Loops(
        retry_max_s=settings.loop_retry_max_s, recover_s=min(5.0, settings.loop_retry_max_s)
    )
    db_health = DatabaseHealth(
        stores.push.ping,
        probe_min_s=settings.db_probe_min_s,
        probe_max_s=settings.db_probe_max_s,
        probe_timeout_s=settings.db_probe_timeout_s,
        changed=changed,
        up=stores.ready,
        on_up=stores.migrate,
        on_hang=stores.interrupt,
    )
    maintenance = MaintenanceSwitch(
        stores.state, refresh_s=settings.system_state_cache_ms / 1000, changed=changed
    )
    encryption = QueueEncryption(
        PayloadCipher(parse_key(settings.encryption_key)) if settings.encryption_key else None,
        stores.encrypted_queues,
        refresh_s=settings.system_state_cache_ms / 1000,
    )
    batcher = Batcher(
        stores.push,
        metrics,
        concurrency=settings.write_concurrency,
        max_items=settings.batch_max_items,
        max_bytes=settings.batch_max_bytes,
        linger_s=settings.batch_linger_ms / 1000,
        queue_size=settings.batch_queue_size,
        spread_min_items=settings.batch_spread_min_items,
        spread_min_writes=settings.batch_spread_min_writes,
    )
    parts_spool: Spool | None = None
    router: WriteRouter | None = None
    if spool:
        index = SpoolIndex()
        writer = SpoolWriter(
            Path(settings.file_buffer_dir),
            index,
            metrics,
            group_max_records=settings.spool_group_max_records,
            file_max_bytes=settings.spool_file_max_bytes,
            file_max_age_s=settings.spool_file_max_age_s,
        )
        parts_spool = Spool(index, writer)
        router = SpoolRouter(index, writer, db_health, maintenance, changed)
    supervisor = Supervisor(
        stores.push, batcher, settings, metrics, router=router, encryption=encryption
    )
    push = PushService(supervisor, metrics)
    if parts_spool is not None:
        assert isinstance(router, SpoolRouter)
        parts_spool.replayer = Replayer(
            Path(settings.file_buffer_dir),
            parts_spool.index,
            writer=parts_spool.writer,
            submit=supervisor.submit,
            health=db_health,
            maintenance=maintenance,
            changed=changed,
            metrics=metrics,
            chunk_items=settings.spool_replay_chunk_items,
            tick_s=settings.spool_replay_tick_s,
            scanner=router.scanner,
            deleted_queues=stores.deleted_queues,
        )
    budget = ByteBudget(settings.max_decoding_bytes)
    consume: ConsumeService | None = None
    streams: StreamsService | None = None
    if stores.consume is not None:
        consume = ConsumeService(
            stores.consume,
            settings,
            metrics,
            switches=maintenance,
            push=push,
            encryption=encryption,
            budget=budget,
            database=db_health,
        )
        batcher.add_commit_listener(consume.on_commit)
        if stores.streams is not None:
            streams = StreamsService(stores.streams, consume)
    retention: RetentionLoop | None = None
    if stores.retention is not None:
        retention = RetentionLoop(
            stores.retention,
            metrics,
            interval_s=settings.retention_interval_s,
            batch_limit=settings.retention_batch_limit,
            max_batches=settings.retention_max_batches,
        )
    ops = Operations(
        db_health=db_health,
        maintenance=maintenance,
        encryption=encryption,
        loops=loops,
        supervisor=supervisor,
        changed=changed,
        figures=figures,
        spool=parts_spool,
        retention=retention,
        pool_stats=stores.pool_stats,
    )
    flow = (
        None
        if stores.flow is None
        else SharedFlow(push.flow, stores.flow, flush_s=settings.flow_flush_s)
    )
    admin = AdminService(
        settings,
        metrics,
        ops,
        database=stores.description,
        store=stores.admin,
        consume=consume,
        push=push,
        figures=figures,
        flow=flow,
    )
    broker = Broker(
        settings,
        metrics=metrics,
        database=stores.description,
        push_service=push,
        ops=ops,
        admin=admin,
        store=stores.push,
        budget=budget,
        consume=consume,
        streams=streams,
    )
    return Parts(
        settings=settings,
        metrics=metrics,
        changed=changed,
        loops=loops,
        db_health=db_health,
        maintenance=maintenance,
        encryption=encryption,
        batcher=batcher,
        supervisor=supervisor,
        push=push,
        spool=parts_spool,
        consume=consume,
        streams=streams,
        retention=retention,
        ops=ops,
        admin=admin,
        broker=broker,
        flow=flow,
    )


@asynccontextmanager
async def _running(parts: Parts, stores: Stores) -> AsyncIterator[Broker]:
    """Start ``parts``, yield the broker, and shut it down in two phases."""
    settings = parts.settings
    if stores.ready:
        await parts.maintenance.load()
        await parts.encryption.load()
    parts.encryption.log_state()
    if parts.spool is not None:
        parts.spool.writer.prepare()
    async with trio.open_nursery() as nursery:
        if parts.spool is not None:
            await nursery.start(parts.spool.writer.run)
        await nursery.start(parts.batcher.run)
        await nursery.start(parts.supervisor.run)
        loops = parts.loops
        await nursery.start(loops.host)
        if stores.embedded is not None:  # an embedded server this process keeps running
            stores.embedded.on_restarted = parts.db_health.probe_soon
            await loops.start("embedded-postgres", stores.embedded.run)
        await loops.start("database-probe", parts.db_health.run)
        await loops.start("maintenance-switch", parts.maintenance.run)
        await loops.start("encryption-refresh", parts.encryption.run)
        if parts.consume is not None:
            await loops.start("push-listener", parts.consume.run)
        if parts.retention is not None:
            await loops.start("retention", parts.retention.run)
        if parts.spool is not None and parts.spool.replayer is not None:
            await loops.start("spool-replay", parts.spool.replayer.run)
        await loops.start("admin-history", parts.admin.history.run)
        await loops.start("group-lag-history", parts.admin.consumer_groups.run_lag_history)
        if parts.flow is not None:
            await loops.start("flow-flush", parts.flow.run)
        if parts.ops.figures.shared:
            await loops.start("metrics-publish", parts.ops.run_figures)
        try:
            yield parts.broker
        finally:
            if parts.consume is not None:
                parts.consume.stop_waiting()
            with trio.move_on_after(settings.shutdown_grace_s) as grace:
                grace.shield = True
                await parts.push.drain()
            if grace.cancelled_caught:
                log.warning("shutdown grace period over; cancelling unfinished pushes")
            nursery.cancel_scope.cancel()
    if parts.flow is not None:
        await _last_flush(parts.flow)
    if parts.ops.figures.shared:
        parts.ops.publish_figures()  # the last counts of this process stay in the service's


LAST_FLUSH_S = 5.0  # how long the last flush of the per-queue flow may take on the way out


async def _last_flush(flow: SharedFlow) -> None:
    """Save what the per-queue flow changed since the loop's last turn (a restart loses
    none of it), within :data:`LAST_FLUSH_S` even while the stop is a cancellation."""
    with trio.move_on_after(LAST_FLUSH_S) as scope:
        scope.shield = True
        try:
            await flow.flush()
        except StoreError as exc:
            log.warning("per-queue flow of the last seconds not saved: %s", exc)
    if scope.cancelled_caught:
        log.warning("per-queue flow of the last seconds not saved: no answer in time")

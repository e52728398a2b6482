"""How a broker is assembled, run and shut down: :func:`open_broker`, the one way to run one
(``queen serve`` and applications embedding the broker alike).

``open_broker`` opens the database (an embedded PostgreSQL when no URL is set), migrates the
schema, starts the spool writer, the batcher and the supervisor in a nursery of its own, then
the supervisor's supervised background loops (database health probe, maintenance switch and
encrypted-queue refresh, the consume service's push listener, retention, spool replay), and
yields the :class:`Broker`. On exit it shuts down in two phases: new pushes are refused at
once and waiting pops answer "nothing", pushes already accepted get ``shutdown_grace_s`` to
finish, then everything left is cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from queen.actors.batcher import Batcher
from queen.actors.partition import WriteRouter
from queen.actors.supervisor import Supervisor
from queen.broadcast import Signal
from queen.broker import Broker, SpoolParts
from queen.cipher import PayloadCipher, parse_key
from queen.consume.service import ConsumeService
from queen.encryption import QueueEncryption
from queen.health import DatabaseHealth
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.push import PushService
from queen.retention import RetentionLoop
from queen.settings import Settings
from queen.spool import Replayer, SpoolIndex, SpoolRouter, SpoolWriter
from queen.spool.replay import DeletedQueues
from queen.storage.admin import PgAdminStore
from queen.storage.base import StateStore, Store, StoreUnavailable
from queen.storage.consume import PgConsumeStore
from queen.storage.database import EmbeddedWatch, open_database
from queen.storage.pool import ConnectionPool
from queen.storage.postgres import ForeignSchemaError, PgStore
from queen.storage.retention import PgRetentionStore
from queen.storage.spool import deleted_queues

log = logging.getLogger("queen.broker")


@asynccontextmanager
async def open_broker(
    settings: Settings | None = None, *, store: Store | None = None, spool: bool = True
) -> AsyncIterator[Broker]:
    """Run a broker inside the caller's Trio program; see the module docstring.

    ``store`` replaces the database entirely (tests drive actors with an in-memory store).
    ``spool=False`` turns the spool off: a push that cannot reach the database answers
    ``failed`` instead of ``buffered``.
    """
    settings = settings or Settings.from_env()
    async with _open_store(settings, store) as (opened, database, ready, embedded):
        metrics = Metrics()
        changed = Signal()

        foreign_reported = False

        async def migrate_on_return() -> None:
            nonlocal foreign_reported
            if isinstance(opened, PgStore) and not opened.migrated:
                try:
                    await opened.migrate()
                except ForeignSchemaError as exc:  # the database stays "down": pushes spool
                    if not foreign_reported:
                        foreign_reported = True
                        log.error("cannot use the database: %s", exc)
                    raise

        db_health = DatabaseHealth(
            opened.ping,
            probe_min_s=settings.db_probe_min_s,
            probe_max_s=settings.db_probe_max_s,
            probe_timeout_s=settings.db_probe_timeout_s,
            changed=changed,
            up=ready,
            on_up=migrate_on_return,
            on_hang=opened.pool.interrupt if isinstance(opened, PgStore) else None,
        )
        maintenance = MaintenanceSwitch(
            opened if isinstance(opened, StateStore) else None,
            refresh_s=settings.system_state_cache_ms / 1000,
            changed=changed,
        )
        if ready:
            await maintenance.load()
        encryption = QueueEncryption(
            PayloadCipher(parse_key(settings.encryption_key)) if settings.encryption_key else None,
            opened.encrypted_queues if isinstance(opened, PgStore) else None,
            refresh_s=settings.system_state_cache_ms / 1000,
        )
        if ready:
            await encryption.load()
        encryption.log_state()
        batcher = Batcher(
            opened,
            metrics,
            concurrency=settings.write_concurrency,
            max_items=settings.batch_max_items,
            max_bytes=settings.batch_max_bytes,
            linger_s=settings.batch_linger_ms / 1000,
            queue_size=settings.batch_queue_size,
            spread_min_items=settings.batch_spread_min_items,
            spread_min_writes=settings.batch_spread_min_writes,
        )
        parts: SpoolParts | None = None
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
            writer.prepare()
            parts = SpoolParts(index, writer)
            router = SpoolRouter(index, writer, db_health, maintenance, changed)
        async with trio.open_nursery() as nursery:
            if parts is not None:
                await nursery.start(parts.writer.run)
            await nursery.start(batcher.run)
            supervisor = Supervisor(
                opened, batcher, settings, metrics, router=router, encryption=encryption
            )
            await nursery.start(supervisor.run)
            push = PushService(supervisor, metrics)
            if embedded is not None:  # an embedded server this process keeps running
                embedded.on_restarted = db_health.probe_soon
                await supervisor.start_loop("embedded-postgres", embedded.run)
            await supervisor.start_loop("database-probe", db_health.run)
            await supervisor.start_loop("maintenance-switch", maintenance.run)
            await supervisor.start_loop("encryption-refresh", encryption.run)
            consume: ConsumeService | None = None
            retention: RetentionLoop | None = None
            if isinstance(opened, PgStore):  # the consume side and retention need PostgreSQL
                consume = ConsumeService(
                    PgConsumeStore(opened.pool),
                    settings,
                    metrics,
                    switches=maintenance,
                    push=push,
                    encryption=encryption,
                )
                batcher.add_commit_listener(consume.on_commit)
                await supervisor.start_loop("push-listener", consume.run)
                retention = RetentionLoop(
                    PgRetentionStore(opened.pool),
                    metrics,
                    interval_s=settings.retention_interval_s,
                    batch_limit=settings.retention_batch_limit,
                    max_batches=settings.retention_max_batches,
                )
                await supervisor.start_loop("retention", retention.run)
            if parts is not None:
                parts.replayer = Replayer(
                    Path(settings.file_buffer_dir),
                    parts.index,
                    writer=parts.writer,
                    submit=supervisor.submit,
                    health=db_health,
                    maintenance=maintenance,
                    changed=changed,
                    metrics=metrics,
                    chunk_items=settings.spool_replay_chunk_items,
                    tick_s=settings.spool_replay_tick_s,
                    scanner=router.scanner if isinstance(router, SpoolRouter) else None,
                    deleted_queues=deleted_queues_of(opened),
                )
                await supervisor.start_loop("spool-replay", parts.replayer.run)
            broker = Broker(
                settings,
                opened,
                batcher,
                supervisor,
                metrics,
                database=database,
                db_health=db_health,
                maintenance=maintenance,
                encryption=encryption,
                spool=parts,
                changed=changed,
                push_service=push,
                consume=consume,
                retention=retention,
                admin_store=PgAdminStore(opened.pool) if isinstance(opened, PgStore) else None,
            )
            try:
                yield broker
            finally:
                if consume is not None:
                    consume.stop_waiting()
                with trio.move_on_after(settings.shutdown_grace_s) as grace:
                    grace.shield = True
                    await broker._drain()
                if grace.cancelled_caught:
                    log.warning("shutdown grace period over; cancelling unfinished pushes")
                nursery.cancel_scope.cancel()


@asynccontextmanager
async def _open_store(
    settings: Settings, store: Store | None
) -> AsyncIterator[tuple[Store, str, bool, EmbeddedWatch | None]]:
    """Yield (store, description, database ready, the embedded server's watch). An external
    database that cannot be reached at start-up is not fatal: the broker starts with it
    marked down and spools."""
    if store is not None:
        yield store, type(store).__name__, True, None
        return
    async with open_database(settings) as database:
        pool = ConnectionPool(
            database.conninfo,
            size=settings.db_pool_size,
            connect_timeout_s=settings.db_connect_timeout_s,
            statement_timeout_ms=settings.db_statement_timeout_ms,
            tcp_user_timeout_ms=settings.db_tcp_user_timeout_ms,
            call_timeout_s=settings.db_call_timeout_s,
        )
        try:
            pg = PgStore(pool)
            ready = True
            try:
                await pg.migrate()
            except StoreUnavailable as exc:
                log.warning("database unreachable at start-up (%s); starting with the spool", exc)
                ready = False
            yield pg, database.description, ready, database.embedded
        finally:
            with trio.CancelScope(shield=True):
                await pool.aclose()


def deleted_queues_of(store: Store) -> DeletedQueues | None:
    """How the spool replay learns which queues were deleted (PostgreSQL only)."""
    if not isinstance(store, PgStore):
        return None
    pool = store.pool

    async def ask(names: list[str]) -> dict[str, int]:
        return await deleted_queues(pool, names)

    return ask

"""The stores of one broker, opened together: what each room of the broker reads and writes.

:func:`open_stores` opens the database the settings name (:mod:`queen.storage.database`),
its connection pool and every PostgreSQL store over it, migrates the schema when it is not
this build's (:func:`queen.storage.postgres.migrate_once_sync`: a current one is only read),
and yields one :class:`Stores`. :func:`push_only` wraps any
:class:`~queen.storage.base.Store` alone (the actor tests' in-memory store): the push path, the
spool and the switches then work, and the rooms that need PostgreSQL (consume, retention,
streams, admin) are absent.

A database that cannot be reached at start-up is not fatal: ``ready`` is False, and the
broker starts with it marked down and spools (``migrate`` runs again when it comes back).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from queen.errors import StoreUnavailable
from queen.settings import Settings
from queen.storage.admin import PgAdminStore
from queen.storage.base import StateStore, Store
from queen.storage.consume import ConsumeStore, PgConsumeStore
from queen.storage.database import EmbeddedWatch, open_database
from queen.storage.flow import PgFlowStore
from queen.storage.pool import ConnectionPool
from queen.storage.postgres import ForeignSchemaError, PgStore
from queen.storage.retention import PgRetentionStore
from queen.storage.spool import deleted_queues
from queen.storage.streams import PgStreamsStore

log = logging.getLogger("queen.storage")


@dataclass(slots=True)
class Stores:
    """The interfaces one broker works through. ``None``: that room is absent."""

    push: Store  # partitions and segments: the actors' writes
    description: str  # the database, for logs (no password)
    ready: bool  # the database answered (and was migrated) at start-up
    migrate: Callable[[], Awaitable[None]]  # again, once the database answers
    interrupt: Callable[[], int] | None = None  # give up the calls in flight (a hung database)
    pool_stats: Callable[[], tuple[int, int]] | None = None  # (size, in use) of the pool
    state: StateStore | None = None  # broker-wide switches
    encrypted_queues: Callable[[], Awaitable[set[str]]] | None = None
    deleted_queues: Callable[[list[str]], Awaitable[dict[str, int]]] | None = None
    consume: ConsumeStore | None = None
    retention: PgRetentionStore | None = None
    streams: PgStreamsStore | None = None
    admin: PgAdminStore | None = None
    flow: PgFlowStore | None = None  # the per-queue flow of every process
    embedded: EmbeddedWatch | None = None  # the embedded server this process keeps running


def push_only(store: Store) -> Stores:
    """``store`` alone: the push path without PostgreSQL's other rooms."""

    async def nothing_to_migrate() -> None:
        return None

    return Stores(
        push=store,
        description=type(store).__name__,
        ready=True,
        migrate=nothing_to_migrate,
        state=store if isinstance(store, StateStore) else None,
    )


@asynccontextmanager
async def open_stores(settings: Settings) -> AsyncIterator[Stores]:
    """Open the database, its pool and its stores; close the pool (and stop an embedded
    server this process started) on the way out."""
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

            async def ask_deleted(names: list[str]) -> dict[str, int]:
                return await deleted_queues(pool, names)

            yield Stores(
                push=pg,
                description=database.description,
                ready=ready,
                migrate=_migrate_once(pg),
                interrupt=pool.interrupt,
                pool_stats=pool.stats,
                state=pg,
                encrypted_queues=pg.encrypted_queues,
                deleted_queues=ask_deleted,
                consume=PgConsumeStore(pool),
                retention=PgRetentionStore(pool),
                streams=PgStreamsStore(pool),
                admin=PgAdminStore(pool),
                flow=PgFlowStore(pool),
                embedded=database.embedded,
            )
        finally:
            with trio.CancelScope(shield=True):
                await pool.aclose()


def _migrate_once(pg: PgStore) -> Callable[[], Awaitable[None]]:
    """Migrate if it never succeeded (the broker started during an outage); a database that
    holds the original broker's schema is logged once and stays unusable."""
    reported = False

    async def migrate() -> None:
        nonlocal reported
        if pg.migrated:
            return
        try:
            await pg.migrate()
        except ForeignSchemaError as exc:
            if not reported:
                reported = True
                log.error("cannot use the database: %s", exc)
            raise

    return migrate

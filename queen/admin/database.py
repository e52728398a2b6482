"""The database server as the broker sees it: version, size, connections, transactions and
the cache, and the original dashboard's figures of the broker's tables and indexes (cache,
dead rows, HOT updates, vacuums, sizes) and the statements running long.

The tables', indexes' and statements' figures are :mod:`queen.storage.admin`'s rows
(:class:`~queen.storage.admin.TableStats`, ...), chosen and ordered here.
"""

from __future__ import annotations

from dataclasses import dataclass

from queen.admin.figures import need_store
from queen.settings import Settings
from queen.storage.admin import (
    IndexStats,
    PgAdminStore,
    RunningQuery,
    TableSize,
    TableStats,
)


@dataclass(frozen=True, slots=True)
class DatabaseDetail:
    """The cache, vacuum and size figures of the broker's tables and indexes (each list
    chosen and ordered as the original's dashboard shows it), the statements running for
    over a second and ``shared_buffers``."""

    name: str
    disk_reads: int
    cache_hits: int
    table_cache: list[TableStats]  # most disk reads first
    index_cache: list[IndexStats]  # most disk reads first, 20 at most
    dead_tuples: list[TableStats]  # with dead rows, most first, 15 at most
    hot_updates: list[TableStats]  # updated, most updates first, 15 at most
    autovacuum_due: list[TableStats]  # over 1,000 dead rows, most first, 10 at most
    table_sizes: list[TableStats]  # largest first, 20 at most
    running: list[RunningQuery]
    shared_buffers_pages: str
    shared_buffers_size: str
    tables_read: int
    tables_hit: int
    indexes_read: int
    indexes_hit: int


@dataclass(frozen=True, slots=True)
class PostgresStats:
    """The database server as the broker sees it (``database``: what the start-up line calls
    it; ``pool_size``: connections per broker process)."""

    version: str
    database: str
    database_bytes: int
    connections: int
    active_connections: int
    max_connections: int
    pool_size: int
    committed: int
    rolled_back: int
    cache_hit_ratio: float  # to four places; 1.0 before any block was read
    deadlocks: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    tables: list[TableSize]
    detail: DatabaseDetail | None = None


class DatabaseReads:
    def __init__(self, settings: Settings, store: PgAdminStore | None, *, database: str) -> None:
        """``database``: what the start-up line calls it; ``store`` is None without
        PostgreSQL (:meth:`stats` then raises :class:`queen.consume.errors.ConsumeUnavailable`)."""
        self.settings = settings
        self._store = store
        self.database = database

    @property
    def store(self) -> PgAdminStore:
        return need_store(self._store)

    async def _detail(self, name: str, disk_reads: int, hits: int) -> DatabaseDetail:
        d = await self.store.postgres_detail()
        tables, indexes = d.tables, d.indexes
        dead = sorted((t for t in tables if t.dead > 0), key=lambda t: -t.dead)
        return DatabaseDetail(
            name=name,
            disk_reads=disk_reads,
            cache_hits=hits,
            table_cache=sorted(tables, key=lambda t: -t.heap_read),
            index_cache=sorted(indexes, key=lambda i: -i.read)[:20],
            dead_tuples=dead[:15],
            hot_updates=sorted((t for t in tables if t.updates > 0), key=lambda t: -t.updates)[:15],
            autovacuum_due=[t for t in dead if t.dead > 1000][:10],
            table_sizes=sorted(tables, key=lambda t: -t.total_bytes)[:20],
            running=d.running[:10],
            shared_buffers_pages=str(d.shared_buffers),
            shared_buffers_size=d.shared_buffers_size,
            tables_read=sum(t.heap_read for t in tables),
            tables_hit=sum(t.heap_hit for t in tables),
            indexes_read=sum(i.read for i in indexes),
            indexes_hit=sum(i.hit for i in indexes),
        )

    async def stats(self) -> PostgresStats:
        """``GET /api/v1/analytics/postgres-stats``."""
        r = await self.store.postgres()
        reads = r.blks_read + r.blks_hit
        return PostgresStats(
            version=r.version,
            database=self.database,
            database_bytes=r.database_bytes,
            connections=r.connections,
            active_connections=r.active,
            max_connections=r.max_connections,
            pool_size=self.settings.db_pool_size,
            committed=r.xact_commit,
            rolled_back=r.xact_rollback,
            cache_hit_ratio=round(r.blks_hit / reads, 4) if reads else 1.0,
            deadlocks=r.deadlocks,
            rows_inserted=r.tup_inserted,
            rows_updated=r.tup_updated,
            rows_deleted=r.tup_deleted,
            tables=r.tables,
            detail=await self._detail(r.name, r.blks_read, r.blks_hit),
        )

"""The PostgreSQL side of the admin API: figures, the message browser and the operator's
actions on messages and dead letters (``admin.sql``). Every call is one statement in
autocommit mode; rows come back as dicts keyed by column name, and :mod:`queen.admin` shapes
them into answers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from queen.model import PartitionKey
from queen.primitives import Turn, require_turn
from queen.storage.pool import ConnectionPool

Row = dict[str, Any]


_PARTITION_ORDERS = {
    "name": "name",
    "pending": "undone - processing DESC, name",
    "oldest": "start_at NULLS LAST, name",
    "lease": "lease_expires_at NULLS LAST, name",
}


class PgAdminStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    async def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        def call(conn: psycopg.Connection[Any]) -> list[Row]:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(sql, params)
                return cur.fetchall()

        return await self.pool.run(call)

    async def queues(
        self,
        *,
        name: str | None = None,
        search: str | None = None,
        namespace: str | None = None,
        task: str | None = None,
        limit: int,
        offset: int,
    ) -> list[Row]:
        """One page of queues (name order) with queue mode's totals and ``full_count``."""
        return await self._rows(
            "SELECT * FROM queen.admin_queues(%s, %s, %s, %s, %s, %s)",
            (name, search, namespace, task, limit, offset),
        )

    async def queue(self, name: str) -> Row | None:
        """The queue's row with its options, or None."""
        rows = await self._rows("SELECT * FROM queen.queues WHERE name = %s", (name,))
        return rows[0] if rows else None

    async def partitions(
        self, queue_id: int, *, limit: int, offset: int, order: str = "name"
    ) -> list[Row]:
        """One page of a queue's partitions with their figures, in ``order``: ``name``,
        ``pending`` (most first), ``oldest`` (oldest pending first) or ``lease`` (soonest
        lease end first); ties by name."""
        by = _PARTITION_ORDERS[order]
        return await self._rows(
            f"""SELECT * FROM queen.admin_partition_stats(ARRAY[%s]::bigint[])
                ORDER BY {by} LIMIT %s OFFSET %s""",
            (queue_id, limit, offset),
        )

    async def dlq_by_partition(self, queue_id: int) -> dict[int, int]:
        rows = await self._rows(
            """SELECT partition_id, count(*) AS n FROM queen.dlq WHERE queue_id = %s
               GROUP BY partition_id""",
            (queue_id,),
        )
        return {int(r["partition_id"]): int(r["n"]) for r in rows}

    async def groupings(self, column: str) -> list[Row]:
        """Queues and partitions per namespace or per task (``column``), with totals."""
        if column not in ("namespace", "task"):
            raise ValueError(column)
        return await self._rows(
            f"""SELECT q.{column} AS key, count(DISTINCT q.id) AS queues,
                       count(s.partition_id) AS partitions,
                       coalesce(sum(s.held), 0)::bigint AS held,
                       coalesce(sum(s.undone), 0)::bigint AS undone,
                       coalesce(sum(s.processing), 0)::bigint AS processing
                FROM queen.queues q
                LEFT JOIN queen.admin_partition_stats(
                    ARRAY(SELECT id FROM queen.queues)) s ON s.queue_id = q.id
                WHERE q.{column} <> ''
                GROUP BY q.{column} ORDER BY q.{column}"""
        )

    async def totals(self) -> Row:
        """Every queue together: counts of queues, partitions, namespaces, tasks, groups and
        queue mode's message totals."""
        rows = await self._rows(
            """SELECT (SELECT count(*) FROM queen.queues) AS queues,
                      (SELECT count(DISTINCT namespace) FROM queen.queues
                       WHERE namespace <> '') AS namespaces,
                      (SELECT count(DISTINCT task) FROM queen.queues WHERE task <> '') AS tasks,
                      (SELECT count(*) FROM queen.consumer_groups) AS named_groups,
                      (SELECT count(*) FROM queen.dlq) AS dead_letter,
                      count(s.partition_id) AS partitions,
                      coalesce(sum(s.held), 0)::bigint AS held,
                      coalesce(sum(s.undone), 0)::bigint AS undone,
                      coalesce(sum(s.processing), 0)::bigint AS processing,
                      coalesce(sum(s.failed), 0)::bigint AS failed,
                      min(s.start_at) AS oldest_pending_at
               FROM queen.admin_partition_stats(ARRAY(SELECT id FROM queen.queues)) s"""
        )
        return rows[0]

    async def groups(
        self,
        *,
        group: str | None = None,
        queue: str | None = None,
        limit: int,
        offset: int,
    ) -> list[Row]:
        """One page of (consumer group, queue) pairs with their lag and ``full_count``."""
        return await self._rows(
            "SELECT * FROM queen.admin_groups(%s, %s, %s, %s)", (group, queue, limit, offset)
        )

    async def group_partitions(
        self, group: str, queue_id: int, *, limit: int, offset: int
    ) -> list[Row]:
        return await self._rows(
            "SELECT * FROM queen.admin_group_partitions(%s, %s, %s, %s)",
            (group, queue_id, limit, offset),
        )

    async def messages(
        self,
        *,
        queue: str | None,
        partition: str | None,
        namespace: str | None,
        task: str | None,
        status: str | None,
        since: datetime,
        until: datetime,
        limit: int,
        offset: int,
    ) -> list[Row]:
        """Stored messages, newest first (no payloads)."""
        return await self._rows(
            "SELECT * FROM queen.admin_messages(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (queue, partition, namespace, task, status, since, until, limit, offset),
        )

    async def find_partitions(self, queue: str, transaction_id: str, limit: int) -> list[int]:
        """Ids of the partitions of ``queue`` holding a message with ``transaction_id``."""
        rows = await self._rows(
            "SELECT * FROM queen.admin_find_partitions(%s, %s, %s)",
            (queue, transaction_id, limit),
        )
        return [int(r["partition_id"]) for r in rows]

    async def message(self, partition_id: int, transaction_id: str) -> Row | None:
        rows = await self._rows(
            "SELECT * FROM queen.admin_message(%s, %s)", (partition_id, transaction_id)
        )
        return rows[0] if rows else None

    async def delete_message(self, partition_id: int, transaction_id: str) -> str:
        """``deleted``, ``leased`` (inside a live lease: left alone) or ``missing``."""
        rows = await self._rows(
            "SELECT queen.admin_delete_message(%s, %s) AS outcome",
            (partition_id, transaction_id),
        )
        return str(rows[0]["outcome"])

    async def dead_letter_targets(
        self,
        *,
        partition_id: int | None = None,
        transaction_id: str | None = None,
        queue: str | None = None,
        group: str | None = None,
        partition: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: int = 0,
        upto: int | None = None,
        limit: int,
    ) -> list[Row]:
        """Dead letters (``id``, ``partition_id``, ``queue_name``, ``partition_name``) of one
        message, or of a queue's filter, in id order, ids in (``after``, ``upto``]."""
        return await self._rows(
            """SELECT * FROM queen.admin_dead_letter_targets(
                   %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
            (
                partition_id,
                transaction_id,
                queue,
                group,
                partition,
                since,
                until,
                after,
                upto,
                limit,
            ),
        )

    async def last_dead_letter_id(self) -> int:
        rows = await self._rows("SELECT coalesce(max(id), 0) AS id FROM queen.dlq")
        return int(rows[0]["id"])

    async def retry_dead_letters(self, targets: list[Row], turn: Turn) -> list[Row]:
        """Deliver those dead letters again (``targets``: rows of
        :meth:`dead_letter_targets`; one row per copy appended: ``partition_id``,
        ``transaction_id``, ``consumer_group``, ``msg_offset``). ``turn``: the push service's
        hold of their partitions (raises :class:`queen.primitives.NoTurn`, nothing sent,
        without it)."""
        keys = {PartitionKey(t["queue_name"], t["partition_name"]) for t in targets}
        require_turn(turn, keys, "a dead letter retry")
        ids = [int(t["id"]) for t in targets]
        return await self._rows("SELECT * FROM queen.admin_retry_dead_letters(%s)", (ids,))

    async def dead_letter_message(
        self, partition_id: int, transaction_id: str, group: str, error: str | None
    ) -> str:
        """``moved``, ``already``, ``consumed``, ``leased``, ``no_group`` or ``missing``."""
        rows = await self._rows(
            "SELECT queen.admin_dead_letter_message(%s, %s, %s, %s) AS outcome",
            (partition_id, transaction_id, group, error),
        )
        return str(rows[0]["outcome"])

    async def clear(self, queue: str, partition: str | None) -> Row:
        """``known``, ``cleared`` and ``kept`` (messages left inside live leases' writes)."""
        rows = await self._rows("SELECT * FROM queen.admin_clear(%s, %s)", (queue, partition))
        return rows[0]

    async def dlq_by_queue(self) -> dict[str, int]:
        rows = await self._rows(
            """SELECT q.name, count(*) AS n FROM queen.dlq d JOIN queen.queues q
               ON q.id = d.queue_id GROUP BY q.name"""
        )
        return {str(r["name"]): int(r["n"]) for r in rows}

    async def dead_letter_summary(
        self, since: datetime, until: datetime, queue: str | None = None
    ) -> Row:
        """The dead letters that failed in [since, until] (of ``queue`` only, if given): the
        partitions they came from, and the five most frequent error messages with their
        counts."""
        rows = await self._rows(
            """WITH w AS (SELECT partition_id, error_message FROM queen.dlq
                           WHERE failed_at >= %s AND failed_at <= %s
                             AND (%s::text IS NULL OR queue_id =
                                  (SELECT q.id FROM queen.queues q WHERE q.name = %s)))
               SELECT (SELECT count(DISTINCT partition_id) FROM w) AS partitions,
                      (SELECT coalesce(jsonb_agg(jsonb_build_object('error', e, 'count', n)
                                                 ORDER BY n DESC, e), '[]')
                         FROM (SELECT coalesce(error_message, '') AS e, count(*) AS n
                                 FROM w GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 5) t) AS errors""",
            (since, until, queue, queue),
        )
        return rows[0]

    async def live_leases(self) -> Row:
        """The leases live now, every group's (queue mode's too): how many, on how many
        partitions, the messages they still hold (from the cursor to the lease's end) and how
        many of those are acknowledged already (out of order)."""
        rows = await self._rows(
            """SELECT count(*) AS active, count(DISTINCT partition_id) AS partitions,
                      coalesce(sum(lease_end - next_offset), 0) AS messages,
                      coalesce(sum(cardinality(acked)), 0) AS acked
                 FROM queen.cursors
                WHERE lease_id IS NOT NULL AND lease_expires_at > now()"""
        )
        return rows[0]

    async def postgres_detail(self) -> Row:
        """Per table and index of the broker's schema: block reads from disk and from the
        cache, live and dead rows, updates (HOT ones too), vacuums and sizes (bytes, and as
        PostgreSQL writes them); the statements running for over a second (other than this
        one); ``shared_buffers`` (in 8 kB pages, and written out)."""
        rows = await self._rows(
            """SELECT
                 (SELECT coalesce(jsonb_agg(jsonb_build_object(
                      'schema', s.schemaname, 'table', s.relname,
                      'heap_read', coalesce(io.heap_blks_read, 0),
                      'heap_hit', coalesce(io.heap_blks_hit, 0),
                      'live', s.n_live_tup, 'dead', s.n_dead_tup,
                      'updates', s.n_tup_upd, 'hot_updates', s.n_tup_hot_upd,
                      'last_vacuum', s.last_vacuum, 'last_autovacuum', s.last_autovacuum,
                      'autovacuum_count', s.autovacuum_count,
                      'autoanalyze_count', s.autoanalyze_count,
                      'total_bytes', pg_total_relation_size(s.relid),
                      'table_bytes', pg_relation_size(s.relid),
                      'index_bytes', pg_indexes_size(s.relid),
                      'total_size', pg_size_pretty(pg_total_relation_size(s.relid)),
                      'table_size', pg_size_pretty(pg_relation_size(s.relid)),
                      'index_size', pg_size_pretty(pg_indexes_size(s.relid)))), '[]')
                    FROM pg_stat_user_tables s
                    LEFT JOIN pg_statio_user_tables io ON io.relid = s.relid
                   WHERE s.schemaname = 'queen') AS tables,
                 (SELECT coalesce(jsonb_agg(jsonb_build_object(
                      'schema', schemaname, 'table', relname, 'index', indexrelname,
                      'read', idx_blks_read, 'hit', idx_blks_hit)), '[]')
                    FROM pg_statio_user_indexes WHERE schemaname = 'queen') AS indexes,
                 (SELECT coalesce(jsonb_agg(jsonb_build_object(
                      'pid', pid,
                      'duration', extract(epoch FROM now() - query_start)::float8,
                      'state', state, 'query', left(query, 200),
                      'wait_event_type', wait_event_type, 'wait_event', wait_event)
                      ORDER BY query_start), '[]')
                    FROM pg_stat_activity
                   WHERE state <> 'idle' AND query_start < now() - interval '1 second'
                     AND pid <> pg_backend_pid()) AS active,
                 current_setting('shared_buffers') AS shared_buffers_text,
                 (SELECT setting::bigint FROM pg_settings
                   WHERE name = 'shared_buffers') AS shared_buffers,
                 (SELECT pg_size_pretty(setting::bigint * 8192) FROM pg_settings
                   WHERE name = 'shared_buffers') AS shared_buffers_size"""
        )
        return rows[0]

    async def postgres(self) -> Row:
        """The database server: version, size, connections, transaction and cache figures,
        and the size of the broker's tables."""
        rows = await self._rows(
            """SELECT current_setting('server_version') AS version, current_database() AS name,
                      pg_database_size(current_database()) AS database_bytes,
                      (SELECT count(*) FROM pg_stat_activity
                       WHERE datname = current_database()) AS connections,
                      (SELECT count(*) FROM pg_stat_activity
                       WHERE datname = current_database() AND state = 'active') AS active,
                      current_setting('max_connections')::integer AS max_connections,
                      d.xact_commit, d.xact_rollback, d.blks_read, d.blks_hit, d.deadlocks,
                      d.tup_inserted, d.tup_updated, d.tup_deleted,
                      (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                  'table', c.relname,
                                  'bytes', pg_total_relation_size(c.oid),
                                  'rows', greatest(c.reltuples, 0)::bigint)
                              ORDER BY c.relname), '[]')
                       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                       WHERE n.nspname = 'queen' AND c.relkind = 'r') AS tables
               FROM pg_stat_database d WHERE d.datname = current_database()"""
        )
        return rows[0]

"""The PostgreSQL side of the admin API: figures, the message browser and the operator's
actions on messages and dead letters (``admin.sql``). Every call is one statement in
autocommit mode; rows come back as the typed rows below (their fields are the statements'
columns), and :mod:`queen.admin` shapes them into answers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from queen.model import PartitionKey
from queen.primitives import Turn, require_turn
from queen.records import QueueOptions
from queen.storage.pool import ConnectionPool

# How a queue's partitions may be listed: ``name``, ``pending`` (most first), ``oldest``
# (oldest pending message first) or ``lease`` (soonest lease end first); ties by name.
PARTITION_ORDERS = {
    "name": "name",
    "pending": "most_undone - most_processing DESC, name",
    "oldest": "start_at NULLS LAST, name",
    "lease": "lease_expires_at NULLS LAST, name",
}

# How a group's partitions may be listed (``queen.admin_group_partitions``): ``name``, ``lag``
# (most messages behind first) or ``stuck`` (the stuck partitions first, then by lag); ties by
# name.
GROUP_PARTITION_ORDERS = ("name", "lag", "stuck")

# A partition holding messages for a group, outside a live lease, whose oldest message has
# waited this long with no pop there for as long (or ever) looks stuck (``queen.admin_stuck``).
STUCK_IDLE_S = 300.0

# --- rows --------------------------------------------------------------------------------------
# Queue mode's figures of a partition, a queue or every queue: ``held`` messages stored,
# ``undone`` of them not yet acknowledged (nor dead-lettered), ``processing`` inside a live
# lease, ``failed`` attempts. ``most_*``: partition by partition, the figure of the consumer
# (queue mode or a group) furthest behind for it among those that popped there (``undone``
# with its lease, ``processing``, ``done`` and ``dead`` letters), added up; a partition no one
# popped counts whole as undone.


@dataclass(frozen=True, slots=True)
class QueueRow:
    """A queue of ``queen.admin_queues`` with its totals (queue mode's, and those of its
    consumers furthest behind: ``most_*``); ``full_count``: every queue
    matching the filters."""

    id: int
    name: str
    namespace: str
    task: str
    priority: int
    created_at: datetime
    partitions: int
    held: int
    undone: int
    processing: int
    failed: int
    dead_letter: int
    oldest_pending_at: datetime | None
    newest_at: datetime | None
    most_undone: int
    most_processing: int
    most_done: int
    most_dead: int
    full_count: int


@dataclass(frozen=True, slots=True)
class QueueConfigRow:
    """A queue as configured (``queen.queues``)."""

    id: int
    name: str
    namespace: str
    task: str
    created_at: datetime
    options: QueueOptions


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """A partition of ``queen.admin_partition_stats``: its offsets (``cursor_offset``: queue
    mode's cursor), figures, queue mode's live lease, the oldest pending message's time
    (``start_at``) and the newest stored one's."""

    queue_id: int
    partition_id: int
    name: str
    created_at: datetime
    next_offset: int
    low_offset: int
    cursor_offset: int
    held: int
    undone: int
    processing: int
    failed: int
    lease_expires_at: datetime | None
    start_at: datetime | None
    newest_at: datetime | None
    consumers: int
    most_undone: int
    most_processing: int
    most_done: int
    most_dead: int


@dataclass(frozen=True, slots=True)
class GroupingRow:
    """The queues of one namespace or one task (``key``) and their figures."""

    key: str
    queues: int
    partitions: int
    held: int
    undone: int
    processing: int
    most_undone: int
    most_processing: int


@dataclass(frozen=True, slots=True)
class TotalsRow:
    """Every queue together."""

    queues: int
    namespaces: int
    tasks: int
    named_groups: int
    dead_letter: int
    partitions: int
    held: int
    undone: int
    processing: int
    failed: int
    oldest_pending_at: datetime | None
    most_undone: int
    most_processing: int
    most_done: int
    most_dead: int


@dataclass(frozen=True, slots=True)
class GroupRow:
    """A (consumer group, queue) pair of ``queen.admin_groups``: partitions with a cursor
    (``popped``: with a delivery), messages behind (``lag``) and partitions holding some
    (``lagging``), partitions inside a live lease; ``full_count``: every pair matching."""

    consumer_group: str
    queue_id: int
    queue_name: str
    partitions: int
    popped: int
    lag: int
    lagging: int
    leased: int
    oldest_at: datetime | None
    last_delivered_at: datetime | None
    popped_lag: int  # lag over the partitions it popped alone (the original's meaning)
    popped_lagging: int
    done: int  # popped partitions where it acknowledged (or dead-lettered) something
    stuck: int  # partitions that look stuck (``queen.admin_stuck``)
    subscription_mode: str | None
    subscribed_at: datetime | None
    subscription_created_at: datetime | None
    full_count: int


@dataclass(frozen=True, slots=True)
class GroupPartitionRow:
    """Where a group stands in one partition (``queen.admin_group_partitions``)."""

    partition_id: int
    partition_name: str
    next_offset: int
    cursor_offset: int
    has_cursor: bool
    lag: int
    oldest_at: datetime | None
    lease_expires_at: datetime | None
    delivered_at: datetime | None
    lease_expired_at: datetime | None
    stuck: str | None  # why it looks stuck: lease_expired, never_popped, idle (or None)


@dataclass(frozen=True, slots=True)
class GroupAlertRow(GroupRow):
    """A (group, queue) pair that lags or has stuck partitions, with how many such pairs
    there are in all, and of each kind (the same on every row)."""

    alert_pairs: int
    lagging_pairs: int
    stuck_pairs: int


@dataclass(frozen=True, slots=True)
class StoredMessageRow:
    """Where a stored message is, and what it is (no payload)."""

    partition_id: int
    queue_name: str
    partition_name: str
    namespace: str
    task: str
    msg_offset: int
    message_id: UUID
    transaction_id: str
    producer_sub: str | None
    trace_id: UUID | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class MessageRow(StoredMessageRow):
    """A message of ``queen.admin_messages``: queue mode's status of it and live lease, and of
    the named groups with a cursor on its partition (``total_groups``) how many have it
    behind their cursor (``consumed_by``)."""

    status: str
    lease_expires_at: datetime | None
    consumed_by: int | None
    total_groups: int | None


@dataclass(frozen=True, slots=True)
class GroupView:
    """How one consumer group stands on one message (``leased`` None: no lease at all)."""

    name: str
    consumed: bool
    leased: bool | None
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """One DLQ copy of a message."""

    consumer_group: str
    error_message: str | None
    retry_count: int
    failed_at: datetime


@dataclass(frozen=True, slots=True)
class MessageDetailRow(StoredMessageRow):
    """One message with its payload (as stored), its queue's delivery options, every group's
    standing on it and its DLQ copies (newest first)."""

    payload: str
    lease_time_s: int
    retry_limit: int
    retry_delay_ms: int
    ttl_s: int
    priority: int
    groups: list[GroupView]
    dlq: list[DeadLetterRecord]


@dataclass(frozen=True, slots=True)
class DeadLetterTarget:
    """A dead letter to deliver again, and where."""

    id: int
    partition_id: int
    queue_name: str
    partition_name: str


@dataclass(frozen=True, slots=True)
class RetriedCopy:
    """A dead letter delivered again: its copy at ``offset`` of its partition, for
    ``consumer_group``."""

    partition_id: int
    transaction_id: str
    consumer_group: str
    offset: int


@dataclass(frozen=True, slots=True)
class ClearedRow:
    """``known``: the queue (and partition) exist; ``kept``: messages left inside live
    leases' writes."""

    known: bool
    cleared: int
    kept: int


@dataclass(frozen=True, slots=True)
class DeadLetterSummary:
    """The dead letters of a window: the partitions they came from and the most frequent
    error messages (message, count), most first."""

    partitions: int = 0
    top_errors: list[tuple[str, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Leases:
    """The leases live now (every group's): how many, on how many partitions, the messages
    they hand out and how many of those are acknowledged already."""

    active: int = 0
    partitions: int = 0
    messages: int = 0
    acked: int = 0


@dataclass(frozen=True, slots=True)
class TableSize:
    name: str
    bytes: int
    rows: int  # the planner's estimate


@dataclass(frozen=True, slots=True)
class PostgresRow:
    """The database server: version, database name and size, connections, and the database's
    transaction, block and row counters (``pg_stat_database``)."""

    version: str
    name: str
    database_bytes: int
    connections: int
    active: int
    max_connections: int
    xact_commit: int
    xact_rollback: int
    blks_read: int
    blks_hit: int
    deadlocks: int
    tup_inserted: int
    tup_updated: int
    tup_deleted: int
    tables: list[TableSize]  # the broker's tables, by name


@dataclass(frozen=True, slots=True)
class TableStats:
    """One table of the broker's schema: blocks read from disk (``heap_read``) and found in
    the cache, rows, updates, vacuums and sizes (bytes, and as PostgreSQL writes them)."""

    schema: str
    name: str
    heap_read: int
    heap_hit: int
    live: int
    dead: int
    updates: int
    hot_updates: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    autovacuum_count: int
    autoanalyze_count: int
    total_bytes: int
    table_bytes: int
    index_bytes: int
    total_size: str
    table_size: str
    index_size: str


@dataclass(frozen=True, slots=True)
class IndexStats:
    schema: str
    table: str
    name: str
    read: int
    hit: int


@dataclass(frozen=True, slots=True)
class RunningQuery:
    """A statement running for over a second."""

    pid: int
    duration_s: float
    state: str | None
    query: str
    wait_event_type: str | None
    wait_event: str | None


@dataclass(frozen=True, slots=True)
class PostgresDetailRow:
    """Per table and index of the broker's schema, the statements running for over a second,
    and ``shared_buffers`` (in 8 kB pages, and written out)."""

    tables: list[TableStats]
    indexes: list[IndexStats]
    running: list[RunningQuery]
    shared_buffers: int
    shared_buffers_size: str


def _time(text: str | None) -> datetime | None:
    """A time PostgreSQL wrote into JSON."""
    return None if text is None else datetime.fromisoformat(text)


_OPTION_COLUMNS = ", ".join(
    "dedup_window_seconds AS dedup_window_s" if f.name == "dedup_window_s" else f.name
    for f in dataclasses.fields(QueueOptions)
)


def _queue_config(
    *, id: int, name: str, namespace: str, task: str, created_at: datetime, **options: Any
) -> QueueConfigRow:
    return QueueConfigRow(id, name, namespace, task, created_at, QueueOptions(**options))


def _message_detail(
    *, groups: list[dict[str, Any]], dlq: list[dict[str, Any]] | None, **columns: Any
) -> MessageDetailRow:
    return MessageDetailRow(
        **columns,
        groups=[
            GroupView(g["name"], g["consumed"], g["leased"], _time(g["lease_expires_at"]))
            for g in groups
        ],
        dlq=[
            DeadLetterRecord(
                consumer_group=d["consumer_group"],
                error_message=d["error_message"],
                retry_count=d["retry_count"],
                failed_at=datetime.fromisoformat(d["failed_at"]),
            )
            for d in dlq or []
        ],
    )


def _dead_letter_summary(*, partitions: int, errors: list[dict[str, Any]]) -> DeadLetterSummary:
    return DeadLetterSummary(partitions, [(e["error"], int(e["count"])) for e in errors])


def _retried(
    *, partition_id: int, transaction_id: str, consumer_group: str, msg_offset: int
) -> RetriedCopy:
    return RetriedCopy(partition_id, transaction_id, consumer_group, msg_offset)


def _postgres(*, tables: list[dict[str, Any]], **columns: Any) -> PostgresRow:
    return PostgresRow(
        **columns, tables=[TableSize(t["table"], int(t["bytes"]), int(t["rows"])) for t in tables]
    )


def _postgres_detail(
    *,
    tables: list[dict[str, Any]],
    indexes: list[dict[str, Any]],
    active: list[dict[str, Any]],
    shared_buffers: int,
    shared_buffers_size: str,
) -> PostgresDetailRow:
    return PostgresDetailRow(
        tables=[
            TableStats(
                schema=t["schema"],
                name=t["table"],
                heap_read=int(t["heap_read"]),
                heap_hit=int(t["heap_hit"]),
                live=int(t["live"]),
                dead=int(t["dead"]),
                updates=int(t["updates"]),
                hot_updates=int(t["hot_updates"]),
                last_vacuum=_time(t["last_vacuum"]),
                last_autovacuum=_time(t["last_autovacuum"]),
                autovacuum_count=int(t["autovacuum_count"]),
                autoanalyze_count=int(t["autoanalyze_count"]),
                total_bytes=int(t["total_bytes"]),
                table_bytes=int(t["table_bytes"]),
                index_bytes=int(t["index_bytes"]),
                total_size=t["total_size"],
                table_size=t["table_size"],
                index_size=t["index_size"],
            )
            for t in tables
        ],
        indexes=[
            IndexStats(i["schema"], i["table"], i["index"], int(i["read"]), int(i["hit"]))
            for i in indexes
        ],
        running=[
            RunningQuery(
                pid=int(q["pid"]),
                duration_s=float(q["duration"]),
                state=q["state"],
                query=q["query"] or "",
                wait_event_type=q["wait_event_type"],
                wait_event=q["wait_event"],
            )
            for q in active
        ],
        shared_buffers=shared_buffers,
        shared_buffers_size=shared_buffers_size,
    )


class PgAdminStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    async def queues(
        self,
        *,
        name: str | None = None,
        search: str | None = None,
        namespace: str | None = None,
        task: str | None = None,
        limit: int,
        offset: int,
    ) -> list[QueueRow]:
        """One page of queues (name order) with their totals and ``full_count``."""
        return await self.pool.fetch_all(
            "SELECT * FROM queen.admin_queues(%s, %s, %s, %s, %s, %s)",
            (name, search, namespace, task, limit, offset),
            row=QueueRow,
        )

    async def queue(self, name: str) -> QueueConfigRow | None:
        """The queue's row with its options, or None."""
        return await self.pool.fetch_one(
            "SELECT id, name, namespace, task, created_at, "
            + _OPTION_COLUMNS
            + " FROM queen.queues WHERE name = %s",
            (name,),
            row=_queue_config,
        )

    async def partitions(
        self,
        queue_id: int,
        *,
        limit: int,
        offset: int,
        order: str = "name",
        search: str | None = None,
    ) -> list[PartitionRow]:
        """One page of a queue's partitions with their figures, in ``order`` (one of
        :data:`PARTITION_ORDERS`); with ``search``, those whose name holds it (any case)."""
        by = PARTITION_ORDERS[order]
        return await self.pool.fetch_all(
            f"""SELECT * FROM queen.admin_partition_stats(ARRAY[%s]::bigint[])
                WHERE %s::text IS NULL OR strpos(lower(name), lower(%s::text)) > 0
                ORDER BY {by} LIMIT %s OFFSET %s""",
            (queue_id, search, search, limit, offset),
            row=PartitionRow,
        )

    async def dlq_by_partition(self, queue_id: int) -> dict[int, int]:
        rows = await self.pool.fetch_all(
            """SELECT partition_id, count(*) AS n FROM queen.dlq WHERE queue_id = %s
               GROUP BY partition_id""",
            (queue_id,),
        )
        return {int(partition_id): int(n) for partition_id, n in rows}

    async def groupings(self, column: str) -> list[GroupingRow]:
        """Queues and partitions per namespace or per task (``column``), with totals."""
        if column not in ("namespace", "task"):
            raise ValueError(column)
        return await self.pool.fetch_all(
            f"""SELECT q.{column} AS key, count(DISTINCT q.id) AS queues,
                       count(s.partition_id) AS partitions,
                       coalesce(sum(s.held), 0)::bigint AS held,
                       coalesce(sum(s.undone), 0)::bigint AS undone,
                       coalesce(sum(s.processing), 0)::bigint AS processing,
                       coalesce(sum(s.most_undone), 0)::bigint AS most_undone,
                       coalesce(sum(s.most_processing), 0)::bigint AS most_processing
                FROM queen.queues q
                LEFT JOIN queen.admin_partition_stats(
                    ARRAY(SELECT id FROM queen.queues)) s ON s.queue_id = q.id
                WHERE q.{column} <> ''
                GROUP BY q.{column} ORDER BY q.{column}""",
            row=GroupingRow,
        )

    async def totals(self) -> TotalsRow:
        """Every queue together: counts of queues, partitions, namespaces, tasks, groups and
        queue mode's message totals."""
        row = await self.pool.fetch_one(
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
                      min(s.start_at) AS oldest_pending_at,
                      coalesce(sum(s.most_undone), 0)::bigint AS most_undone,
                      coalesce(sum(s.most_processing), 0)::bigint AS most_processing,
                      coalesce(sum(s.most_done), 0)::bigint AS most_done,
                      coalesce(sum(s.most_dead), 0)::bigint AS most_dead
               FROM queen.admin_partition_stats(ARRAY(SELECT id FROM queen.queues)) s""",
            row=TotalsRow,
        )
        assert row is not None  # an aggregate: always one row
        return row

    async def groups(
        self,
        *,
        group: str | None = None,
        queue: str | None = None,
        limit: int,
        offset: int,
    ) -> list[GroupRow]:
        """One page of (consumer group, queue) pairs with their lag and ``full_count``."""
        return await self.pool.fetch_all(
            "SELECT * FROM queen.admin_groups(%s, %s, %s, %s, %s)",
            (group, queue, limit, offset, STUCK_IDLE_S),
            row=GroupRow,
        )

    async def group_alerts(self, *, lagging_s: float, limit: int) -> list[GroupAlertRow]:
        """The (group, queue) pairs with stuck partitions or whose oldest message still to
        receive is over ``lagging_s`` old, those with the most stuck partitions first, then the
        longest waiting: the first ``limit``, each row counting every such pair. One statement
        over every pair."""
        return await self.pool.fetch_all(
            """SELECT g.*, count(*) OVER () AS alert_pairs,
                      count(*) FILTER (WHERE g.oldest_at < now() - make_interval(secs => %s))
                          OVER () AS lagging_pairs,
                      count(*) FILTER (WHERE g.stuck > 0) OVER () AS stuck_pairs
               FROM queen.admin_groups(NULL, NULL, NULL, 0, %s) g
               WHERE g.stuck > 0 OR g.oldest_at < now() - make_interval(secs => %s)
               ORDER BY g.stuck DESC, g.oldest_at, g.consumer_group, g.queue_name
               LIMIT %s""",
            (lagging_s, STUCK_IDLE_S, lagging_s, limit),
            row=GroupAlertRow,
        )

    async def group_partitions(
        self, group: str, queue_id: int, *, limit: int, offset: int, order: str = "name"
    ) -> list[GroupPartitionRow]:
        """One page of a group's partitions on one queue, in ``order`` (one of
        :data:`GROUP_PARTITION_ORDERS`)."""
        if order not in GROUP_PARTITION_ORDERS:
            raise ValueError(order)
        return await self.pool.fetch_all(
            "SELECT * FROM queen.admin_group_partitions(%s, %s, %s, %s, %s, %s)",
            (group, queue_id, limit, offset, order, STUCK_IDLE_S),
            row=GroupPartitionRow,
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
    ) -> list[MessageRow]:
        """Stored messages, newest first (no payloads)."""
        return await self.pool.fetch_all(
            "SELECT * FROM queen.admin_messages(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (queue, partition, namespace, task, status, since, until, limit, offset),
            row=MessageRow,
        )

    async def find_partitions(self, queue: str, transaction_id: str, limit: int) -> list[int]:
        """Ids of the partitions of ``queue`` holding a message with ``transaction_id``."""
        rows = await self.pool.fetch_all(
            "SELECT * FROM queen.admin_find_partitions(%s, %s, %s)",
            (queue, transaction_id, limit),
        )
        return [int(partition_id) for (partition_id,) in rows]

    async def message(self, partition_id: int, transaction_id: str) -> MessageDetailRow | None:
        return await self.pool.fetch_one(
            "SELECT * FROM queen.admin_message(%s, %s)",
            (partition_id, transaction_id),
            row=_message_detail,
        )

    async def delete_message(self, partition_id: int, transaction_id: str) -> str:
        """``deleted``, ``leased`` (inside a live lease: left alone) or ``missing``."""
        row = await self.pool.fetch_one(
            "SELECT queen.admin_delete_message(%s, %s)", (partition_id, transaction_id)
        )
        assert row is not None
        return str(row[0])

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
    ) -> list[DeadLetterTarget]:
        """Dead letters of one message, or of a queue's filter, in id order, ids in
        (``after``, ``upto``]."""
        return await self.pool.fetch_all(
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
            row=DeadLetterTarget,
        )

    async def last_dead_letter_id(self) -> int:
        row = await self.pool.fetch_one("SELECT coalesce(max(id), 0) FROM queen.dlq")
        assert row is not None
        return int(row[0])

    async def retry_dead_letters(
        self, targets: list[DeadLetterTarget], turn: Turn
    ) -> list[RetriedCopy]:
        """Deliver those dead letters again (one row per copy appended). ``turn``: the push
        service's hold of their partitions (raises :class:`queen.primitives.NoTurn`, nothing
        sent, without it)."""
        keys = {PartitionKey(t.queue_name, t.partition_name) for t in targets}
        require_turn(turn, keys, "a dead letter retry")
        ids = [t.id for t in targets]
        return await self.pool.fetch_all(
            "SELECT * FROM queen.admin_retry_dead_letters(%s)", (ids,), row=_retried
        )

    async def dead_letter_message(
        self, partition_id: int, transaction_id: str, group: str, error: str | None
    ) -> str:
        """``moved``, ``already``, ``consumed``, ``leased``, ``no_group`` or ``missing``."""
        row = await self.pool.fetch_one(
            "SELECT queen.admin_dead_letter_message(%s, %s, %s, %s)",
            (partition_id, transaction_id, group, error),
        )
        assert row is not None
        return str(row[0])

    async def clear(self, queue: str, partition: str | None) -> ClearedRow:
        row = await self.pool.fetch_one(
            "SELECT * FROM queen.admin_clear(%s, %s)", (queue, partition), row=ClearedRow
        )
        assert row is not None
        return row

    async def dead_letter_summary(
        self, since: datetime, until: datetime, queue: str | None = None
    ) -> DeadLetterSummary:
        """The dead letters that failed in [since, until] (of ``queue`` only, if given): the
        partitions they came from, and the five most frequent error messages with their
        counts."""
        row = await self.pool.fetch_one(
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
            row=_dead_letter_summary,
        )
        assert row is not None
        return row

    async def live_leases(self) -> Leases:
        """The leases live now, every group's (queue mode's too): how many, on how many
        partitions, the messages they still hold (from the cursor to the lease's end) and how
        many of those are acknowledged already (out of order)."""
        row = await self.pool.fetch_one(
            """SELECT count(*) AS active, count(DISTINCT partition_id) AS partitions,
                      coalesce(sum(lease_end - next_offset), 0)::bigint AS messages,
                      coalesce(sum(cardinality(acked)), 0) AS acked
                 FROM queen.cursors
                WHERE lease_id IS NOT NULL AND lease_expires_at > now()""",
            row=Leases,
        )
        assert row is not None
        return row

    async def postgres_detail(self) -> PostgresDetailRow:
        """Per table and index of the broker's schema: block reads from disk and from the
        cache, live and dead rows, updates (HOT ones too), vacuums and sizes (bytes, and as
        PostgreSQL writes them); the statements running for over a second (other than this
        one); ``shared_buffers`` (in 8 kB pages, and written out)."""
        row = await self.pool.fetch_one(
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
                 (SELECT setting::bigint FROM pg_settings
                   WHERE name = 'shared_buffers') AS shared_buffers,
                 (SELECT pg_size_pretty(setting::bigint * 8192) FROM pg_settings
                   WHERE name = 'shared_buffers') AS shared_buffers_size""",
            row=_postgres_detail,
        )
        assert row is not None
        return row

    async def postgres(self) -> PostgresRow:
        """The database server: version, size, connections, transaction and cache figures,
        and the broker's tables: their size, and their live rows as PostgreSQL's statistics
        count them (where those have nothing, the planner's estimate, which reads 0 until a
        table's first ANALYZE)."""
        row = await self.pool.fetch_one(
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
                                  'rows', coalesce(st.n_live_tup,
                                                   greatest(c.reltuples, 0)::bigint))
                              ORDER BY c.relname), '[]')
                       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                       LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
                       WHERE n.nspname = 'queen' AND c.relkind = 'r') AS tables
               FROM pg_stat_database d WHERE d.datname = current_database()""",
            row=_postgres,
        )
        assert row is not None
        return row

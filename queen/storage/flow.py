"""``queen.queue_flow``: per minute, queue and broker process, the flow that process saved
(:class:`queen.flow.SharedFlow`), and the processes' rows added up.

A flush is one statement in autocommit mode: the minutes past the span deleted (rows another
process is deleting at the same time are skipped, never waited for), and this process's
changed rows written with their absolute figures (written again, they are the same). The rows
travel as a few texts rather than as Python lists (see :mod:`queen.storage.postgres`): names
joined by ``chr(31)`` (intake refuses control characters in names), numbers as array
literals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from queen.flow import Flow, FlowRow
from queen.storage.pool import ConnectionPool
from queen.storage.postgres import SEP

# every process's rows of the minutes past the span; rows another process is deleting are
# skipped, never waited for
_DELETE_SQL = """
DELETE FROM queen.queue_flow
 WHERE (minute, queue_name, process) IN (
       SELECT minute, queue_name, process FROM queen.queue_flow
        WHERE minute < to_timestamp(%(oldest)s) FOR UPDATE SKIP LOCKED)
"""

_SAVE_SQL = f"""
WITH gone AS ({_DELETE_SQL})
INSERT INTO queen.queue_flow AS f (minute, queue_name, process, pushes, pops, lag_sum_s,
                                   lag_max_s, empty_pops, acks, acks_refused)
SELECT to_timestamp(m), q, %(process)s, pushes, pops, lag_sum_s, lag_max_s, empty_pops, acks,
       acks_refused
  FROM unnest(%(minutes)s::bigint[], string_to_array(%(queues)s, chr(31)),
              %(pushes)s::bigint[], %(pops)s::bigint[], %(lag_sum_s)s::float8[],
              %(lag_max_s)s::float8[], %(empty_pops)s::bigint[], %(acks)s::bigint[],
              %(acks_refused)s::bigint[])
       AS t(m, q, pushes, pops, lag_sum_s, lag_max_s, empty_pops, acks, acks_refused)
ON CONFLICT (minute, queue_name, process) DO UPDATE
   SET pushes = excluded.pushes, pops = excluded.pops, lag_sum_s = excluded.lag_sum_s,
       lag_max_s = excluded.lag_max_s, empty_pops = excluded.empty_pops,
       acks = excluded.acks, acks_refused = excluded.acks_refused
"""

_READ_SQL = """
SELECT extract(epoch FROM minute)::bigint, queue_name,
       sum(pushes)::bigint, sum(pops)::bigint, sum(lag_sum_s), max(lag_max_s),
       sum(empty_pops)::bigint, sum(acks)::bigint, sum(acks_refused)::bigint
  FROM queen.queue_flow
 WHERE minute > to_timestamp(%(since)s) AND minute <= to_timestamp(%(until)s)
   AND (%(queue)s::text IS NULL OR queue_name = %(queue)s)
   AND (process <> %(process)s OR minute < to_timestamp(%(own_before)s))
 GROUP BY 1, 2
"""


def _literal(values: Iterable[object]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


class PgFlowStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    async def save_flow(self, process: str, rows: Sequence[FlowRow], oldest: int) -> int:
        """Write ``rows`` as ``process``'s (absolute figures) and delete every process's rows
        of the minutes before ``oldest`` (epoch seconds); how many rows were written."""
        if not rows:
            await self.pool.execute(_DELETE_SQL, {"oldest": oldest})
            return 0
        flows = [f for _, _, f in rows]
        return await self.pool.execute(
            _SAVE_SQL,
            {
                "oldest": oldest,
                "process": process,
                "minutes": _literal(m for m, _, _ in rows),
                "queues": SEP.join(q for _, q, _ in rows),
                "pushes": _literal(f.pushes for f in flows),
                "pops": _literal(f.pops for f in flows),
                "lag_sum_s": _literal(repr(float(f.lag_sum_s)) for f in flows),
                "lag_max_s": _literal(repr(float(f.lag_max_s)) for f in flows),
                "empty_pops": _literal(f.empty_pops for f in flows),
                "acks": _literal(f.acks for f in flows),
                "acks_refused": _literal(f.acks_refused for f in flows),
            },
        )

    async def saved_flow(
        self, process: str, own_before: int, since: float, until: float, queue: str | None
    ) -> list[FlowRow]:
        """Per minute starting after ``since`` less a minute up to ``until`` (epoch seconds)
        and queue (``queue`` alone, when given): the rows of the processes other than
        ``process`` added up, with ``process``'s own of the minutes before ``own_before``
        (those it no longer holds in memory)."""
        rows = await self.pool.fetch_all(
            _READ_SQL,
            {
                "process": process,
                "own_before": own_before,
                "since": since - 60,
                "until": until,
                "queue": queue,
            },
        )
        return [(int(row[0]), row[1], Flow(*row[2:])) for row in rows]

"""The retention loop: removes expired segments and prunes the dedup sidecar.

Run as a supervised loop. Every ``interval_s`` (sooner for a queue whose own time is short:
:func:`pause_after`) it runs one pass: bounded batches of
``queen.retention_batch`` (whole segments past their queue's ``retentionSeconds``, or past
``completedRetentionSeconds`` once every consumer group is past them; only for queues with
``retentionEnabled``), then of ``queen.evict_batch`` (whole segments older than their queue's
``maxWaitTimeSeconds`` that some consumer group has not consumed), then of
``queen.prune_dedup_batch`` (sidecar rows outside their queue's current dedup window, and rows
of deleted partitions), then of ``queen.trace_retention_batch`` (traces whose message is
gone: their partition holds no segment stored before them). Each batch is one short
transaction, so no long lock is held and pushes never wait for it (it takes no partition row
lock at all); a pass stops after ``max_batches`` batches of each kind and goes on at the next
interval. Only one broker process runs a pass at a time: the others find the advisory lock
taken and skip theirs.

Why nothing still needed is removed: retention and eviction remove only segments older than
their queue's time, and never one holding a message under a live lease (see the SQL); pruning
removes only sidecar rows older than their queue's *current* window, and the probe looks no
further back than that window anyway, so a pruned row could never have matched.

A pass ends with ``queen.refresh_statistics``: the broker's tables whose size has doubled since
their planner statistics were taken are analysed, so no session keeps plans made for a table
a fraction of its present size (autovacuum's own analysis may come much later).

The loop owns nothing but its timer; a failed pass (database away) is logged, reported to the
loop's supervision (``/health`` shows the loop failing until a pass succeeds again) and retried
at the next interval. Cancelling ``run`` stops it between batches at the latest.
"""

from __future__ import annotations

import logging

import trio

from queen.errors import StoreError
from queen.metrics import Metrics
from queen.storage.retention import PassOutcome, PgRetentionStore
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.retention")

# A queue's own time (retentionSeconds and the like) is honoured within a quarter of it: the
# pause before the next pass is at most that, and never below this.
SHORTEST_PAUSE_S = 1.0


def pause_after(outcome: PassOutcome, interval_s: float) -> float:
    """The pause before the next pass: ``interval_s``, or a quarter of the shortest time a
    queue asks for when that is less (at least :data:`SHORTEST_PAUSE_S`)."""
    if outcome.shortest_s is None:
        return interval_s
    return max(min(SHORTEST_PAUSE_S, interval_s), min(interval_s, outcome.shortest_s / 4))


class RetentionLoop:
    def __init__(
        self,
        store: PgRetentionStore,
        metrics: Metrics,
        *,
        interval_s: float,
        batch_limit: int,
        max_batches: int,
    ) -> None:
        self.store = store
        self._metrics = metrics
        self._interval_s = interval_s
        self._batch_limit = batch_limit
        self._max_batches = max_batches

    async def run_pass(self) -> PassOutcome:
        """One pass now (also used by tests and operators); counted in the metrics."""
        outcome = await self.store.run_pass(self._batch_limit, self._max_batches)
        m = self._metrics
        if outcome.ran:
            m.retention_passes += 1
        m.retention_segments_removed += outcome.segments
        m.retention_messages_removed += outcome.messages
        m.dedup_rows_pruned += outcome.sidecar_rows
        m.retention_traces_removed += outcome.traces
        m.eviction_segments_removed += outcome.evicted_segments
        m.eviction_messages_removed += outcome.evicted_messages
        if outcome.evicted_segments:
            log.info(
                "eviction removed %d segments (%d messages) that waited past maxWaitTimeSeconds",
                outcome.evicted_segments,
                outcome.evicted_messages,
            )
        if outcome.segments or outcome.sidecar_rows:
            log.info(
                "retention removed %d segments (%d messages), pruned %d sidecar rows",
                outcome.segments,
                outcome.messages,
                outcome.sidecar_rows,
            )
        if outcome.traces:
            log.info("retention removed %d traces of removed messages", outcome.traces)
        if outcome.tables_analyzed:
            log.debug("analysed %d tables that outgrew their statistics", outcome.tables_analyzed)
        return outcome

    async def run(
        self, *, task_status: trio.TaskStatus[RetentionLoop] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """A pass every ``interval_s`` (or :func:`pause_after`'s shorter pause) until
        cancelled, the pause after each pass (not a fixed rate: see
        :meth:`queen.maintenance.MaintenanceSwitch.run`)."""
        task_status.started(self)
        failed = 0  # passes failed in a row
        pause = self._interval_s
        while True:
            await trio.sleep(pause)
            pause = self._interval_s
            try:
                pause = pause_after(await self.run_pass(), self._interval_s)
            except StoreError as exc:
                failed += 1
                log.warning("retention pass failed: %s", exc)
                report_failure(exc)
            else:
                if failed:
                    log.info("retention pass done again after %d failed passes", failed)
                    failed = 0
                report_ok()

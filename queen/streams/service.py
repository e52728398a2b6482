"""The streams side of the broker: what ``/streams/v1/*`` does between validation and SQL.

:class:`StreamsService` registers queries, applies cycles and reads state. It owns no task
and no state of its own: the rules are in ``queen/storage/streams.sql``, and a cycle's sink
partitions are held through the consume side's push service
(:meth:`queen.push.PushService.hold`) for the write, as a transaction's are.
Sink pushes to encrypted queues are sealed before the database call, exactly like a
transaction's pushes; a committed cycle wakes the pops waiting on its sink queues (and on
its source queue when the lease was released).
"""

from __future__ import annotations

from queen.consume.results import TxPushResult
from queen.consume.service import ConsumeService
from queen.errors import QueenError
from queen.records import CycleRequest, RegisterRequest, StateEntry, StateQuery
from queen.storage.consume import PushedFrame
from queen.storage.streams import PgStreamsStore
from queen.streams.results import CycleResult, QueryRegistered, SourceAcked


class QueryConflict(QueenError):
    """A known query name was registered with another config hash and no reset (HTTP 409)."""

    def __init__(self, query_id: str, name: str) -> None:
        super().__init__(
            f"config_hash mismatch: the operator chain of query {name!r} changed. Pass "
            "reset:true to wipe its state, or use a new query name."
        )
        self.query_id = query_id
        self.name = name


class UnknownQuery(QueenError):
    """The query id names no registered query (HTTP 404); nothing was applied."""


_FAILURES = {
    "lease": "Invalid or expired lease",
    "message": "Message not found",
}


class StreamsService:
    def __init__(self, store: PgStreamsStore, consume: ConsumeService) -> None:
        self.store = store
        self.consume = consume

    async def register(self, request: RegisterRequest) -> QueryRegistered:
        """Register or find a query; raises :class:`QueryConflict` on a changed config hash
        without ``reset``."""
        done = await self.store.register(request)
        if done.conflict:
            raise QueryConflict(done.query_id, request.name)
        return QueryRegistered(
            done.query_id, request.name, request.config_hash, done.fresh, done.reset
        )

    async def cycle(self, request: CycleRequest, producer_sub: str | None) -> CycleResult:
        """Apply one cycle atomically. A stale lease or an unknown message answers
        ``success`` False with nothing applied; an unknown query raises
        :class:`UnknownQuery`. Its sink partitions are held for the write (raises
        :class:`queen.push.PartitionsBusy`, nothing applied, when one cannot be written now)."""
        if request.push is not None:
            for batch in request.push.batches:
                self.consume.encryption.seal(batch.key.queue, [batch])
        outcome = await self.consume.push.write_held(
            request.push_keys(), lambda turn: self.store.cycle(request, producer_sub, turn)
        )
        metrics = self.consume.metrics
        metrics.streams_cycles += 1
        if not outcome.ok and outcome.reason == "query":
            metrics.streams_cycles_failed += 1
            raise UnknownQuery(f"unknown query_id {request.query_id}")
        if not outcome.ok:
            metrics.streams_cycles_failed += 1
            reason = outcome.reason or "the cycle was rolled back"
            return CycleResult(
                success=False,
                query_id=request.query_id,
                partition_id=request.partition_id,
                queue=outcome.source_queue,
                state_ops_applied=0,
                error=_FAILURES.get(reason, reason),
            )
        pushed = [TxPushResult.of(frame) for frame in sorted(outcome.pushed, key=_by_index)]
        woken = {frame.key.queue for frame in outcome.pushed}
        if outcome.lease_released and outcome.source_queue:
            woken.add(outcome.source_queue)
        if woken:
            self.consume.wakeups.fire(woken)
        return CycleResult(
            success=True,
            query_id=request.query_id,
            partition_id=request.partition_id,
            queue=outcome.source_queue,
            state_ops_applied=request.state_ops,
            pushed=pushed,
            acked=(
                SourceAcked(outcome.acked, outcome.lease_released, outcome.dlq)
                if request.ack is not None
                else None
            ),
        )

    async def state(self, query: StateQuery) -> list[StateEntry]:
        rows = await self.store.state(query)
        if rows is None:
            raise UnknownQuery(f"unknown query_id {query.query_id}")
        return rows


def _by_index(frame: PushedFrame) -> int:
    return frame.index

"""The PostgreSQL side of the streams routes (``streams.sql``): one function call each.

A cycle's sink pushes travel as the transaction's push columns (built by the same helper as
``POST /api/v1/transaction``) and are written by ``queen.transact`` inside the cycle's own
transaction, so they follow the push path's rules: offsets under the partition row lock,
exact dedup, partitions created on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from queen.primitives import Turn, require_turn
from queen.records import (
    CycleRequest,
    RegisterRequest,
    StateEntry,
    StateQuery,
    TransactionRequest,
    TxPush,
)
from queen.storage.consume import PushedFrame, _push_arrays, _pushed
from queen.storage.pool import ConnectionPool

_REGISTER_SQL = (
    "SELECT r_id::text, r_fresh, r_reset, r_conflict"
    " FROM queen_streams.register_query(%s, %s, %s, %s, %s)"
)
_CYCLE_SQL = (
    "SELECT ok, reason, source_queue, acked, lease_released, dlq, pids, statuses, originals"
    " FROM queen_streams.cycle(%s::uuid, %s::bigint, %s::text, %s::text[], %s::text[],"
    " %s::text, %s::uuid, %s::boolean, %s::text, %s::boolean, %s::text[], %s::text[],"
    " %s::uuid[], %s::text[],"
    " %s::text[], %s::text[], %s::uuid[], %s::integer[])"
)
_STATE_SQL = (
    "SELECT known, key, value, updated_at FROM queen_streams.state_get("
    "%s::uuid, %s::bigint, %s::text[], %s::text, %s::numeric)"
)


@dataclass(frozen=True, slots=True)
class Registered:
    query_id: str
    fresh: bool
    reset: bool
    conflict: bool


@dataclass(frozen=True, slots=True)
class CycleOutcome:
    """``reason`` when not ok: 'lease', 'message', 'query' or the push failure's text."""

    ok: bool
    reason: str | None
    source_queue: str | None
    acked: int
    lease_released: bool
    dlq: bool
    pushed: list[PushedFrame]


class PgStreamsStore:
    """Query registration, cycles and state reads on PostgreSQL."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    async def register(self, request: RegisterRequest) -> Registered:
        params = (
            request.name,
            request.source_queue,
            request.sink_queue,
            request.config_hash,
            request.reset,
        )
        row = await self.pool.fetch_one(_REGISTER_SQL, params, retry_deadlock=True)
        assert row is not None
        query_id, fresh, reset, conflict = row
        return Registered(str(query_id), bool(fresh), bool(reset), bool(conflict))

    async def cycle(
        self, request: CycleRequest, producer_sub: str | None, turn: Turn
    ) -> CycleOutcome:
        """Apply one cycle atomically (``queen_streams.cycle``). ``turn``: the push service's
        hold of the sink partitions (raises :class:`queen.primitives.NoTurn`, nothing sent,
        without it)."""
        require_turn(turn, request.push_keys(), "a streaming cycle")
        frames: list[PushedFrame] = []
        push_cols: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [])
        if request.push is not None:
            pushes = TransactionRequest([], [TxPush(0, request.push)], [], request.push.count)
            frames, push_cols = _push_arrays(pushes, producer_sub)
        ack = request.ack
        params = (
            request.query_id,
            request.partition_id,
            request.consumer_group,
            request.state_keys,
            request.state_values,
            None if ack is None else ack.transaction_id,
            None if ack is None else ack.lease_id,
            ack is not None and ack.dlq,
            None if ack is None else ack.error,
            request.release_lease,
            *push_cols,
        )
        row = await self.pool.fetch_one(_CYCLE_SQL, params, retry_deadlock=True)
        assert row is not None
        ok, reason, source, acked, released, dlq, pids, statuses, originals = row
        pushed = frames
        if ok and frames:
            pushed = _pushed(frames, pids, statuses, originals)
        return CycleOutcome(bool(ok), reason, source, int(acked), bool(released), bool(dlq), pushed)

    async def state(self, query: StateQuery) -> list[StateEntry] | None:
        """The matching rows in key order; None when the query is not registered."""
        params = (
            query.query_id,
            query.partition_id,
            query.keys,
            query.key_prefix,
            query.ripe_at_or_before,
        )
        rows = await self.pool.fetch_all(_STATE_SQL, params, retry_deadlock=True)
        if not rows:
            return None
        return [StateEntry(r[1], r[2], r[3]) for r in rows if r[1] is not None]


__all__ = ["CycleOutcome", "PgStreamsStore", "Registered"]

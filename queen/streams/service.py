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

from typing import Any

import orjson

from queen.consume.errors import ConsumeUnavailable
from queen.consume.service import ConsumeService
from queen.records import CycleRequest, RegisterRequest, StateQuery
from queen.storage.streams import PgStreamsStore


class QueryConflict(Exception):
    """A known query name was registered with another config hash and no reset (HTTP 409).
    ``body`` is the answer to send."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body["error"])
        self.body = body


class UnknownQuery(Exception):
    """The query id names no registered query (HTTP 404); nothing was applied."""


_FAILURES = {
    "lease": "Invalid or expired lease",
    "message": "Message not found",
}


class StreamsService:
    def __init__(self, store: PgStreamsStore, consume: ConsumeService) -> None:
        self.store = store
        self.consume = consume

    async def register(self, request: RegisterRequest) -> dict[str, Any]:
        """Register or find a query; raises :class:`QueryConflict` on a changed config hash
        without ``reset``."""
        done = await self.store.register(request)
        if done.conflict:
            raise QueryConflict(
                {
                    "success": False,
                    "query_id": done.query_id,
                    "name": request.name,
                    "error": (
                        f"config_hash mismatch: the operator chain of query {request.name!r} "
                        "changed. Pass reset:true to wipe its state, or use a new query name."
                    ),
                }
            )
        return {
            "success": True,
            "query_id": done.query_id,
            "name": request.name,
            "config_hash": request.config_hash,
            "fresh": done.fresh,
            "reset": done.reset,
        }

    async def cycle(self, request: CycleRequest, producer_sub: str | None) -> dict[str, Any]:
        """Apply one cycle atomically. A stale lease or an unknown message answers
        ``success: false`` with nothing applied; an unknown query raises
        :class:`UnknownQuery`."""
        keys = [batch.key for batch in request.push.batches] if request.push is not None else []
        push = self.consume.push
        if keys and push is None:
            raise ConsumeUnavailable("a cycle with sink pushes needs the push service")
        if request.push is not None:
            for batch in request.push.batches:
                self.consume.encryption.seal(batch.key.queue, [batch])
        if push is None:
            outcome = await self.store.cycle(request, producer_sub)
        else:
            async with push.hold(keys):
                outcome = await self.store.cycle(request, producer_sub)
        metrics = self.consume.metrics
        metrics.streams_cycles += 1
        if not outcome.ok and outcome.reason == "query":
            metrics.streams_cycles_failed += 1
            raise UnknownQuery(f"unknown query_id {request.query_id}")
        body: dict[str, Any] = {
            "success": outcome.ok,
            "query_id": request.query_id,
            "partition_id": str(request.partition_id),
            "queueName": outcome.source_queue,
            "state_ops_applied": request.state_ops if outcome.ok else 0,
            "push_results": [],
            "ack_result": None,
        }
        if not outcome.ok:
            metrics.streams_cycles_failed += 1
            reason = outcome.reason or "the cycle was rolled back"
            body["error"] = _FAILURES.get(reason, reason)
            return body
        body["push_results"] = [
            {
                "index": frame.index,
                "transaction_id": frame.transaction_id,
                "status": "duplicate" if frame.duplicate_of else "queued",
                "message_id": frame.duplicate_of or frame.message_id,
                "partition_id": str(frame.partition_id) if frame.partition_id else None,
                "queueName": frame.key.queue,
                "partition": frame.key.partition,
            }
            for frame in sorted(outcome.pushed, key=_by_index)
        ]
        if request.ack is not None:
            body["ack_result"] = {
                "success": True,
                "count": outcome.acked,
                "lease_released": outcome.lease_released,
                "dlq": outcome.dlq,
            }
        woken = {frame.key.queue for frame in outcome.pushed}
        if outcome.lease_released and outcome.source_queue:
            woken.add(outcome.source_queue)
        if woken:
            self.consume.wakeups.fire(woken)
        return body

    async def state(self, query: StateQuery) -> dict[str, Any]:
        rows = await self.store.state(query)
        if rows is None:
            raise UnknownQuery(f"unknown query_id {query.query_id}")
        return {
            "success": True,
            "rows": [
                {
                    "key": row.key,
                    "value": orjson.Fragment(row.value),
                    "updated_at": row.updated_at.isoformat(),
                }
                for row in rows
            ],
        }


def _by_index(frame: Any) -> int:
    index: int = frame.index
    return index

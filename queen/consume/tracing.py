"""Processing traces: what consumers record about the messages they handle.

:class:`Traces` is reached as ``broker.consume.traces``. A trace names its message by
``partitionId`` and ``transactionId`` (as an ack does) and carries any JSON ``data``, an event
type and names to find it by. Traces never affect delivery; the retention pass removes a trace
once its message is gone (``queen.trace_retention_batch``), and a deleted queue takes its
traces with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from queen.consume import requests, traces
from queen.consume.errors import NotFound
from queen.consume.policy import iso_utc
from queen.intake import decode_json
from queen.storage.traces import StoredTrace, TraceStore


class Traces:
    def __init__(self, store: TraceStore) -> None:
        self.store = store
        self._worker_id = str(os.getpid())

    async def record(self, body: Any) -> dict[str, Any]:
        """Store one trace (the body of ``POST /api/v1/traces``, validated here). Raises
        :class:`NotFound` when its ``partitionId`` names no partition."""
        record = traces.trace_record(body)
        trace_id = await self.store.record(record, self._worker_id)
        if trace_id is None:
            raise NotFound(f"partition {body.get('partitionId')} not found")
        return {"success": True, "traceId": str(trace_id)}

    async def for_message(self, partition_id: int | str, transaction_id: str) -> dict[str, Any]:
        """The traces of one message, oldest first (none for an unknown partition)."""
        pid = requests.partition_id(str(partition_id))
        found = [] if pid is None else await self.store.for_message(pid, transaction_id)
        return {"traces": [_wire(t) for t in found]}

    async def by_name(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """A page of the traces carrying ``name``, oldest first (``limit`` default 100,
        ``offset``), with where each message is."""
        limit, offset = traces.page(args, 100)
        total, found = await self.store.by_name(traces.trace_name(name), limit, offset)
        return {
            "traces": [_wire(t) for t in found],
            "total": total,
            "pagination": {"limit": limit, "offset": offset},
        }

    async def names(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """A page of the trace names in use, most recently seen first (``limit`` default 50)."""
        limit, offset = traces.page(args, 50)
        total, names = await self.store.names(limit, offset)
        return {
            "trace_names": [
                {
                    "trace_name": n.name,
                    "trace_count": n.trace_count,
                    "message_count": n.message_count,
                    "last_seen": iso_utc(n.last_seen),
                }
                for n in names
            ],
            "total": total,
            "pagination": {"limit": limit, "offset": offset},
        }


def _wire(t: StoredTrace) -> dict[str, Any]:
    body: dict[str, Any] = {"id": str(t.id)}
    if t.transaction_id is not None:
        body["transaction_id"] = t.transaction_id
        body["partition_id"] = str(t.partition_id)
        body["queue_name"] = t.queue
        body["partition_name"] = t.partition
    body.update(
        event_type=t.event_type,
        data=decode_json(t.data.encode()),
        consumer_group=t.consumer_group,
        worker_id=t.worker_id,
        created_at=iso_utc(t.created_at),
        trace_names=t.names,
    )
    return body

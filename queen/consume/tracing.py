"""Processing traces: what consumers record about the messages they handle.

:class:`Traces` is reached as ``broker.consume.traces``. A trace names its message by
``partitionId`` and ``transactionId`` (as an ack does) and carries any JSON ``data``, an event
type and names to find it by. Traces never affect delivery; the retention pass removes a trace
once its message is gone (``queen.trace_retention_batch``), and a deleted queue takes its
traces with it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from queen.consume import requests, traces
from queen.consume.errors import NotFound
from queen.consume.results import TraceNamePage, TracePage, TraceRecorded
from queen.encryption import QueueEncryption
from queen.records import StoredTrace
from queen.storage.traces import TraceStore


class Traces:
    def __init__(self, store: TraceStore, encryption: QueueEncryption | None = None) -> None:
        self.store = store
        self.encryption = encryption or QueueEncryption(None, None, refresh_s=1.0)
        self._worker_id = str(os.getpid())

    async def record(self, body: Any) -> TraceRecorded:
        """Store one trace (the body of ``POST /api/v1/traces``, validated here). Raises
        :class:`NotFound` when its ``partitionId`` names no partition. On an encrypted queue
        ``data`` is stored sealed, as payloads are."""
        record = traces.trace_record(body)
        if record.partition_id is not None and self.encryption.cipher is not None:
            queue = await self.store.queue_of(record.partition_id)
            if queue is None:
                raise NotFound(f"partition {body.get('partitionId')} not found")
            sealed = self.encryption.seal_trace(
                queue, record.partition_id, record.transaction_id, record.data
            )
            record = dataclasses.replace(record, data=sealed)
        trace_id = await self.store.record(record, self._worker_id)
        if trace_id is None:
            raise NotFound(f"partition {body.get('partitionId')} not found")
        return TraceRecorded(trace_id)

    async def for_message(self, partition_id: int | str, transaction_id: str) -> TracePage:
        """The traces of one message, oldest first (none for an unknown partition)."""
        pid = requests.partition_id(str(partition_id))
        found = [] if pid is None else await self.store.for_message(pid, transaction_id)
        return TracePage([self._opened(t, pid, transaction_id) for t in found])

    async def by_name(self, name: str, args: Mapping[str, Any]) -> TracePage:
        """A page of the traces carrying ``name``, oldest first (``limit`` default 100,
        ``offset``), with where each message is."""
        limit, offset = traces.page(args, 100)
        total, found = await self.store.by_name(traces.trace_name(name), limit, offset)
        opened = [self._opened(t, t.partition_id, t.transaction_id) for t in found]
        return TracePage(opened, total, limit, offset)

    async def names(self, args: Mapping[str, Any]) -> TraceNamePage:
        """A page of the trace names in use, most recently seen first (``limit`` default 50)."""
        limit, offset = traces.page(args, 50)
        total, names = await self.store.names(limit, offset)
        return TraceNamePage(names, total, limit, offset)

    def _opened(
        self, trace: StoredTrace, partition_id: int | None, transaction_id: str | None
    ) -> StoredTrace:
        data = self.encryption.open_trace(trace.data, partition_id, transaction_id)
        return trace if data is trace.data else dataclasses.replace(trace, data=data)

"""Where a live push goes: database, spool, or hold (see :mod:`queen.actors.partition`).

- maintenance mode on, or the database down: **spool**;
- the partition still has spooled frames not yet committed, in any process sharing the spool
  directory: **hold** (the actor waits a little for the replay to catch up, then spools if it
  did not). The index is brought up to date with the directory first (see
  :mod:`queen.spool.scan`), so a frame another process answered ``buffered`` a moment ago
  counts;
- otherwise: **database**.
"""

from __future__ import annotations

import logging
import math
import time

from trio_util import RepeatedEvent

from queen.actors.messages import PushRequest
from queen.errors import StoreUnavailable
from queen.frames import concat
from queen.health import DatabaseHealth
from queen.maintenance import MaintenanceSwitch
from queen.model import PartitionKey
from queen.primitives import Route
from queen.spool.format import SpoolRecord
from queen.spool.index import SpoolIndex
from queen.spool.scan import SpoolScanner
from queen.spool.writer import SpoolError, SpoolWriter

log = logging.getLogger("queen.spool")


class SpoolRouter:
    def __init__(
        self,
        index: SpoolIndex,
        writer: SpoolWriter,
        health: DatabaseHealth,
        maintenance: MaintenanceSwitch,
        changed: RepeatedEvent,
        *,
        scanner: SpoolScanner | None = None,
    ) -> None:
        self._index = index
        self._last_scan_warning = float("-inf")
        self.scanner = scanner or SpoolScanner(writer.directory, index, writer.own_names)
        self._writer = writer
        self._health = health
        self._maintenance = maintenance
        self._changed = changed

    def route(self, key: PartitionKey, received: float = math.inf) -> Route:
        """Where the pushes of ``key`` go now. ``received``: when the latest of them arrived
        (``time.monotonic()``); the spool directory is looked at again unless a look began
        since (the hold must see what any process spooled before these pushes arrived)."""
        if self._maintenance.enabled or not self._health.up:
            return Route.SPOOL
        try:
            if self.scanner.synced_at < received and self.scanner.sync():
                self._changed.set()
        except OSError as exc:  # decide on what the index knew; the next write looks again
            now = time.monotonic()
            if now - self._last_scan_warning >= 10.0:  # not once per write
                self._last_scan_warning = now
                log.warning("spool directory %s could not be read: %s", self._writer.directory, exc)
        if self._index.pending(key) > 0:
            return Route.HOLD
        return Route.DATABASE

    async def changed(self) -> None:
        await self._changed.wait()

    async def spool(self, key: PartitionKey, requests: list[PushRequest]) -> bool:
        record = to_record(key, requests)
        try:
            await self._writer.append([record])
        except SpoolError as exc:
            log.error(
                "%d items for %s/%s answered failed: %s", len(record), key.queue, key.partition, exc
            )
            return False
        return True

    def report_unavailable(self, error: StoreUnavailable) -> None:
        self._health.report_down(error)


def to_record(key: PartitionKey, requests: list[PushRequest]) -> SpoolRecord:
    frames = concat(requests)
    return SpoolRecord(
        key=key,
        created_ms=time.time_ns() // 1_000_000,
        message_ids=frames.message_ids,
        transaction_ids=frames.transaction_ids,
        payloads=frames.payloads,
        producer_subs=frames.producer_subs,
        trace_ids=frames.trace_ids,
    )

"""The partition actor: one long-lived task per active partition.

It owns its partition's write path in this process:

- the **inbox**: a bounded channel of :class:`PushRequest`; a full inbox blocks producers;
- the **partition id** (resolved, and the queue and partition created, on first use);
- the **one write in flight**: it hands one segment to the batcher and waits for its outcome
  before it takes anything else from the inbox, so a partition is never in two writes at once;
- **coalescing**: requests that arrived during the write are packed, in arrival order, into the
  next segment;
- the **first-wins rule inside a write** (:func:`queen.actors.policy.first_wins`); the probe of
  stored history and the offset counter are read and advanced under the partition's row lock by
  that write's transaction.

Every request taken from the inbox gets exactly one answer, whatever happens. The actor stops
when it has been idle for ``idle_timeout_s``: it unregisters itself and closes its inbox in the
same step, with no checkpoint in between, so a producer either got its request into this inbox
before that step (and the actor serves it) or finds the inbox closed and asks the supervisor
for a fresh actor. When the surrounding nursery is cancelled the actor stops at once; requests
still in its inbox are answered ``failed``.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from queen.actors.messages import PushOutcome, PushRequest
from queen.actors.policy import coalesce_count, first_wins
from queen.model import PartitionKey, Status
from queen.storage.base import SegmentWrite, StoreError, WriteResult

log = logging.getLogger("queen.actors")


class SegmentWriter(Protocol):
    """Where an actor sends its segment: the batcher."""

    async def write(self, segment: SegmentWrite) -> WriteResult: ...


class WriteFailureHandler(Protocol):
    """Decides what the items of a failed write answer (``failed``, or ``buffered`` once
    spooled). Called with the requests of the write and the error."""

    async def __call__(self, requests: list[PushRequest], error: StoreError) -> None: ...


async def answer_failed(requests: list[PushRequest], error: StoreError) -> None:
    for request in requests:
        request.reply.set(PushOutcome(Status.FAILED))


class PartitionActor:
    """The single writer of one partition inside this broker process."""

    def __init__(
        self,
        key: PartitionKey,
        *,
        resolve: Callable[[PartitionKey], Awaitable[int]],
        writer: SegmentWriter,
        on_failure: WriteFailureHandler = answer_failed,
        on_idle_stop: Callable[[PartitionActor], None],
        inbox_size: int,
        idle_timeout_s: float,
        segment_max_items: int,
    ) -> None:
        self.key = key
        self.partition_id: int | None = None
        self.writes = 0
        self._resolve = resolve
        self._writer = writer
        self._on_failure = on_failure
        self._on_idle_stop = on_idle_stop
        self._idle_timeout_s = idle_timeout_s
        self._segment_max_items = segment_max_items
        self._send, self._inbox = trio.open_memory_channel[PushRequest](inbox_size)
        self._waiting: list[PushRequest] = []  # taken from the inbox, not yet written

    async def submit(self, request: PushRequest) -> None:
        """Queue ``request``; blocks while the inbox is full.

        Raises :class:`trio.BrokenResourceError` if the actor has stopped: ask the supervisor
        for a new one.
        """
        await self._send.send(request)

    async def run(self) -> None:
        """Serve the inbox until idle. See the module docstring for the guarantees."""
        try:
            while True:
                if not self._waiting:
                    first = await self._next_or_stop()
                    if first is None:
                        return
                    self._waiting.append(first)
                self._take_ready()
                count = coalesce_count([len(r) for r in self._waiting], self._segment_max_items)
                batch, self._waiting = self._waiting[:count], self._waiting[count:]
                await self._write(batch)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Close the inbox and answer ``failed`` to every request still held.

        Runs when the actor ends for any reason; after an idle stop there is nothing left.
        """
        leftovers, self._waiting = self._waiting, []
        while True:
            try:
                leftovers.append(self._inbox.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        self._inbox.close()
        for request in leftovers:
            request.reply.set(PushOutcome(Status.FAILED))

    async def _next_or_stop(self) -> PushRequest | None:
        with trio.move_on_after(self._idle_timeout_s):
            return await self._inbox.receive()
        # Idle. Stop, unless a request slipped in as the timer fired. No checkpoint from here
        # to the close, so no producer can put a request in between.
        try:
            return self._inbox.receive_nowait()
        except trio.WouldBlock:
            self._on_idle_stop(self)
            self._inbox.close()
            return None

    def _take_ready(self) -> None:
        """Move every request already waiting in the inbox to ``_waiting`` (no checkpoint)."""
        while True:
            try:
                self._waiting.append(self._inbox.receive_nowait())
            except trio.WouldBlock:
                return

    async def _write(self, batch: list[PushRequest]) -> None:
        try:
            for attempt in range(2):
                if self.partition_id is None:
                    self.partition_id = await self._resolve(self.key)
                result = await self._writer.write(_segment(self.key, self.partition_id, batch))
                if not result.partition_missing:
                    self.writes += 1
                    _deliver(batch, result)
                    return
                # The partition row vanished (its queue was deleted): create it again, retry once.
                log.info("partition %s/%s was deleted; recreating it", *_names(self.key))
                self.partition_id = None
                if attempt == 1:
                    raise StoreError("partition deleted twice during one write")
        except StoreError as error:
            await self._on_failure(batch, error)
        finally:
            for request in batch:  # never leave a producer without an answer
                request.reply.set(PushOutcome(Status.FAILED))


def _names(key: PartitionKey) -> tuple[str, str]:
    return key.queue, key.partition


def _segment(key: PartitionKey, partition_id: int, batch: list[PushRequest]) -> SegmentWrite:
    if len(batch) == 1:
        only = batch[0]
        message_ids, transaction_ids, payloads = (
            only.message_ids,
            only.transaction_ids,
            only.payloads,
        )
    else:
        message_ids, transaction_ids, payloads = [], [], []
        for request in batch:
            message_ids.extend(request.message_ids)
            transaction_ids.extend(request.transaction_ids)
            payloads.extend(request.payloads)
    subs: list[str | None] | None = None
    if any(r.producer_sub is not None for r in batch):
        subs = []
        for request in batch:
            subs.extend([request.producer_sub] * len(request))
    traces: list[str | None] | None = None
    if any(r.trace_ids is not None for r in batch):
        traces = []
        for request in batch:
            traces.extend(request.trace_ids or [None] * len(request))
    return SegmentWrite(
        partition_id=partition_id,
        message_ids=message_ids,
        transaction_ids=transaction_ids,
        payloads=payloads,
        leaders=first_wins(transaction_ids),
        key=key,
        producer_subs=subs,
        trace_ids=traces,
        request_count=len(batch),
    )


def _deliver(batch: list[PushRequest], result: WriteResult) -> None:
    """Split a write's outcome back into one outcome per request."""
    if not result.duplicates:
        for request in batch:
            request.reply.set(PushOutcome(Status.QUEUED))
        return
    starts: list[int] = []
    position = 0
    for request in batch:
        starts.append(position)
        position += len(request)
    per_request: list[dict[int, str]] = [{} for _ in batch]
    for pos, named in result.duplicates.items():
        which = bisect.bisect_right(starts, pos) - 1
        per_request[which][pos - starts[which]] = named
    for request, duplicates in zip(batch, per_request, strict=True):
        request.reply.set(PushOutcome(Status.QUEUED, duplicates))

"""The partition actor: one long-lived task per active partition.

It owns its partition's write path in this process:

- the **inbox**: a channel of :class:`PushRequest` (and fences) with no bound of its own: a
  submit never waits. Every request in it has a producer waiting for its answer, holding the
  request whether it sits in the inbox or in front of a full one, so a bound here would move
  requests, not save memory (``bench/inbox_memory.py``); what bounds them is the producers (see
  "Backpressure and memory" in ``docs/architecture.md``);
- the **partition id** (resolved, and the queue and partition created, on first use);
- the **one write in flight**: it hands one segment to the batcher (or one record to the spool)
  and waits for the outcome before it starts anything else, so a partition is never in two
  writes at once;
- **coalescing**: requests that arrived during a write are packed, in arrival order, into the
  next segment;
- the **first-wins rule inside a write** (:func:`queen.model.first_wins`); the probe of
  stored history and the offset counter are read and advanced under the partition's row lock by
  that write's transaction;
- **encryption**: the payloads of live requests for an encrypted queue are sealed
  (:class:`queen.encryption.QueueEncryption`) as they are taken for a write, before the
  database or the spool sees them;
- the **route** of its live pushes, asked of a :class:`WriteRouter` before every write:
  straight to the database; to the spool (database down, maintenance mode); or *hold*
  (the partition still has spooled frames waiting for replay: live pushes wait, up to
  ``hold_s``, so they are stored after those frames and not before).

Spool replay comes through the same inbox as requests with ``replay=True``. They always go to
the database and are served before any live request taken with them: a live request still in
the inbox arrived after everything this actor ever spooled, so the order of a partition is the
order of its pushes, across outages too.

Every request taken from the inbox gets exactly one answer, whatever happens. An idle actor
waits on its inbox with no timer of its own (thousands of idle actors would otherwise keep
thousands of deadlines and cancel scopes alive): the supervisor's reaper calls
:meth:`PartitionActor.stop_if_idle`, which stops an actor that has waited, parked on an empty
inbox, for ``idle_timeout_s``. It unregisters the actor and closes its inbox in one synchronous
step, so a producer either got its request to this actor before that step (and the actor
serves it) or finds the inbox closed and asks the supervisor for a fresh actor. When the
surrounding nursery is cancelled the actor stops at once; requests it holds or still has in its
inbox are answered ``failed``.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from queen.actors.messages import ActorStopped, PushOutcome, PushRequest
from queen.actors.policy import coalesce_count
from queen.encryption import QueueEncryption
from queen.errors import StoreError, StoreUnavailable
from queen.frames import concat
from queen.model import PartitionKey, Status, first_wins
from queen.primitives import Fence, Route, hand_over
from queen.storage.base import SegmentWrite, WriteResult

log = logging.getLogger("queen.actors")


__all__ = ["PartitionActor", "Route", "WriteRouter"]

Work = PushRequest | Fence


class SegmentWriter(Protocol):
    """Where an actor sends its segment: the batcher."""

    async def write(self, segment: SegmentWrite) -> WriteResult: ...


class WriteRouter(Protocol):
    """Decides where live pushes go, and keeps the spool side of the bargain."""

    def route(self, key: PartitionKey) -> Route: ...

    async def changed(self) -> None:
        """Return after anything that may change a route changed."""
        ...

    async def spool(self, key: PartitionKey, requests: list[PushRequest]) -> bool:
        """Make ``requests`` durable in the spool; False if they could not be."""
        ...

    def report_unavailable(self, error: StoreUnavailable) -> None: ...


class DirectRouter:
    """No spool: everything goes to the database; a failed write answers ``failed``."""

    def route(self, key: PartitionKey) -> Route:
        return Route.DATABASE

    async def changed(self) -> None:
        await trio.sleep_forever()

    async def spool(self, key: PartitionKey, requests: list[PushRequest]) -> bool:
        return False

    def report_unavailable(self, error: StoreUnavailable) -> None:
        pass


class PartitionActor:
    """The single writer of one partition inside this broker process."""

    def __init__(
        self,
        key: PartitionKey,
        *,
        resolve: Callable[[PartitionKey], Awaitable[int]],
        writer: SegmentWriter,
        router: WriteRouter,
        on_idle_stop: Callable[[PartitionActor], None],
        idle_timeout_s: float,
        segment_max_items: int,
        hold_s: float = 2.0,
        encryption: QueueEncryption | None = None,
    ) -> None:
        self.key = key
        self._encryption = encryption
        self.partition_id: int | None = None
        self._resolve = resolve
        self._writer = writer
        self._router = router
        self._on_idle_stop = on_idle_stop
        self._idle_timeout_s = idle_timeout_s
        self._segment_max_items = segment_max_items
        self._hold_s = hold_s
        self._send, self._inbox = trio.open_memory_channel[Work](math.inf)
        self._waiting: list[Work] = []  # taken from the inbox, not yet answered
        self._parked_since: float | None = None  # waiting on an empty inbox since then
        self._hold_until: float | None = None  # deadline of the current hold
        self._no_hold_until = float("-inf")  # after a hold timed out, spool without holding

    @property
    def pending(self) -> int:
        """Requests and fences queued or taken and not yet answered (for tests and
        introspection)."""
        return len(self._waiting) + self._inbox.statistics().current_buffer_used

    @property
    def holding(self) -> bool:
        """Whether live requests are held behind the partition's spooled backlog now."""
        return self._hold_until is not None

    async def submit(self, request: Work) -> None:
        """Queue ``request``; never waits and takes no checkpoint (the caller goes on to wait
        for the answer, and that wait is its checkpoint).

        Raises :class:`trio.BrokenResourceError` if the actor has stopped: ask the supervisor
        for a new one.
        """
        await hand_over(self._send, request)

    async def run(self) -> None:
        """Serve the inbox until stopped. See the module docstring for the guarantees."""
        try:
            while True:
                if not self._waiting and not await self._wait_for_work():
                    return
                self._take_ready()
                await self._serve_one_step()
        finally:
            self.abandon()

    def stop_if_idle(self, now: float) -> bool:
        """Stop the actor if it has been parked on an empty inbox for ``idle_timeout_s``.

        Synchronous: between the check and the close no producer can run. A request already
        handed to the parked actor (it has not run yet) counts as work: the actor then stays.
        """
        if self._parked_since is None or now - self._parked_since < self._idle_timeout_s:
            return False
        stats = self._inbox.statistics()
        if stats.current_buffer_used or stats.tasks_waiting_receive != 1:
            return False
        self._on_idle_stop(self)
        self._inbox.close()
        return True

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
            if isinstance(request, Fence):
                request.granted.fail(ActorStopped(f"partition {self.key} is stopping"))
            else:
                request.reply.set(PushOutcome(Status.FAILED))

    async def _wait_for_work(self) -> bool:
        """Park until a request comes (it goes to ``_waiting``); False once stopped as idle.

        Nothing of the last request served stays referenced while parked: an idle actor
        holds its inbox and little else.
        """
        self._parked_since = trio.current_time()
        try:
            self._waiting.append(await self._inbox.receive())
        except trio.ClosedResourceError:
            return False  # stop_if_idle closed the inbox
        finally:
            self._parked_since = None
        return True

    def _take_ready(self) -> None:
        """Move every request already waiting in the inbox to ``_waiting`` (no checkpoint); the
        next write takes from them what one segment holds (``segment_max_items``)."""
        while True:
            try:
                self._waiting.append(self._inbox.receive_nowait())
            except trio.WouldBlock:
                return

    async def _serve_one_step(self) -> None:
        """Do one write (or one hold, or one fence) for the requests waiting, oldest replay
        frames first; live requests are served in arrival order around fences."""
        replays = [r for r in self._waiting if isinstance(r, PushRequest) and r.replay]
        if replays:
            batch = self._take(replays)
            await self._write(batch)
            return
        head = self._waiting[0]
        if isinstance(head, Fence):
            del self._waiting[0]
            await self._stand_still(head)
            return
        route = self._route()
        if route is Route.HOLD:
            await self._hold()
            return
        live: list[PushRequest] = []
        for request in self._waiting:
            if isinstance(request, Fence):
                break  # what arrived after a fence waits for it
            live.append(request)
        batch = self._take(live)
        if self._encryption is not None:
            self._encryption.seal(self.key.queue, batch)
        if route is Route.SPOOL:
            await self._spool(batch)
        else:
            await self._write(batch)

    async def _stand_still(self, fence: Fence) -> None:
        """Answer ``fence``; on the database route, write nothing until it is released."""
        if fence.released.is_set():
            return  # its requester gave up before the grant
        route = self._router.route(self.key)
        fence.granted.set(route)
        if route is Route.DATABASE:
            await fence.released.wait()

    def _take(self, candidates: list[PushRequest]) -> list[PushRequest]:
        """Take the first of ``candidates`` (in order) that fit in one segment out of
        ``_waiting``."""
        count = coalesce_count([len(r) for r in candidates], self._segment_max_items)
        batch = candidates[:count]
        taken = set(map(id, batch))
        self._waiting = [r for r in self._waiting if id(r) not in taken]
        return batch

    def _route(self) -> Route:
        route = self._router.route(self.key)
        if route is not Route.HOLD:
            self._hold_until = None
            return route
        now = trio.current_time()
        if now < self._no_hold_until:
            return Route.SPOOL
        if self._hold_until is None:
            self._hold_until = now + self._hold_s
        elif now >= self._hold_until:
            # The backlog did not clear in time: stop holding producers for a while.
            self._hold_until = None
            self._no_hold_until = now + self._hold_s
            return Route.SPOOL
        return Route.HOLD

    async def _hold(self) -> None:
        """Wait for a new request, a route change, or the end of the hold."""
        assert self._hold_until is not None
        with trio.move_on_at(self._hold_until):
            async with trio.open_nursery() as nursery:

                async def wake_on_change() -> None:
                    await self._router.changed()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(wake_on_change)
                request = await self._inbox.receive()
                self._waiting.append(request)
                nursery.cancel_scope.cancel()

    async def _spool(self, batch: list[PushRequest]) -> None:
        stored = False
        try:
            stored = await self._router.spool(self.key, batch)
        finally:
            status = Status.BUFFERED if stored else Status.FAILED
            for request in batch:
                request.reply.set(PushOutcome(status))

    async def _write(self, batch: list[PushRequest]) -> None:
        try:
            for attempt in range(2):
                if self.partition_id is None:
                    self.partition_id = await self._resolve(self.key)
                result = await self._writer.write(_segment(self.key, self.partition_id, batch))
                if not result.partition_missing:
                    _deliver(batch, result)
                    return
                # The partition row vanished (its queue was deleted): create it again, retry once.
                log.info("partition %s/%s was deleted; recreating it", *_names(self.key))
                self.partition_id = None
                if attempt == 1:
                    raise StoreError("partition deleted twice during one write")
        except StoreUnavailable as error:
            self._router.report_unavailable(error)
            live = [r for r in batch if not r.replay]
            if live:  # not stored: keep them in the spool instead
                await self._spool(live)
        except StoreError as error:
            log.error("write of %s/%s failed: %s", *_names(self.key), error)
        finally:
            for request in batch:  # never leave a producer without an answer
                request.reply.set(PushOutcome(Status.FAILED))


def _names(key: PartitionKey) -> tuple[str, str]:
    return key.queue, key.partition


def _segment(key: PartitionKey, partition_id: int, batch: list[PushRequest]) -> SegmentWrite:
    frames = concat(batch)
    return SegmentWrite(
        partition_id=partition_id,
        message_ids=frames.message_ids,
        transaction_ids=frames.transaction_ids,
        payloads=frames.payloads,
        leaders=first_wins(frames.transaction_ids),
        key=key,
        producer_subs=frames.producer_subs,
        trace_ids=frames.trace_ids,
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

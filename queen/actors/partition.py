"""The partition actor: one long-lived task per active partition.

It owns its partition's write path in this process:

- the **inbox**: a list of :class:`PushRequest` (and fences) with no bound of its own: a
  put never waits and takes no checkpoint; it wakes the actor if it is parked with no write in
  flight. Every request in it has a producer waiting for its answer, holding the
  request whether it sits in the inbox or in front of a full one, so a bound here would move
  requests, not save memory (measured: ``docs/benchmark.md``); what bounds them is the producers
  (see "Backpressure and memory" in ``docs/producing.md``);
- the **partition id** (resolved, and the queue and partition created, on first use; asked
  again, past the resolver's memory, when a write finds the partition row gone);
- the **one write in flight**: it hands one segment to the batcher (or one record to the spool)
  and starts nothing else before its outcome is in, so a partition is never in two writes at
  once. The batcher *settles* the write (:meth:`PartitionActor._settled`, in the batcher's
  task): a stored write answers its requests there and then, straight from the transaction,
  and wakes the actor only if requests wait in its inbox; a write that was not stored (its
  transaction failed, or its partition row vanished) wakes the actor, which deals with it
  before anything else;
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

Every request put in the inbox gets exactly one answer, whatever happens. An idle actor
waits on its inbox with no timer of its own (thousands of idle actors would otherwise keep
thousands of deadlines and cancel scopes alive): the supervisor's reaper calls
:meth:`PartitionActor.stop_if_idle`, which stops an actor that has been parked, with an empty
inbox and no write in flight, for ``idle_timeout_s`` (since its last write settled). It
unregisters the actor and closes its inbox in one synchronous step, so a producer either got
its request to this actor before that step (and the actor serves it) or finds the inbox closed
and asks the supervisor for a fresh actor. When the surrounding nursery is cancelled the actor
stops at once; requests it holds, has in flight or still has in its inbox are answered
``failed`` (a write still at the batcher may be stored all the same, as any write cut off by
shutdown; see :mod:`queen.actors.batcher`).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from queen.actors.messages import BUFFERED, FAILED, QUEUED, ActorStopped, PushOutcome, PushRequest
from queen.actors.policy import coalesce_count
from queen.encryption import QueueEncryption
from queen.errors import StoreError, StoreUnavailable
from queen.frames import concat
from queen.model import PartitionKey, Status
from queen.primitives import Fence, Parking, Route
from queen.storage.base import SegmentWrite, WriteResult

log = logging.getLogger("queen.actors")


__all__ = ["PartitionActor", "Route", "Settle", "WriteRouter"]

Work = PushRequest | Fence
Settle = Callable[[WriteResult | StoreError, float], None]
"""What the batcher calls once a segment's transaction is settled: with the segment's result
(or the error that failed its transaction) and the time it knew."""


class Resolve(Protocol):
    """Where an actor gets its partition's id: the resolver
    (:meth:`queen.actors.resolver.PartitionResolver.resolve`)."""

    def __call__(self, key: PartitionKey, *, fresh: bool = False) -> Awaitable[int]: ...


class SegmentWriter(Protocol):
    """Where an actor sends its segment: the batcher."""

    def put(self, segment: SegmentWrite, settle: Settle) -> bool:
        """Queue ``segment`` for a transaction (no checkpoint); False, with nothing queued,
        when the queue is full: wait for :meth:`room` and put it again."""
        ...

    async def room(self) -> None: ...


class WriteRouter(Protocol):
    """Decides where live pushes go, and keeps the spool side of the bargain."""

    def route(self, key: PartitionKey, received: float = math.inf) -> Route:
        """Where pushes of ``key`` go; ``received``: when the latest of them arrived."""
        ...

    async def changed(self) -> None:
        """Return after anything that may change a route changed."""
        ...

    async def spool(self, key: PartitionKey, requests: list[PushRequest]) -> bool:
        """Make ``requests`` durable in the spool; False if they could not be."""
        ...

    def report_unavailable(self, error: StoreUnavailable) -> None: ...


class DirectRouter:
    """No spool: everything goes to the database; a failed write answers ``failed``."""

    def route(self, key: PartitionKey, received: float = math.inf) -> Route:
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
        resolve: Resolve,
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
        self._inbox: list[Work] = []  # handed over, not yet taken for a write, in order
        self._replays = 0  # replay requests in the inbox
        self._fences = 0  # fences in the inbox
        self._closed = False  # stopped: hands nothing over any more
        self._parking = Parking()  # where the actor waits for work or for its write
        self._in_flight: list[PushRequest] | None = None  # the requests of the write at the batcher
        self._rewrite = False  # the write in flight is a second attempt (partition re-created)
        self._unsettled: tuple[list[PushRequest], WriteResult | StoreError] | None = None
        self._parked_since = 0.0  # parked, with nothing in flight, since then
        self._hold_until: float | None = None  # deadline of the current hold
        self._no_hold_until = float("-inf")  # after a hold timed out, spool without holding

    @property
    def pending(self) -> int:
        """Requests and fences queued and not yet taken (for tests and introspection)."""
        return len(self._inbox)

    @property
    def holding(self) -> bool:
        """Whether live requests are held behind the partition's spooled backlog now."""
        return self._hold_until is not None

    def put(self, work: Work) -> bool:
        """Queue ``work``; never waits and takes no checkpoint (the caller goes on to wait for
        the answer, and that wait is its checkpoint). False if the actor has stopped: ask the
        supervisor for a new one."""
        if self._closed:
            return False
        self._inbox.append(work)
        if type(work) is PushRequest:
            if work.replay:
                self._replays += 1
        else:
            self._fences += 1
        if self._in_flight is None and self._parking.task is not None:
            self._parking.wake()  # (with a write in flight, its settling wakes the actor)
        return True

    async def submit(self, work: Work) -> None:
        """:meth:`put`, raising :class:`trio.BrokenResourceError` if the actor has stopped."""
        if not self.put(work):
            raise trio.BrokenResourceError(f"partition actor {self.key} has stopped")

    async def run(self) -> None:
        """Serve the inbox until stopped. See the module docstring for the guarantees."""
        try:
            while True:
                if self._in_flight is not None or not (self._inbox or self._unsettled):
                    if self._closed:
                        return  # stopped as idle
                    if self._in_flight is None:
                        self._parked_since = trio.current_time()
                    await self._parking.park()
                elif self._unsettled is not None:
                    batch, outcome = self._unsettled
                    self._unsettled = None
                    await self._recover(batch, outcome)
                else:
                    await self._serve_one_step()
        finally:
            self.abandon()

    def stop_if_idle(self, now: float) -> bool:
        """Stop the actor if it has been parked, with nothing to do and no write in flight,
        for ``idle_timeout_s``.

        Synchronous: between the check and the close no producer can run. A request already
        handed to the parked actor (it has not run yet) counts as work: the actor then stays.
        """
        if (
            self._parking.task is None
            or self._in_flight is not None
            or self._inbox
            or self._unsettled is not None
            or now - self._parked_since < self._idle_timeout_s
        ):
            return False
        self._on_idle_stop(self)
        self._closed = True
        self._parking.wake()
        return True

    def abandon(self) -> None:
        """Refuse new work and answer ``failed`` to every request still held.

        Runs when the actor ends for any reason; after an idle stop there is nothing left. A
        write still at the batcher is answered ``failed`` too (its settling later changes
        nothing: a reply is answered once).
        """
        self._closed = True
        leftovers: list[Work] = self._inbox
        self._inbox, self._replays, self._fences = [], 0, 0
        if self._in_flight is not None:
            leftovers += self._in_flight
            self._in_flight = None
        if self._unsettled is not None:
            leftovers += self._unsettled[0]
            self._unsettled = None
        for work in leftovers:
            if type(work) is Fence:
                work.granted.fail(ActorStopped(f"partition {self.key} is stopping"))
            else:
                work.reply.set(FAILED)  # type: ignore[union-attr]

    async def _serve_one_step(self) -> None:
        """Do one write (or one hold, or one fence) for the requests waiting, oldest replay
        frames first; live requests are served in arrival order around fences."""
        if self._replays:
            await self._write(self._take_replays())
            return
        head = self._inbox[0]
        if type(head) is Fence:
            del self._inbox[0]
            self._fences -= 1
            await self._stand_still(head)
            return
        newest = self._inbox[-1]  # (what it takes arrived no later than this)
        route = self._router.route(
            self.key, newest.received if type(newest) is PushRequest else math.inf
        )
        if route is not Route.HOLD:
            self._hold_until = None
        elif self._holding_on():
            await self._hold()
            return
        else:
            route = Route.SPOOL
        if len(self._inbox) == 1:  # the common case: one request, taken whole
            batch: list[PushRequest] = self._inbox  # type: ignore[assignment]  # (no fence)
            self._inbox = []
        else:
            batch = self._take_live()
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

    def _take_live(self) -> list[PushRequest]:
        """Take from the inbox the live requests before the first fence that fit in one
        segment (``segment_max_items``), oldest first (there are no replays in it)."""
        inbox = self._inbox
        live: list[PushRequest] = inbox  # type: ignore[assignment]  # (when it holds no fence)
        if self._fences:
            live = []
            for work in inbox:
                if type(work) is Fence:
                    break  # what arrived after a fence waits for it
                live.append(work)  # type: ignore[arg-type]
        sizes = list(map(len, [r.message_ids for r in live]))
        batch = live[: coalesce_count(sizes, self._segment_max_items)]
        del inbox[: len(batch)]
        return batch

    def _take_replays(self) -> list[PushRequest]:
        """Take the oldest replay requests that fit in one segment out of the inbox."""
        replays = [r for r in self._inbox if type(r) is PushRequest and r.replay]
        batch = replays[: coalesce_count([len(r) for r in replays], self._segment_max_items)]
        taken = set(map(id, batch))
        self._inbox = [r for r in self._inbox if id(r) not in taken]
        self._replays -= len(batch)
        return batch

    def _holding_on(self) -> bool:
        """The router says *hold*: whether to hold (else spool), starting a hold of at most
        ``hold_s`` if none is on."""
        now = trio.current_time()
        if now < self._no_hold_until:
            return False
        if self._hold_until is None:
            self._hold_until = now + self._hold_s
        elif now >= self._hold_until:
            # The backlog did not clear in time: stop holding producers for a while.
            self._hold_until = None
            self._no_hold_until = now + self._hold_s
            return False
        return True

    async def _hold(self) -> None:
        """Wait for a new request, a route change, or the end of the hold."""
        assert self._hold_until is not None
        with trio.move_on_at(self._hold_until):
            async with trio.open_nursery() as nursery:

                async def wake_on_change() -> None:
                    await self._router.changed()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(wake_on_change)
                await self._parking.park()  # woken by the next request put in the inbox
                nursery.cancel_scope.cancel()

    async def _spool(self, batch: list[PushRequest]) -> None:
        stored = False
        try:
            stored = await self._router.spool(self.key, batch)
        finally:
            outcome = BUFFERED if stored else FAILED
            for request in batch:
                request.reply.set(outcome)

    async def _write(self, batch: list[PushRequest], *, rewrite: bool = False) -> None:
        """Hand ``batch`` to the batcher as one segment; its settling answers the requests
        (:meth:`_settled`). Returns once it is handed over, not once it is written."""
        try:
            if self.partition_id is None:
                try:
                    self.partition_id = await self._resolve(self.key, fresh=rewrite)
                except StoreError as error:
                    await self._failed(batch, error)
                    return
            count = len(batch)
            frames = batch[0] if count == 1 else concat(batch)
            segment = SegmentWrite(
                self.partition_id,
                frames.message_ids,
                frames.transaction_ids,
                frames.payloads,
                key=self.key,
                producer_subs=frames.producer_subs,
                trace_ids=frames.trace_ids,
                request_count=count,
            )
            while not self._writer.put(segment, self._settled):
                await self._writer.room()
        except BaseException:
            _answer(batch, FAILED)  # never leave a producer without an answer
            raise
        self._in_flight = batch
        self._rewrite = rewrite

    def _settled(self, outcome: WriteResult | StoreError, now: float) -> None:
        """The batcher's word on the write in flight (called in the batcher's task). A stored
        write answers its requests here and then; anything else wakes the actor to deal with
        it, before it takes anything more."""
        batch = self._in_flight
        if batch is None:
            return  # the actor stopped meanwhile, and answered its requests
        self._in_flight = None
        if type(outcome) is WriteResult and not outcome.partition_missing:
            _deliver(batch, outcome)
            if not self._inbox:
                self._parked_since = now
                return
        else:
            self._unsettled = batch, outcome
        self._parking.wake()

    async def _recover(self, batch: list[PushRequest], outcome: WriteResult | StoreError) -> None:
        """Deal with a write that was not stored: its partition row vanished (its queue was
        deleted: create it again and write once more), or its transaction failed."""
        if isinstance(outcome, StoreError):
            await self._failed(batch, outcome)
        elif self._rewrite:
            error = StoreError("partition deleted twice during one write")
            await self._failed(batch, error)
        else:
            log.info("partition %s/%s was deleted; recreating it", *_names(self.key))
            self.partition_id = None
            await self._write(batch, rewrite=True)

    async def _failed(self, batch: list[PushRequest], error: StoreError) -> None:
        """Answer a batch that could not be written: spooled (the live requests) when the
        database is unreachable, else ``failed``."""
        try:
            if isinstance(error, StoreUnavailable):
                self._router.report_unavailable(error)
                live = [r for r in batch if not r.replay]
                if live:  # not stored: keep them in the spool instead
                    await self._spool(live)
            else:
                log.error("write of %s/%s failed: %s", *_names(self.key), error)
        finally:
            _answer(batch, FAILED)  # never leave a producer without an answer


def _names(key: PartitionKey) -> tuple[str, str]:
    return key.queue, key.partition


def _answer(batch: list[PushRequest], outcome: PushOutcome) -> None:
    """Answer every request of ``batch`` not answered yet."""
    for request in batch:
        request.reply.set(outcome)


def _deliver(batch: list[PushRequest], result: WriteResult) -> None:
    """Split a write's outcome back into one outcome per request."""
    if not result.duplicates:
        for request in batch:
            request.reply.set(QUEUED)
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
        request.reply.set(PushOutcome(Status.QUEUED, duplicates) if duplicates else QUEUED)

"""The push service: the one way into the partition actors, for a push and for a write that must
take its turn behind them.

- :meth:`PushService.push_prepared` hands a validated push to the actors, one request per
  partition, and answers when every partition's write is settled: a :class:`PushAnswer`, typed
  (HTTP renders it in :mod:`queen.http.render`; :meth:`PushAnswer.items` gives one
  :class:`PushedItem` per item to an embedding program).
- :meth:`PushService.hold` makes the actors of some partitions stand still while another
  writer (a transaction, a streaming cycle, a dead letter retry) writes to them, so a
  partition keeps one writer in this process and its spooled backlog keeps its place. It
  yields a :class:`queen.primitives.Turn`, which the store methods that write partitions
  around the actors require, so no such write can be made without the hold. It raises
  :class:`PartitionsBusy` when a partition cannot be written to the database now.
  :meth:`PushService.write_held` is the hold-then-write sequence every such writer uses.
- Shutdown: :meth:`close` refuses new work (:class:`BrokerClosed`), :meth:`drain` waits for the
  pushes and holds in flight.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from queen.actors.messages import QUEUED, ActorStopped, PushOutcome, PushRequest
from queen.actors.supervisor import Supervisor
from queen.errors import QueenError
from queen.flow import QueueFlow
from queen.intake import PartitionBatch, PreparedPush, prepare_push
from queen.metrics import Metrics
from queen.model import PartitionKey, Status
from queen.primitives import Fence, Reply, ReplyGroup, Route, Turn

T = TypeVar("T")

_grant_turn = Turn.granter()  # the push service alone makes turns


class BrokerClosed(QueenError, RuntimeError):
    """The broker is shutting down and accepts no new work."""


class PartitionsBusy(QueenError, RuntimeError):
    """A write that takes its turn behind the actors cannot be made now: the database is away,
    maintenance mode is on, or spooled frames of one of its partitions wait for replay.
    Nothing was applied; the caller may retry (HTTP 503)."""


@dataclass(slots=True)
class PushedItem:
    """What happened to one pushed item. ``message_id`` is the original's for a duplicate.
    (Not frozen: one is made per item pushed, and a frozen dataclass takes six times as long
    to make.)"""

    index: int
    message_id: str
    transaction_id: str
    queue: str
    partition: str
    status: str  # "queued", "duplicate", "buffered" or "failed"


@dataclass(slots=True)
class PushAnswer:
    """The answer of one push: each partition's batch with the outcome of its write. (Not
    frozen, as :class:`PushedItem`: one is made per push.)"""

    count: int
    parts: tuple[tuple[PartitionBatch, PushOutcome], ...]

    def items(self) -> list[PushedItem]:
        """One result per pushed item, in body order."""
        results: list[PushedItem | None] = [None] * self.count
        for batch, outcome in self.parts:
            status = str(outcome.status)  # the text (a StrEnum's str), without Enum.value
            queue, partition = batch.key
            frames = zip(batch.indexes, batch.message_ids, batch.transaction_ids, strict=True)
            duplicates = outcome.duplicates
            if not duplicates:
                for index, own_id, transaction_id in frames:
                    results[index] = PushedItem(
                        index, own_id, transaction_id, queue, partition, status
                    )
                continue
            for pos, (index, own_id, transaction_id) in enumerate(frames):
                original = duplicates.get(pos)
                results[index] = PushedItem(
                    index,
                    own_id if original is None else original,
                    transaction_id,
                    queue,
                    partition,
                    status if original is None else "duplicate",
                )
        return results  # type: ignore[return-value]


class PushService:
    """Pushes through the actors of ``supervisor``, counted in ``metrics``."""

    def __init__(self, supervisor: Supervisor, metrics: Metrics) -> None:
        self.supervisor = supervisor
        self.metrics = metrics
        self.flow = QueueFlow()  # per queue and minute: what was stored (and popped, acked)
        self._closing = False
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    @property
    def closing(self) -> bool:
        return self._closing

    async def push(
        self, items: Sequence[dict[str, Any]], producer_sub: str | None = None
    ) -> PushAnswer:
        """Validate and push ``items`` (the items of ``POST /api/v1/push``). Raises
        :class:`queen.model.InvalidPush` for a body that breaks a rule (nothing is stored)."""
        return await self.push_prepared(prepare_push(list(items)), producer_sub)

    async def push_prepared(
        self, prepared: PreparedPush, producer_sub: str | None = None
    ) -> PushAnswer:
        """Push a validated body. ``producer_sub`` is the trusted producer identity stored with
        every message (the validated token's ``sub``)."""
        if self._closing:
            raise BrokerClosed("broker is shutting down")
        m = self.metrics
        m.push_requests += 1
        m.push_items += prepared.count
        # One request per partition, all answered through one group: the producer wakes once,
        # when the last partition's write is settled.
        group = ReplyGroup(len(prepared.batches))
        received = time.monotonic()
        requests = [
            PushRequest(  # (positional: message_ids, transaction_ids, payloads, producer_subs,
                # trace_ids, replay, reply, received)
                batch.message_ids,
                batch.transaction_ids,
                batch.payloads,
                None if producer_sub is None else [producer_sub] * len(batch),
                batch.trace_ids,
                False,
                Reply(group),
                received,
            )
            for batch in prepared.batches
        ]
        self._begin()
        try:
            for batch, request in zip(prepared.batches, requests, strict=True):
                self.supervisor.put(batch.key, request)
            await group.wait()
        finally:
            self._end()
        outcomes = [request.reply.result() for request in requests]
        queued = prepared.count  # less what the outcomes other than the plain QUEUED hold
        stored: dict[str, int] = {}  # per queue: one flow update per request, not per batch
        for batch, outcome in zip(prepared.batches, outcomes, strict=True):
            queue = batch.key.queue
            if outcome is QUEUED:
                stored[queue] = stored.get(queue, 0) + len(batch.indexes)
                continue
            duplicates = len(outcome.duplicates)
            rest = len(batch.indexes) - duplicates
            m.push_items_duplicate += duplicates
            if outcome.status is Status.QUEUED:
                queued -= duplicates
                stored[queue] = stored.get(queue, 0) + rest
                continue
            queued -= duplicates + rest
            if outcome.status is Status.BUFFERED:
                m.push_items_buffered += rest
            else:
                m.push_items_failed += rest
        m.push_items_queued += queued
        for queue, count in stored.items():
            self.flow.pushed(queue, count)
        return PushAnswer(prepared.count, tuple(zip(prepared.batches, outcomes, strict=True)))

    async def write_held(
        self, keys: Iterable[PartitionKey], write: Callable[[Turn], Awaitable[T]]
    ) -> T:
        """Hold the actors of ``keys`` (:meth:`hold`) and make ``write`` with the turn: the
        one sequence of every write of partitions around their actors. Raises what
        :meth:`hold` raises, then what ``write`` raises."""
        async with self.hold(keys) as turn:
            return await write(turn)

    @contextlib.asynccontextmanager
    async def hold(self, keys: Iterable[PartitionKey]) -> AsyncIterator[Turn]:
        """Make the actors of ``keys`` stand still until the block ends, so the block's write
        to those partitions takes its turn behind theirs; yields the :class:`Turn` the store
        asks of that write (void once the block ends). The actors are fenced one after
        another in key order (every holder takes them in the same order, so two never wait
        for each other) and released on the way out, whatever happened. Raises
        :class:`PartitionsBusy` (nothing held any more) when a partition cannot be written to
        the database now, :class:`BrokerClosed` during shutdown."""
        if self._closing:
            raise BrokerClosed("broker is shutting down")
        fences: list[Fence] = []
        held = sorted(set(keys))
        turn: Turn | None = None
        self._begin()
        try:
            for key in held:
                fence = Fence()
                fences.append(fence)
                await self.supervisor.submit(key, fence)
                try:
                    route = await fence.granted.wait()
                except ActorStopped as exc:
                    raise BrokerClosed(str(exc)) from exc
                if route is not Route.DATABASE:
                    self.metrics.transactions_refused += 1
                    why = {
                        Route.SPOOL: "the database is unavailable or in maintenance mode",
                        Route.HOLD: "spooled messages of a partition are waiting for replay",
                    }[route]
                    raise PartitionsBusy(
                        f"{why} ({key.queue}/{key.partition}); nothing was applied, retry later"
                    )
            turn = _grant_turn(held)
            yield turn
        finally:
            if turn is not None:
                turn.end()
            for fence in fences:
                fence.released.set()
            self._end()

    def close(self) -> None:
        """Refuse new pushes and holds from now on."""
        self._closing = True

    async def drain(self) -> None:
        """Refuse new work, then wait for the pushes and holds in flight."""
        self._closing = True
        await self._idle.wait()

    def _begin(self) -> None:
        """A push or hold starts: :meth:`drain` waits for it. (A plain count and an event, not
        a ``trio_util.AsyncValue``, whose setter would cost every push a few calls more.)"""
        self._in_flight += 1
        if self._in_flight == 1:
            self._idle = trio.Event()

    def _end(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

"""The batcher: merges the segment writes of many partition actors into multi-partition
transactions.

Actors :meth:`Batcher.put` a segment (no checkpoint; the batcher's loop is woken if it waits)
and go on; once its transaction is settled, the batcher calls the segment's *settle* function
with the result (or the error), in its own task, and that answers the producers directly (see
:mod:`queen.actors.partition`). The batcher's loop takes everything that is ready (up to
``max_items`` frames / ``max_bytes`` of payload) and commits it as one transaction. At most
``concurrency`` transactions are in flight; while they run, the next batch gathers in the
queue, so the batch size follows the load without any timer ("natural batching"). At most
``queue_size`` writes wait in the queue; an actor that finds it full waits for room.
``linger_s`` can add a deliberate wait before a small batch starts. With ``spread_min_items``
and ``spread_min_writes`` (0 turns each off), what is ready while more slots are free is
shared out over them, that many frames (or, for many small writes, writes) per transaction at
least: producers answered by one big transaction come back together, and without it keep
riding one transaction at a time while other connections idle.

Two writes for the same partition never share a transaction (the actor already guarantees a
single write in flight; the batcher also defers a second one should it appear), and the store
locks the partitions of a transaction in id order, so concurrent transactions never deadlock.

Failure containment: if a transaction fails with a database error that is not "database
unreachable", each of its writes is retried alone, so one bad write fails only its own
partition. After a commit, the commit listeners run (the consume side wakes waiting pops).

The batcher owns its nursery, where the transactions run. Cancelling it (the last phase of
shutdown, once accepted pushes had their grace period) stops the gathering loop and the
transactions' waits. A transaction cancelled mid-way closes its connection, which is not a
rollback: PostgreSQL finishes a statement it has received (it notices the closed connection
only when it answers), so the write may well be stored though its actor, cancelled too,
answered its requests ``failed``; a producer that retries with the same transaction ids gets
``duplicate`` within the dedup window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from queen.actors.policy import may_spread, spread_count
from queen.errors import StoreError, StoreUnavailable
from queen.metrics import Metrics
from queen.primitives import Parking
from queen.storage.base import SegmentWrite, Store, WriteResult

log = logging.getLogger("queen.batcher")

Settle = Callable[[WriteResult | StoreError, float], None]
_Pending = tuple[SegmentWrite, Settle]
CommitListener = Callable[[Sequence[SegmentWrite], Sequence[WriteResult]], None]


class Batcher:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        concurrency: int,
        max_items: int,
        max_bytes: int,
        linger_s: float,
        queue_size: int,
        spread_min_items: int = 0,
        spread_min_writes: int = 0,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._slots = trio.Semaphore(concurrency)
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._linger_s = linger_s
        self._spread_min_items = spread_min_items
        self._spread_min_writes = spread_min_writes
        self._queue: list[_Pending] = []  # ready for the next transaction, in order
        self._queue_size = queue_size
        self._parking = Parking()  # where the gathering loop waits for a first write
        self._room = trio.lowlevel.ParkingLot()  # writers waiting for room in the queue
        self._listeners: list[CommitListener] = []

    @property
    def queued(self) -> int:
        """Writes waiting for a transaction (for tests and introspection)."""
        return len(self._queue)

    def add_commit_listener(self, listener: CommitListener) -> None:
        """Call ``listener(segments, results)`` after every committed push transaction.

        Listeners run synchronously in the batcher's task and must not block (waking
        long-polling consumers is the intended use); an exception is logged and ignored.
        """
        self._listeners.append(listener)

    def put(self, segment: SegmentWrite, settle: Settle) -> bool:
        """Queue ``segment`` for the next transaction; no checkpoint. Once its transaction is
        settled, ``settle(result, now)`` is called in the batcher's task, once, with what the
        store did with it (a :class:`WriteResult`) or the :class:`StoreError` (or
        :class:`StoreUnavailable`) that failed the transaction; it must not block.

        Returns False, queuing nothing, when ``queue_size`` writes wait already: wait for
        :meth:`room`, then put it again.
        """
        if len(self._queue) >= self._queue_size:
            return False
        self._queue.append((segment, settle))
        if self._parking.task is not None:
            self._parking.wake()
        return True

    async def room(self) -> None:
        """Return once the queue has room for a write."""
        while len(self._queue) >= self._queue_size:
            await self._room.park()

    async def run(
        self, *, task_status: trio.TaskStatus[Batcher] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Gather and commit batches until cancelled."""
        async with trio.open_nursery() as nursery:
            task_status.started(self)
            while True:
                await self._slots.acquire()
                batch = await self._gather()
                nursery.start_soon(self._commit, batch)

    async def _gather(self) -> list[_Pending]:
        while not self._queue:
            await self._parking.park()
        batch: list[_Pending] = []
        partitions: set[int] = set()
        items, payload_bytes = self._take(batch, partitions, 0, 0)
        if self._linger_s > 0:
            with trio.move_on_after(self._linger_s):
                while items < self._max_items and payload_bytes < self._max_bytes:
                    await self._parking.park()
                    items, payload_bytes = self._take(batch, partitions, items, payload_bytes)
        elif (
            may_spread(
                items,
                len(batch),
                min_items=self._spread_min_items,
                min_writes=self._spread_min_writes,
            )
            and self._slots.value > 0
        ):
            keep = spread_count(
                [len(segment.message_ids) for segment, _ in batch],
                self._slots.value,
                min_items=self._spread_min_items,
                min_writes=self._spread_min_writes,
            )
            if keep < len(batch):  # the rest goes first into the next transaction
                self._queue[:0] = batch[keep:]
                del batch[keep:]
        return batch

    def _take(
        self, batch: list[_Pending], partitions: set[int], items: int, payload_bytes: int
    ) -> tuple[int, int]:
        """Move queued writes into ``batch``, in order, until it is full (``max_items`` frames
        or ``max_bytes`` of payload); a second write of a partition already in it stays queued,
        first in line. Returns the batch's frames and payload bytes."""
        queue = self._queue
        kept: list[_Pending] = []
        taken = 0
        for pending in queue:
            if items >= self._max_items or payload_bytes >= self._max_bytes:
                break
            taken += 1
            segment = pending[0]
            if segment.partition_id in partitions:
                kept.append(pending)
                continue
            partitions.add(segment.partition_id)
            batch.append(pending)
            items += len(segment.message_ids)
            payload_bytes += sum(map(len, segment.payloads))
        del queue[:taken]
        if kept:
            queue[:0] = kept
        if len(self._room):
            self._room.unpark_all()
        return items, payload_bytes

    async def _commit(self, batch: list[_Pending]) -> None:
        try:
            await self._commit_together(batch)
        finally:
            self._slots.release()

    async def _commit_together(self, batch: Sequence[_Pending]) -> None:
        segments = [segment for segment, _ in batch]
        started = trio.current_time()
        try:
            results = await self._store.write_segments(segments)
        except StoreUnavailable as error:
            self._metrics.push_transaction_failures += 1
            _settle(batch, [error] * len(batch), trio.current_time())
            return
        except StoreError as error:
            self._metrics.push_transaction_failures += 1
            if len(batch) == 1:
                log.error("push write failed for partition %s: %s", segments[0].partition_id, error)
                _settle(batch, [error], trio.current_time())
                return
            log.warning(
                "push transaction of %d writes failed (%s); retrying each alone", len(batch), error
            )
            for pending in batch:
                await self._commit_together([pending])
            return
        now = trio.current_time()
        self._account(segments, now - started)
        _settle(batch, results, now)
        for listener in self._listeners:
            try:
                listener(segments, results)
            except Exception:
                log.exception("commit listener failed")

    def _account(self, segments: Sequence[SegmentWrite], seconds: float) -> None:
        m = self._metrics
        m.push_transactions += 1
        m.push_transaction_seconds += seconds
        m.push_segments += len(segments)
        m.push_requests_committed += sum([s.request_count for s in segments])
        m.push_frames_committed += sum(map(len, [s.message_ids for s in segments]))
        m.max_partitions_per_transaction = max(m.max_partitions_per_transaction, len(segments))


def _settle(
    batch: Sequence[_Pending], outcomes: Sequence[WriteResult | StoreError], now: float
) -> None:
    """Tell every write of ``batch`` its outcome; a settle that raises harms no other."""
    for (_, settle), outcome in zip(batch, outcomes, strict=True):
        try:
            settle(outcome, now)
        except Exception:
            log.exception("settling a push write failed")

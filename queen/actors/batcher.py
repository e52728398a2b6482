"""The batcher: merges the segment writes of many partition actors into multi-partition
transactions.

Actors call :meth:`Batcher.write` and wait. The batcher's loop takes everything that is ready
(up to ``max_items`` frames / ``max_bytes`` of payload) and commits it as one transaction. At
most ``concurrency`` transactions are in flight; while they run, the next batch gathers in the
channel, so the batch size follows the load without any timer ("natural batching").
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
only when it answers), so the write may well be stored though its actors answer ``failed``; a
producer that retries with the same transaction ids gets ``duplicate`` within the dedup window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from queen.actors.policy import batch_is_full, spread_count
from queen.errors import StoreError, StoreUnavailable
from queen.metrics import Metrics
from queen.primitives import Reply, hand_over
from queen.storage.base import SegmentWrite, Store, WriteResult

log = logging.getLogger("queen.batcher")

_Pending = tuple[SegmentWrite, Reply[WriteResult]]
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
        self._send, self._recv = trio.open_memory_channel[_Pending](queue_size)
        self._deferred: list[_Pending] = []
        self._listeners: list[CommitListener] = []

    def add_commit_listener(self, listener: CommitListener) -> None:
        """Call ``listener(segments, results)`` after every committed push transaction.

        Listeners run synchronously in the batcher's task and must not block (waking
        long-polling consumers is the intended use); an exception is logged and ignored.
        """
        self._listeners.append(listener)

    async def write(self, segment: SegmentWrite) -> WriteResult:
        """Commit ``segment`` in the next transaction and return what the store did with it.

        Raises :class:`StoreError` (or :class:`StoreUnavailable`) if its transaction failed.
        """
        reply: Reply[WriteResult] = Reply()
        await hand_over(self._send, (segment, reply))
        return await reply.wait()

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
        batch: list[_Pending] = []
        partitions: set[int] = set()
        items = 0
        payload_bytes = 0
        deferred, self._deferred = self._deferred, []

        def add(pending: _Pending) -> None:
            nonlocal items, payload_bytes
            segment = pending[0]
            if segment.partition_id in partitions:
                self._deferred.append(pending)
                return
            partitions.add(segment.partition_id)
            batch.append(pending)
            items += len(segment)
            payload_bytes += segment.payload_bytes

        def full() -> bool:
            return batch_is_full(
                items, payload_bytes, max_items=self._max_items, max_bytes=self._max_bytes
            )

        for pending in deferred:
            add(pending)
        if not batch:
            add(await self._recv.receive())
        while not full():
            try:
                add(self._recv.receive_nowait())
            except trio.WouldBlock:
                break
        if self._linger_s > 0 and not full():
            with trio.move_on_after(self._linger_s):
                while not full():
                    add(await self._recv.receive())
        elif (
            (self._spread_min_items > 0 or self._spread_min_writes > 0)
            and self._slots.value > 0
            and len(batch) > 1
        ):
            keep = spread_count(
                [len(segment) for segment, _ in batch],
                self._slots.value,
                min_items=self._spread_min_items,
                min_writes=self._spread_min_writes,
            )
            if keep < len(batch):  # the rest goes first into the next transaction
                self._deferred[:0] = batch[keep:]
                del batch[keep:]
        return batch

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
            for _, reply in batch:
                reply.fail(error)
            return
        except StoreError as error:
            self._metrics.push_transaction_failures += 1
            if len(batch) == 1:
                log.error("push write failed for partition %s: %s", segments[0].partition_id, error)
                batch[0][1].fail(error)
                return
            log.warning(
                "push transaction of %d writes failed (%s); retrying each alone", len(batch), error
            )
            for pending in batch:
                await self._commit_together([pending])
            return
        self._account(segments)
        self._metrics.push_transaction_seconds += trio.current_time() - started
        for (_, reply), result in zip(batch, results, strict=True):
            reply.set(result)
        for listener in self._listeners:
            try:
                listener(segments, results)
            except Exception:
                log.exception("commit listener failed")

    def _account(self, segments: Sequence[SegmentWrite]) -> None:
        m = self._metrics
        m.push_transactions += 1
        m.push_segments += len(segments)
        m.push_requests_committed += sum(s.request_count for s in segments)
        m.push_frames_committed += sum(len(s) for s in segments)
        m.max_partitions_per_transaction = max(m.max_partitions_per_transaction, len(segments))

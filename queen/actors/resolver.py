"""The partition resolver: turns (queue, partition) names into partition ids, in batches.

A partition actor needs its partition's id before its first write (the queue and partition
are created then if they are new). When many partitions become active at once (a burst of
pushes to new or long-idle partitions), asking the database once per actor would cost one
round trip each; the resolver gathers every request waiting and answers them all with one
``ensure_partitions`` call, while the next batch gathers.

It also remembers the ids it answered (the latest :data:`REMEMBERED`): an actor stops after
its idle time, and on a queue of many partitions the next push to one of them often comes
later than that, so a new actor asks for an id this process already had. A remembered id is
answered at once. An id is never reused, so a remembered one is either right or names a
partition row deleted with its queue since; a write to such a row stores nothing and says so
(``partition_missing``), and the actor then asks again with ``fresh`` (the queue and the
partition are created again, as for an actor that lived through the deletion).

It owns its channel and its memory of ids and nothing else. If a batch fails, each of its
partitions is asked again alone, so one bad partition fails only its own requests (the actors
treat that like a failed write). Cancelling ``run`` stops it; requests left waiting are
abandoned with their callers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from queen.model import PartitionKey
from queen.primitives import Reply

EnsureMany = Callable[[Sequence[PartitionKey]], Awaitable[list[int]]]

REMEMBERED = 65_536
"""Partition ids remembered; past that, the oldest learned are dropped first."""


class PartitionResolver:
    def __init__(
        self,
        ensure: EnsureMany,
        *,
        max_batch: int = 1000,
        queue_size: int = 4096,
        remembered: int = REMEMBERED,
    ) -> None:
        self._ensure = ensure
        self._max_batch = max_batch
        self._remembered = remembered
        self._known: dict[PartitionKey, int] = {}  # in the order learned
        self._send, self._recv = trio.open_memory_channel[tuple[PartitionKey, Reply[int]]](
            queue_size
        )

    async def resolve(self, key: PartitionKey, *, fresh: bool = False) -> int:
        """The id of ``key``'s partition (the queue and partition are made if they are new).
        ``fresh``: the id remembered was found stale; ask the database again."""
        if fresh:
            self._known.pop(key, None)
        else:
            known = self._known.get(key)
            if known is not None:
                return known
        reply: Reply[int] = Reply()
        await self._send.send((key, reply))
        return await reply.wait()

    async def run(
        self, *, task_status: trio.TaskStatus[PartitionResolver] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started(self)
        while True:
            batch = [await self._recv.receive()]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._recv.receive_nowait())
                except trio.WouldBlock:
                    break
            keys = list(dict.fromkeys(key for key, _ in batch))
            outcome: dict[PartitionKey, int | Exception] = {}
            try:
                outcome.update(zip(keys, await self._ensure(keys), strict=True))
            except Exception as error:
                if len(keys) == 1:
                    outcome[keys[0]] = error
                else:
                    for key in keys:  # isolate the partition at fault
                        try:
                            outcome[key] = (await self._ensure([key]))[0]
                        except Exception as alone:
                            outcome[key] = alone
            for key, result in outcome.items():
                if not isinstance(result, Exception):
                    self._remember(key, result)
            for key, reply in batch:
                result = outcome[key]
                if isinstance(result, Exception):
                    reply.fail(result)
                else:
                    reply.set(result)

    def _remember(self, key: PartitionKey, pid: int) -> None:
        known = self._known
        known.pop(key, None)  # (learned again: the newest)
        known[key] = pid
        if len(known) > self._remembered:
            del known[next(iter(known))]

"""The partition resolver: turns (queue, partition) names into partition ids, in batches.

A partition actor needs its partition's id before its first write (the queue and partition
are created then if they are new). When many partitions become active at once (a burst of
pushes to new or long-idle partitions), asking the database once per actor would cost one
round trip each; the resolver gathers every request waiting and answers them all with one
``ensure_partitions`` call, while the next batch gathers.

It owns its channel and nothing else. If a batch fails, each of its partitions is asked again
alone, so one bad partition fails only its own requests (the actors treat that like a failed
write). Cancelling ``run`` stops it; requests left waiting are abandoned with their callers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from queen.model import PartitionKey
from queen.primitives import Reply

EnsureMany = Callable[[Sequence[PartitionKey]], Awaitable[list[int]]]


class PartitionResolver:
    def __init__(
        self, ensure: EnsureMany, *, max_batch: int = 1000, queue_size: int = 4096
    ) -> None:
        self._ensure = ensure
        self._max_batch = max_batch
        self._send, self._recv = trio.open_memory_channel[tuple[PartitionKey, Reply[int]]](
            queue_size
        )

    async def resolve(self, key: PartitionKey) -> int:
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
            for key, reply in batch:
                result = outcome[key]
                if isinstance(result, Exception):
                    reply.fail(result)
                else:
                    reply.set(result)

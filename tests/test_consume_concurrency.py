"""Concurrent consumers on the real database, across two broker instances sharing it.

- N consumers of one group on M partitions: while leases are live no message is delivered
  twice, no partition is held by two consumers, and each partition is delivered in order.
- A consumer that dies mid-batch: its partition stays held until the lease expires (moved by
  SQL, not waited for), then the batch is redelivered to the others.
- Transactions (cursor locks, then partition locks), plain pushes (partition locks) and pops
  (cursor locks, SKIP LOCKED) running together never deadlock and keep offsets contiguous.
"""

from __future__ import annotations

import random
from collections import defaultdict

import trio
import trio.lowlevel

from queen import open_broker
from queen.broker import Broker
from queen.consume.results import Message
from queen.settings import Settings
from tests.conftest import Db
from tests.consuming import expire_leases

PARTITIONS = 5
PER_PARTITION = 40


async def fill(broker: Broker, queue: str) -> int:
    for start in range(0, PER_PARTITION, 10):
        await broker.push(
            [
                {"queue": queue, "partition": f"p{p}", "payload": {"p": p, "n": n}}
                for p in range(PARTITIONS)
                for n in range(start, start + 10)
            ]
        )
    return PARTITIONS * PER_PARTITION


class Ledger:
    """What every consumer saw, in the order the pops returned (one Trio thread)."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, int, str]] = []  # partition, offset, message id
        self.holding: dict[str, str] = {}  # partition -> consumer
        self.violations: list[str] = []
        self.done = 0

    def took(self, consumer: str, messages: list[Message]) -> None:
        for partition in {m.partition for m in messages}:
            holder = self.holding.get(partition)
            if holder is not None:
                self.violations.append(f"{consumer} got {partition} held by {holder}")
            self.holding[partition] = consumer
        self.deliveries.extend((m.partition, m.offset, m.id) for m in messages)

    def release(self, messages: list[Message]) -> None:
        for partition in {m.partition for m in messages}:
            self.holding.pop(partition, None)


async def consumer(
    name: str, broker: Broker, queue: str, group: str | None, ledger: Ledger, total: int
) -> None:
    rng = random.Random(name)
    idle = 0
    while ledger.done < total and idle < 200:
        result = await broker.pop(
            queue, consumer_group=group, batch=rng.randint(1, 7), partitions=rng.randint(1, 2)
        )
        if not result:
            idle += 1
            await trio.lowlevel.checkpoint()
            continue
        idle = 0
        messages = result.messages
        ledger.took(name, messages)
        await trio.lowlevel.checkpoint()  # let the others try while this batch is held
        ledger.release(messages)
        answers = await broker.ack(messages)
        assert all(a.success for a in answers), answers
        ledger.done += len(messages)


def check_order(ledger: Ledger) -> None:
    per_partition: dict[str, list[int]] = defaultdict(list)
    for partition, offset, _ in ledger.deliveries:
        per_partition[partition].append(offset)
    for partition, offsets in per_partition.items():
        assert offsets == list(range(PER_PARTITION)), partition


async def test_consumers_of_one_group_never_share_a_message_or_a_partition(
    settings: Settings, queue: str
) -> None:
    async with open_broker(settings) as one, open_broker(settings) as two:
        total = await fill(one, queue)
        for group in (None, "g"):
            ledger = Ledger()
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for i in range(6):
                        broker = one if i % 2 else two
                        nursery.start_soon(consumer, f"c{i}", broker, queue, group, ledger, total)
            assert ledger.violations == []
            ids = [message_id for _, _, message_id in ledger.deliveries]
            assert len(ids) == len(set(ids)) == total, group
            check_order(ledger)


async def test_a_dead_consumers_batch_is_redelivered_after_its_lease_expires(
    broker: Broker, queue: str, db: Db
) -> None:
    total = await fill(broker, queue)
    dead = await broker.pop(queue, "p0", batch=5, consumer_group="g")
    dead_partition = {m.partition for m in dead.messages}
    assert dead_partition == {"p0"}

    ledger = Ledger()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(consumer, f"c{i}", broker, queue, "g", ledger, total - 40)
    # everything but p0 was consumed, and p0 was never handed out while its lease lived
    assert {p for p, _, _ in ledger.deliveries} == {f"p{p}" for p in range(1, PARTITIONS)}

    assert await expire_leases(db, queue) == 1
    ledger.done = 0
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(consumer, f"d{i}", broker, queue, "g", ledger, 40)
    redelivered = [(o, m) for p, o, m in ledger.deliveries if p == "p0"]
    assert [o for o, _ in redelivered] == list(range(PER_PARTITION))
    assert [m for _, m in redelivered[:5]] == [m.id for m in dead.messages]
    stale = await broker.ack(dead.messages[0])
    assert stale[0].error == "Invalid or expired lease"


async def test_transactions_pushes_and_pops_together_never_deadlock(
    settings: Settings, queue: str, db: Db
) -> None:
    source, sink = f"{queue}-in", f"{queue}-out"
    partitions = ["a", "b", "c"]
    async with open_broker(settings) as one, open_broker(settings) as two:
        await one.push(
            [{"queue": source, "partition": p, "payload": n} for n in range(20) for p in partitions]
        )
        moved = 0

        async def mover(broker: Broker, seed: int) -> None:
            nonlocal moved
            rng = random.Random(seed)
            for _ in range(200):
                popped = await broker.pop(source, batch=3, partitions=2)
                if not popped:
                    if moved >= 60:
                        return
                    await trio.lowlevel.checkpoint()
                    continue
                targets = rng.sample(partitions, 2)
                answer = await broker.transaction(
                    popped.messages,
                    [
                        {"queue": sink, "partition": t, "payload": m.data}
                        for m in popped.messages
                        for t in targets
                    ],
                )
                assert answer.success, answer
                moved += len(popped.messages)

        async def pusher(broker: Broker, seed: int) -> None:
            rng = random.Random(seed)
            for n in range(30):
                await broker.push(
                    [
                        {"queue": sink, "partition": p, "payload": f"plain-{seed}-{n}"}
                        for p in rng.sample(partitions, 3)
                    ]
                )

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i, broker in enumerate((one, two, one, two)):
                    nursery.start_soon(mover, broker, i)
                nursery.start_soon(pusher, one, 10)
                nursery.start_soon(pusher, two, 11)
    assert moved == 60
    total = 0
    for p in partitions:
        offsets = [f["offset"] for f in await db.frames(sink, p)]
        assert offsets == list(range(len(offsets))), p
        total += len(offsets)
    assert total == 60 * 2 + 2 * 30 * 3

"""The partition row lock (``FOR UPDATE OF p`` in ``queen.push_frames``) serialises the
writers of one partition across broker processes.

Two brokers on one database, each with a pool of its own (as two processes would be), push
one-item bodies to the same partition at the same moment, round after round, both with the
round's transaction id: their two transactions reach the server together and race on the
partition's row. Under the lock the second one waits, then reads the ``next_offset`` the first
committed and finds its frame in the probe: one ``queued`` and one ``duplicate`` per round,
contiguous offsets, each transaction id stored once. Without the lock both read the same
``next_offset`` and miss each other's frame: their segments collide and a push fails."""

from __future__ import annotations

from typing import Any

import trio

from queen import open_broker
from queen.broker import Broker
from queen.push import PushedItem
from tests.conftest import Db

ROUNDS = 100
# Items per body: enough that a transaction lasts longer than the broker's work between the
# two sends (without the lock, 34 to 56 rounds in 100 then collided here; at 1 item, 3).
ITEMS = 100


async def test_two_brokers_racing_on_one_partition_keep_offsets_and_dedup_exact(
    settings: Any, queue: str, db: Db
) -> None:
    answers: list[PushedItem] = []

    async def push(broker: Broker, who: str, tx: str) -> None:
        body = [
            {"queue": queue, "partition": "p", "payload": who, "transactionId": f"{tx}.{i}"}
            for i in range(ITEMS)
        ]
        answers.extend(await broker.push(body))

    async with open_broker(settings) as a, open_broker(settings) as b:
        # Both brokers have resolved the partition (and their actors run) before the race.
        await push(a, "a", "start")
        await push(b, "b", "start")
        for round_ in range(ROUNDS):
            async with trio.open_nursery() as nursery:  # both writes leave in one scheduler tick
                nursery.start_soon(push, a, "a", f"r{round_}")
                nursery.start_soon(push, b, "b", f"r{round_}")

    keys = [
        f"{tx}.{i}" for tx in ["start", *(f"r{r}" for r in range(ROUNDS))] for i in range(ITEMS)
    ]
    assert [a.status for a in answers].count("failed") == 0
    assert sorted(a.status for a in answers) == ["duplicate"] * len(keys) + ["queued"] * len(keys)
    frames = await db.frames(queue, "p")
    assert [f["offset"] for f in frames] == list(range(len(keys)))
    stored = {f["transaction_id"]: f["message_id"] for f in frames}
    assert len(stored) == len(frames) and sorted(stored) == sorted(keys)
    for answer in answers:  # every answer names the one stored message of its key
        assert answer.message_id == stored[answer.transaction_id]

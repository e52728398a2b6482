"""One contract, two stores: the in-memory fake the actor tests use and the PostgreSQL store.

Every case runs against both, so the fake cannot drift from what the product does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from queen.broker import Broker
from queen.ids import NIL_UUID, mint_ids
from queen.model import PartitionKey
from queen.storage.base import SegmentWrite, Store
from tests.conftest import Db
from tests.fakes import MemoryStore


@dataclass
class Backend:
    store: Store
    # (offset, transaction id, message id) of every stored frame of a partition, by offset
    stored: Callable[[int], Awaitable[list[tuple[int, str, str]]]]
    drop_segments: Callable[[int], Awaitable[None]]


@pytest.fixture(params=["memory", "postgres"])
async def backend(request: pytest.FixtureRequest, broker: Broker, db: Db) -> Backend:
    """The store under test; a PostgreSQL broker is opened for both (it is cheap) because
    fixture values of this async test run cannot be requested conditionally."""
    if request.param == "memory":
        memory = MemoryStore()

        async def stored_in_memory(pid: int) -> list[tuple[int, str, str]]:
            return sorted(
                (s.first_offset + i, tx, mid)
                for s in memory.segments
                if s.partition_id == pid
                for i, (tx, mid) in enumerate(zip(s.transaction_ids, s.message_ids, strict=True))
            )

        async def drop_in_memory(pid: int) -> None:
            memory.segments[:] = [s for s in memory.segments if s.partition_id != pid]

        return Backend(memory, stored_in_memory, drop_in_memory)

    async def stored_in_pg(pid: int) -> list[tuple[int, str, str]]:
        rows = await db.rows(
            """SELECT s.first_offset + u.i - 1, u.tx, u.mid::text FROM queen.segments s
               CROSS JOIN LATERAL unnest(s.transaction_ids, s.message_ids)
                    WITH ORDINALITY AS u(tx, mid, i)
               WHERE s.partition_id = %s ORDER BY 1""",
            pid,
        )
        return [(int(o), str(t), str(m)) for o, t, m in rows]

    async def drop_in_pg(pid: int) -> None:
        await db.rows("DELETE FROM queen.segments WHERE partition_id = %s", pid)

    return Backend(broker.store, stored_in_pg, drop_in_pg)


def write(pid: int, *txs: str, leaders: list[int] | None = None) -> SegmentWrite:
    if leaders is None:
        first: dict[str, int] = {}
        leaders = [first.setdefault(tx, i) for i, tx in enumerate(txs)]
    return SegmentWrite(
        partition_id=pid,
        message_ids=mint_ids(len(txs)),
        transaction_ids=list(txs),
        payloads=[b'{"n":%d}' % i for i in range(len(txs))],
        leaders=leaders,
    )


async def test_partition_ids_are_stable_distinct_and_in_key_order(
    backend: Backend, queue: str
) -> None:
    keys = [PartitionKey(queue, name) for name in ("b", "a", "c")]
    ids = await backend.store.ensure_partitions(keys)
    assert len(set(ids)) == 3
    assert await backend.store.ensure_partitions(keys[::-1]) == ids[::-1]
    assert await backend.store.ensure_partition(keys[1]) == ids[1]
    other = await backend.store.ensure_partitions([PartitionKey(f"{queue}-x", "a")])
    assert other[0] not in ids


async def test_writes_take_consecutive_offsets_in_input_order(backend: Backend, queue: str) -> None:
    (pid,) = await backend.store.ensure_partitions([PartitionKey(queue, "p")])
    one, two = write(pid, "a", "b", "c"), write(pid, "d")
    assert (await backend.store.write_segments([one]))[0].duplicates == {}
    assert (await backend.store.write_segments([two]))[0].duplicates == {}
    assert await backend.stored(pid) == [
        (0, "a", one.message_ids[0]),
        (1, "b", one.message_ids[1]),
        (2, "c", one.message_ids[2]),
        (3, "d", two.message_ids[0]),
    ]


async def test_first_wins_inside_a_write(backend: Backend, queue: str) -> None:
    (pid,) = await backend.store.ensure_partitions([PartitionKey(queue, "p")])
    w = write(pid, "x", "y", "x", "x")
    (result,) = await backend.store.write_segments([w])
    assert result.duplicates == {2: w.message_ids[0], 3: w.message_ids[0]}
    assert [(o, t) for o, t, _ in await backend.stored(pid)] == [(0, "x"), (1, "y")]


async def test_duplicates_of_history_name_the_original_within_one_partition(
    backend: Backend, queue: str
) -> None:
    pid, other = await backend.store.ensure_partitions(
        [PartitionKey(queue, "p"), PartitionKey(queue, "q")]
    )
    original = write(pid, "k1", "k2")
    await backend.store.write_segments([original])
    again, elsewhere = write(pid, "k2", "new", "k1"), write(other, "k1")
    results = await backend.store.write_segments([again, elsewhere])
    assert results[0].duplicates == {0: original.message_ids[1], 2: original.message_ids[0]}
    assert results[1].duplicates == {}  # dedup is per partition
    assert [t for _, t, _ in await backend.stored(pid)] == ["k1", "k2", "new"]
    assert [t for _, t, _ in await backend.stored(other)] == ["k1"]


async def test_duplicate_of_a_removed_segment_names_the_nil_uuid(
    backend: Backend, queue: str
) -> None:
    (pid,) = await backend.store.ensure_partitions([PartitionKey(queue, "p")])
    await backend.store.write_segments([write(pid, "gone")])
    await backend.drop_segments(pid)
    (result,) = await backend.store.write_segments([write(pid, "gone", "fresh")])
    assert result.duplicates == {0: NIL_UUID}
    assert [(o, t) for o, t, _ in await backend.stored(pid)] == [(1, "fresh")]


async def test_one_result_per_write_in_order(backend: Backend, queue: str) -> None:
    keys = [PartitionKey(queue, f"p{i}") for i in range(4)]
    pids = await backend.store.ensure_partitions(keys)
    seed: Any = write(pids[2], "dup")
    await backend.store.write_segments([seed])
    writes = [write(pid, "dup", f"t{pid}") for pid in pids]
    results = await backend.store.write_segments(writes)
    assert [r.duplicates for r in results] == [{}, {}, {0: seed.message_ids[0]}, {}]
    for pid in pids:
        assert [t for _, t, _ in await backend.stored(pid)][-1] == f"t{pid}"

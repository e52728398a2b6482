"""The per-queue flow of every broker process: each process's memory saved to
``queen.queue_flow`` by its flush (absolute figures, so a flush made again adds nothing; the
minutes past the hour deleted) and read back summed over the processes (queen/flow.py,
queen/storage/flow.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from queen.admin.system import FlowQuery
from queen.broker import Broker
from queen.errors import StoreUnavailable
from queen.flow import FLOW_SPAN_S, Flow, FlowRow, QueueFlow, SharedFlow
from queen.lifecycle import open_broker
from queen.settings import Settings
from queen.storage.flow import PgFlowStore
from queen.storage.pool import ConnectionPool
from tests.conftest import Db


@pytest.fixture
async def pool(broker: Broker, pg_url: str) -> AsyncIterator[ConnectionPool]:
    """A pool on the broker's database (the broker fixture migrated its schema)."""
    pool = ConnectionPool(pg_url, size=2, connect_timeout_s=5, statement_timeout_ms=10_000)
    try:
        yield pool
    finally:
        await pool.aclose()


class Clock:
    def __init__(self) -> None:
        self.minute = int(time.time() // 60) * 60
        self.now = self.minute + 10.0

    def __call__(self) -> float:
        return self.now


async def _saved(db: Db, queue: str) -> dict[tuple[int, str], tuple[Any, ...]]:
    """Per (minute, process): the row saved for ``queue``."""
    rows = await db.rows(
        """SELECT extract(epoch FROM minute)::bigint, process, pushes, pops, lag_sum_s,
                  lag_max_s, empty_pops, acks, acks_refused
             FROM queen.queue_flow WHERE queue_name = %s""",
        queue,
    )
    return {(int(r[0]), str(r[1])): tuple(r[2:]) for r in rows}


async def test_a_flush_saves_absolute_figures_so_saving_again_adds_nothing(
    pool: ConnectionPool, db: Db, queue: str
) -> None:
    clock = Clock()
    minute = clock.minute
    flow = QueueFlow(clock)
    shared = SharedFlow(flow, PgFlowStore(pool), flush_s=1, process=f"p-{queue}")
    flow.pushed(queue, 3)
    flow.popped(queue, [0.5, 1.5])
    flow.found_nothing(queue)
    flow.acked(queue, 2, 1)
    assert await shared.flush() == 1
    row = (3, 2, 2.0, 1.5, 1, 2, 1)
    assert await _saved(db, queue) == {(minute, f"p-{queue}"): row}
    assert await shared.flush() == 0, "nothing changed since: nothing written"
    # the same entries saved again (a turn made again after an answer was lost): the same row
    copies, _ = flow.take_changed(minute - FLOW_SPAN_S)
    assert copies == []
    again = [(minute, queue, Flow(3, 2, 2.0, 1.5, 1, 2, 1))]
    for _ in range(2):
        await shared.store.save_flow(shared.process, again, minute - FLOW_SPAN_S)
    assert await _saved(db, queue) == {(minute, f"p-{queue}"): row}
    flow.pushed(queue, 2)  # changed again: the row now holds the new total
    assert await shared.flush() == 1
    assert (await _saved(db, queue))[(minute, f"p-{queue}")][0] == 5


async def test_a_flush_deletes_every_process_s_minutes_past_the_hour(
    pool: ConnectionPool, db: Db, queue: str
) -> None:
    clock = Clock()
    flow = QueueFlow(clock)
    shared = SharedFlow(flow, PgFlowStore(pool), flush_s=1, process=f"p-{queue}")
    old, kept = clock.minute - FLOW_SPAN_S - 60, clock.minute - FLOW_SPAN_S
    others = [(old, queue, Flow(pushes=7)), (kept, queue, Flow(pushes=8))]
    await shared.store.save_flow("another", others, old - FLOW_SPAN_S)
    assert set(await _saved(db, queue)) == {(old, "another"), (kept, "another")}
    assert await shared.flush() == 0  # nothing of its own: it still deletes
    assert set(await _saved(db, queue)) == {(kept, "another")}


class FailingStore:
    """``store`` whose calls fail while ``down``."""

    def __init__(self, store: PgFlowStore) -> None:
        self.store = store
        self.down = True

    async def save_flow(self, process: str, rows: Sequence[FlowRow], oldest: int) -> int:
        if self.down:
            raise StoreUnavailable("cannot connect to PostgreSQL: test")
        return await self.store.save_flow(process, rows, oldest)

    async def saved_flow(
        self, process: str, own_before: int, since: float, until: float, queue: str | None
    ) -> list[FlowRow]:
        if self.down:
            raise StoreUnavailable("cannot connect to PostgreSQL: test")
        return await self.store.saved_flow(process, own_before, since, until, queue)


async def test_a_flush_the_database_does_not_take_keeps_the_entries_for_the_next(
    pool: ConnectionPool, db: Db, queue: str
) -> None:
    clock = Clock()
    flow = QueueFlow(clock)
    store = FailingStore(PgFlowStore(pool))
    shared = SharedFlow(flow, store, flush_s=1, process=f"p-{queue}")
    quiet = f"{queue}-quiet"  # changed before the failed flush only
    flow.pushed(queue, 4)
    flow.pushed(quiet, 2)
    with pytest.raises(StoreUnavailable):
        await shared.flush()
    flow.pushed(queue, 1)  # changed again meanwhile: listed once
    assert sorted(q for _, q, _ in flow.changed) == [queue, quiet]
    # the read answers from memory, and says it is this process's alone
    read = await shared.rows(clock.now - 60, clock.now, queue)
    assert (read.every, [r[2].pushes for r in read.rows]) == (False, [5])
    store.down = False
    assert await shared.flush() == 2
    assert [r[0] for r in (await _saved(db, queue)).values()] == [5]
    assert [r[0] for r in (await _saved(db, quiet)).values()] == [2]
    read = await shared.rows(clock.now - 60, clock.now, queue)
    assert (read.every, [r[2].pushes for r in read.rows]) == (True, [5])


async def test_a_read_adds_the_other_processes_and_counts_this_one_once(
    pool: ConnectionPool, queue: str
) -> None:
    clock = Clock()
    minute = clock.minute
    flow = QueueFlow(clock)
    shared = SharedFlow(flow, PgFlowStore(pool), flush_s=1, process=f"p-{queue}")
    flow.pushed(queue, 3)
    flow.popped(queue, [1.0])
    await shared.flush()
    flow.pushed(queue, 1)  # not flushed yet: the read takes it from memory
    other = Flow(pushes=10, pops=2, lag_sum_s=6.0, lag_max_s=4.0, acks=2)
    earlier = Flow(pushes=1)  # a minute only another process has
    await shared.store.save_flow(
        "w2", [(minute, queue, other), (minute - 60, queue, earlier)], minute - FLOW_SPAN_S
    )
    # a minute this process's memory no longer holds is read from its own row
    await shared.store.save_flow(
        shared.process, [(minute - 120, queue, Flow(empty_pops=3))], minute - FLOW_SPAN_S
    )
    read = await shared.rows(clock.now - 600, clock.now, queue)
    assert read.every
    assert [(m, q) for m, q, _ in read.rows] == [
        (minute - 120, queue),
        (minute - 60, queue),
        (minute, queue),
    ]
    assert read.rows[0][2].empty_pops == 3
    f = read.rows[-1][2]
    assert (f.pushes, f.pops, f.lag_sum_s, f.lag_max_s, f.acks) == (14, 3, 7.0, 4.0, 2)
    assert (await shared.rows(clock.now - 600, clock.now, "another-queue")).rows == []


async def test_a_broker_saves_its_flow_on_the_way_out(
    settings: Settings, db: Db, queue: str
) -> None:
    """A broker stopped before its loop's next turn (a restart) loses nothing of its flow,
    and the next process's figures are added to it."""
    settings = dataclasses.replace(settings, flow_flush_s=3600.0)
    async with open_broker(settings) as broker:
        await broker.push([{"queue": queue, "payload": i} for i in range(3)])
    assert [r[0] for r in (await _saved(db, queue)).values()] == [3]
    async with open_broker(settings) as broker:
        await broker.push([{"queue": queue, "payload": 9}])
        now = time.time()
        read = await broker.admin.system.queue_flow(
            FlowQuery(
                (datetime.fromtimestamp(now - 120, UTC), datetime.fromtimestamp(now, UTC)), queue
            )
        )
    assert read.every_process and sum(p.pushes for p in read.points) == 4
    assert sorted(r[0] for r in (await _saved(db, queue)).values()) == [1, 3]


def test_every_process_has_its_own_identity() -> None:
    store = FailingStore(None)  # type: ignore[arg-type]
    assert len({SharedFlow(QueueFlow(), store, flush_s=1).process for _ in range(3)}) == 3

"""Parking: a pop's walk of a whole queue leaves out the cursors found with nothing past them a
while after they were last served, so its cost does not grow with the partitions that have
nothing to give; and a parked cursor with messages is never hidden from a pop that would
otherwise come back empty-handed (docs/consuming.md, "Partitions with nothing to give")."""

from __future__ import annotations

import json
import random
from typing import Any

import psycopg
import trio

from queen import Broker
from tests.conftest import Db
from tests.consuming import Api, explain_nested, idle_partitions, pop_blocks_read

GROUP = "g"


async def _served_long_ago(db: Db, queue: str) -> None:
    """Every cursor of the group served an hour ago, and its sweep due."""
    await db.rows(
        """UPDATE queen.cursors c SET delivered_at = now() - interval '1 hour'
           FROM queen.queues q WHERE q.id = c.queue_id AND q.name = %s""",
        queue,
    )
    await _sweep_due(db, queue)


async def _sweep_due(db: Db, queue: str) -> None:
    await db.rows(
        """UPDATE queen.cursor_marks m SET swept_at = NULL
           FROM queen.queues q WHERE q.id = m.queue_id AND q.name = %s""",
        queue,
    )


async def _sweep_not_due(db: Db, queue: str) -> None:
    await db.rows(
        """UPDATE queen.cursor_marks m SET swept_at = now() + interval '1 hour'
           FROM queen.queues q WHERE q.id = m.queue_id AND q.name = %s""",
        queue,
    )


async def _unpark_all(db: Db, queue: str) -> None:
    await db.rows(
        """UPDATE queen.cursors c SET parked = false FROM queen.queues q
           WHERE q.id = c.queue_id AND q.name = %s""",
        queue,
    )


async def _parked(db: Db, queue: str) -> dict[str, bool]:
    rows = await db.rows(
        """SELECT p.name, c.parked FROM queen.cursors c
           JOIN queen.partitions p ON p.id = c.partition_id
           JOIN queen.queues q ON q.id = c.queue_id
           WHERE q.name = %s AND c.consumer_group = %s""",
        queue,
        GROUP,
    )
    return {str(name): bool(parked) for name, parked in rows}


async def _pop(broker: Broker, queue: str, partition: str | None = None) -> list[Any]:
    result = await broker.pop(queue, partition, consumer_group=GROUP, batch=1, auto_ack=True)
    return [(m.partition, m.data) for m in result.messages] if result else []


async def _look(db: Db, queue: str) -> tuple[list[Any], Any]:
    """A waiting pop's look at the whole queue (one message, auto-ack), as the broker makes it:
    what it delivered, and its ripe row's answer (None when it delivered, or when the queue
    does not exist yet and no row comes back)."""
    rows = await db.rows(
        """SELECT partition_name, payload, ripe_in_s FROM queen.pop(
               %s, NULL, '', '', %s, 1, 1, true, 'all', NULL, gen_random_uuid(), true,
               1048576, NULL, 1)""",
        queue,
        GROUP,
    )
    got = [(name, json.loads(payload)) for name, payload, _ in rows if name is not None]
    ripe = [r for name, _, r in rows if name is None]
    assert len(ripe) == (0 if got or not rows else 1), rows
    return got, ripe[0] if ripe else None


async def test_a_sweep_parks_the_cursors_with_nothing_past_them_and_the_walk_reads_past_none(
    broker: Broker, db: Db, pg_url: str, queue: str
) -> None:
    await idle_partitions(broker, queue, GROUP, 400)
    await broker.push([{"queue": queue, "partition": "live", "payload": "first"}])
    assert await _pop(broker, queue, "live") == [("live", "first")]
    await _served_long_ago(db, queue)
    assert await _pop(broker, queue) == []  # nothing to give: this look sweeps
    parked = await _parked(db, queue)
    assert sum(parked.values()) == 401
    # "live" is written again: the sweep is not due, the walk meets it first
    await broker.push([{"queue": queue, "partition": "live", "payload": "second"}])
    await db.rows(
        """UPDATE queen.cursors c SET parked = false FROM queen.partitions p
           WHERE p.id = c.partition_id AND p.name = 'live'"""
    )
    beside_parked = await trio.to_thread.run_sync(pop_blocks_read, pg_url, queue, GROUP, None, 1)
    # the same look with the 400 idle cursors unparked reads past each of them
    await _unpark_all(db, queue)
    await _sweep_not_due(db, queue)
    beside_unparked = await trio.to_thread.run_sync(pop_blocks_read, pg_url, queue, GROUP, None, 1)
    assert beside_unparked > beside_parked + 390, (beside_parked, beside_unparked)
    assert beside_parked < 150, beside_parked
    assert await _pop(broker, queue) == [("live", "second")]


async def test_a_recently_served_cursor_and_one_with_messages_are_not_parked(
    broker: Broker, db: Db, queue: str
) -> None:
    await idle_partitions(broker, queue, GROUP, 3)
    await broker.push([{"queue": queue, "partition": "idle-1", "payload": "more"}])
    await _sweep_due(db, queue)
    await broker.pop(queue, "elsewhere", consumer_group=GROUP)  # (makes the marks row)
    assert await _pop(broker, queue) == [("idle-1", "more")]  # the sweep: all served just now
    assert await _parked(db, queue) == {"idle-0": False, "idle-1": False, "idle-2": False}
    await broker.push([{"queue": queue, "partition": "idle-2", "payload": "waiting"}])
    await _served_long_ago(db, queue)
    await broker.pop(queue, "elsewhere", consumer_group=GROUP)
    result = await broker.pop(queue, consumer_group=GROUP, batch=1)  # leased, not acked
    assert [m.partition for m in result.messages] == ["idle-2"]
    assert await _parked(db, queue) == {"idle-0": True, "idle-1": True, "idle-2": False}


async def test_a_walk_that_finds_nothing_else_unparks_and_delivers_a_parked_partition(
    broker: Broker, db: Db, queue: str
) -> None:
    await idle_partitions(broker, queue, GROUP, 20)
    await _served_long_ago(db, queue)
    assert await _pop(broker, queue) == []
    assert all((await _parked(db, queue)).values())
    await broker.push([{"queue": queue, "partition": "idle-7", "payload": "back"}])
    # the sweep is not due: the walk of the unparked cursors finds nothing, so it unparks
    assert await _pop(broker, queue) == [("idle-7", "back")]
    parked = await _parked(db, queue)
    assert not parked["idle-7"] and sum(parked.values()) == 19


async def test_a_waiting_look_that_finds_nothing_else_unparks_and_delivers_a_parked_partition(
    broker: Broker, db: Db, queue: str
) -> None:
    await idle_partitions(broker, queue, GROUP, 20)
    await _served_long_ago(db, queue)
    assert await _look(db, queue) == ([], None)  # parks all: nothing is pending
    assert all((await _parked(db, queue)).values())
    await broker.push([{"queue": queue, "partition": "idle-7", "payload": "back"}])
    # the sweep is not due: the walk of the unparked cursors finds nothing, the ripe read
    # finds idle-7 pending and parked, so the look unparks it and walks again
    assert await _look(db, queue) == ([("idle-7", "back")], None)
    parked = await _parked(db, queue)
    assert not parked["idle-7"] and sum(parked.values()) == 19
    assert await _look(db, queue) == ([], None)


async def test_an_empty_waiting_look_reads_the_parked_cursors_once(
    broker: Broker, db: Db, pg_url: str, queue: str
) -> None:
    """A look that finds nothing reads every pending cursor of the group to say when to look
    again; that one read also tells it which parked cursors to unpark, so the parked ones cost
    it no second pass."""
    await idle_partitions(broker, queue, GROUP, 400)
    await _served_long_ago(db, queue)
    assert await _look(db, queue) == ([], None)  # parks the 400
    assert sum((await _parked(db, queue)).values()) == 400
    await _sweep_not_due(db, queue)
    parked = await trio.to_thread.run_sync(pop_blocks_read, pg_url, queue, GROUP, None, 1)
    # the same look with the 400 unparked: its walk reads past each of them, then the same
    # ripe read; parked, only the ripe read
    await _unpark_all(db, queue)
    unparked = await trio.to_thread.run_sync(pop_blocks_read, pg_url, queue, GROUP, None, 1)
    assert unparked > parked + 390, (parked, unparked)


async def test_a_parked_partition_waits_behind_claimable_ones_until_the_sweep(
    broker: Broker, db: Db, queue: str
) -> None:
    await idle_partitions(broker, queue, GROUP, 5)
    await _served_long_ago(db, queue)
    assert await _pop(broker, queue) == []  # parks all five
    live = ("live-a", "live-b", "live-c")
    for _ in range(2):
        await broker.push([{"queue": queue, "partition": p, "payload": p} for p in live])
    for name in live:  # served now, in this order
        assert await _pop(broker, queue, name) == [(name, name)]
    await broker.push([{"queue": queue, "partition": "idle-3", "payload": "parked"}])
    # the parked one is left out of the walk, though served an hour before the others
    assert await _pop(broker, queue) == [("live-a", "live-a")]
    # the sweep, once due, unparks it: served an hour ago, it is the first in line
    await _sweep_due(db, queue)
    assert await _pop(broker, queue) == [("idle-3", "parked")]
    assert sorted(await _pop(broker, queue) + await _pop(broker, queue)) == [
        ("live-b", "live-b"),
        ("live-c", "live-c"),
    ]
    assert await _pop(broker, queue) == []


async def test_a_sweep_looks_at_a_thousand_parked_cursors_and_the_next_at_the_rest(
    broker: Broker, db: Db, queue: str
) -> None:
    await idle_partitions(broker, queue, GROUP, 1200)
    live = ("live-a", "live-b", "live-c")
    for _ in range(2):
        await broker.push([{"queue": queue, "partition": p, "payload": p} for p in live])
    await _served_long_ago(db, queue)
    for name in live:  # served now
        assert await _pop(broker, queue, name) == [(name, name)]
    assert await _pop(broker, queue) == [("live-a", "live-a")]  # this look parks the 1,200
    assert sum((await _parked(db, queue)).values()) == 1200
    late = await db.value(
        """SELECT p.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
           WHERE q.name = %s AND p.name LIKE 'idle-%%' ORDER BY p.id OFFSET 1100 LIMIT 1""",
        queue,
    )
    await broker.push([{"queue": queue, "partition": late, "payload": "late"}])
    await _sweep_due(db, queue)  # looks at the first thousand parked cursors only
    assert await _pop(broker, queue) == [("live-b", "live-b")]
    await _sweep_due(db, queue)  # and the next, at the rest
    assert await _pop(broker, queue) == [(late, "late")]


async def test_a_pop_of_a_parked_partition_by_name_takes_it_and_unparks_it(
    broker: Broker, db: Db, queue: str
) -> None:
    await idle_partitions(broker, queue, GROUP, 4)
    await _served_long_ago(db, queue)
    assert await _pop(broker, queue) == []
    await broker.push([{"queue": queue, "partition": "idle-2", "payload": "named"}])
    assert await _pop(broker, queue, "idle-2") == [("idle-2", "named")]
    assert (await _parked(db, queue))["idle-2"] is False


async def test_seek_back_unparks_what_it_moves(
    broker: Broker, api: Api, db: Db, queue: str
) -> None:
    await idle_partitions(broker, queue, GROUP, 6)
    await _served_long_ago(db, queue)
    assert await _pop(broker, queue) == []
    assert all((await _parked(db, queue)).values())
    await broker.push([{"queue": queue, "partition": "live", "payload": "x"}])
    assert await _pop(broker, queue, "live") == [("live", "x")]  # served now
    await broker.push([{"queue": queue, "partition": "live", "payload": "new"}])
    status, _ = await api.post(
        f"/api/v1/consumer-groups/{GROUP}/queues/{queue}/seek",
        {"timestamp": "2000-01-01T00:00:00Z"},
    )
    assert status == 200
    assert not any((await _parked(db, queue)).values())
    # every partition served an hour ago is ahead of the one served now again
    first = await _pop(broker, queue)
    assert first and first[0][0].startswith("idle-"), first


async def test_no_whole_look_comes_back_empty_while_a_partition_has_something_for_it(
    broker: Broker, db: Db, queue: str
) -> None:
    """A random run of pushes, pops of the whole queue (waiting pops' looks among them) and
    by name, sweeps made due and cursors dated back: every message is delivered once, and a
    pop of the whole queue that delivers nothing leaves nothing pending for the group
    (auto-ack: no lease holds any), as a waiting one's answer says."""
    rng = random.Random(20261207)
    names = [f"p{i}" for i in range(8)]
    pushed: list[tuple[str, int]] = []
    delivered: list[tuple[str, int]] = []
    for step in range(160):
        roll = rng.random()
        if roll < 0.35:
            name = rng.choice(names)
            await broker.push([{"queue": queue, "partition": name, "payload": step}])
            pushed.append((name, step))
        elif roll < 0.45:
            await _served_long_ago(db, queue)
        elif roll < 0.55:
            await _sweep_due(db, queue)
        elif roll < 0.62:
            delivered += await _pop(broker, queue, rng.choice(names))
        else:
            waiting = rng.random() < 0.5  # a waiting pop's look also says what is pending
            got, ripe = await _look(db, queue) if waiting else (await _pop(broker, queue), None)
            delivered += got
            if not got:
                assert ripe is None, (step, ripe)
                pending = await db.value(
                    """SELECT count(*) FROM queen.cursors c
                       JOIN queen.partitions p ON p.id = c.partition_id
                       JOIN queen.queues q ON q.id = c.queue_id
                       WHERE q.name = %s AND c.consumer_group = %s
                         AND p.next_offset > c.next_offset""",
                    queue,
                    GROUP,
                )
                unseen = {n for n, _ in pushed} - set(await _parked(db, queue))
                assert pending == 0 and not unseen, (step, pending, unseen)
    while got := await _pop(broker, queue):
        delivered += got
    assert sorted(delivered) == sorted(pushed)


def _unparking_plans(url: str, queue: str) -> list[tuple[str, dict[str, Any]]]:
    """(query text, plan) of every statement run inside queen.pop that reads or writes a
    parked cursor, for a look at ``queue`` that does not wait and one that does, each twice
    (the second on the session's cached generic plans); rolled back."""
    with psycopg.connect(url, autocommit=True) as conn:
        logged = explain_nested(conn, "SET auto_explain.log_level = notice")
        for ripe in (False, False, True, True):
            conn.execute("BEGIN")
            conn.execute(
                "SELECT * FROM queen.pop(%s, NULL, '', '', %s, 1, 1, true, 'all', NULL,"
                " gen_random_uuid(), %s, 1048576, NULL, 1)",
                (queue, GROUP, ripe),
            )
            conn.execute("ROLLBACK")
    return [
        (entry["Query Text"], entry["Plan"])
        for entry in logged
        if "unnest(p_partitions)" in entry["Query Text"] or "parked = false" in entry["Query Text"]
    ]


def _cursor_scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    scan = node.get("Relation Name") == "cursors" and node["Node Type"] != "ModifyTable"
    found = [node] if scan else []
    for child in node.get("Plans", []):
        found.extend(_cursor_scans(child))
    return found


async def test_an_empty_look_reaches_each_parked_cursor_through_its_key(
    broker: Broker, db: Db, pg_url: str, queue: str
) -> None:
    """An empty look unparks the parked cursors with something past them. It reads each
    listed cursor through its key, one partition at a time: a scan of the group's cursors that
    tests each one against the list costs cursors x partitions listed (0.2 s a look beside
    10,000 parked cursors, on a generic plan that expected one row)."""
    await idle_partitions(broker, queue, GROUP, 300)
    await _served_long_ago(db, queue)
    assert await _look(db, queue) == ([], None)  # parks the 300
    await _sweep_not_due(db, queue)
    await broker.push([{"queue": queue, "partition": "idle-7", "payload": "again"}])
    plans = await trio.to_thread.run_sync(_unparking_plans, pg_url, queue)
    texts = {text for text, _ in plans}
    assert any("parked = false" in text for text in texts), texts  # the unparking ran
    assert any("unnest(p_partitions)" in text for text in texts), texts
    for text, plan in plans:
        for scan in _cursor_scans(plan):
            assert "ANY" not in scan.get("Filter", ""), (text, scan)
    # and the look that does not wait delivers what the parked partition holds
    result = await broker.pop(queue, consumer_group=GROUP, batch=1, auto_ack=True, wait=False)
    assert result and [(m.partition, m.data) for m in result.messages] == [("idle-7", "again")]

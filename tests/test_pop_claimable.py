"""When a group's cursor in a partition is claimable is stated once, by queen.cursor_claim: the
three walks of queen.pop (named partitions, one queue, several queues) and its two ripe scans
read it, inlined into each query, and so claim the same partitions and date the same wait."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import trio

from tests.conftest import Db
from tests.consuming import Api, age_messages, explain_nested

GROUP = "__QUEUE_MODE__"
POP = (
    "SELECT * FROM queen.pop(%s, NULL, %s, '', %s, 100, 100, false, 'all', NULL,"
    " gen_random_uuid(), %s, NULL, %s, %s)"
)


async def _namespace(api: Api, ns: str, *queues: tuple[str, dict[str, Any]]) -> None:
    for name, options in queues:
        status, _ = await api.post(
            "/api/v1/configure", {"queue": name, "namespace": ns, "options": options}
        )
        assert status == 200


async def _hold(db: Db, queue: str, partition: str, column: str) -> None:
    """A live lease or a retry delay on ``partition``: an hour from now."""
    assert column in ("lease_expires_at", "not_before")
    await db.rows(
        f"""UPDATE queen.cursors c SET {column} = now() + interval '1 hour'
            FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
            WHERE c.partition_id = p.id AND c.consumer_group = %s
              AND q.name = %s AND p.name = %s""",
        GROUP,
        queue,
        partition,
    )


def _looks(
    url: str, looks: list[tuple[str | None, str, list[str] | None]], ripe: bool, spread: int = 1
) -> Any:
    """What queen.pop answers for each look (queue, namespace, hint), each rolled back to a
    savepoint of one transaction (one now()): the claimed (queue, partition) pairs, and the
    ripe rows. ``spread``: queen.pop's p_spread."""
    out = []
    with psycopg.connect(url) as conn:
        for queue, ns, hint in looks:
            conn.execute("SAVEPOINT look")
            rows = conn.execute(POP, (queue, ns, GROUP, ripe, hint, spread)).fetchall()
            conn.execute("ROLLBACK TO SAVEPOINT look")
            out.append(
                (
                    sorted({(r[1], r[2]) for r in rows if r[0] is not None}),
                    [r[11] for r in rows if r[0] is None],
                )
            )
        conn.rollback()
    return out


async def test_each_walk_claims_the_same_partitions(api: Api, queue: str, db: Db) -> None:
    plain, quiet, late = f"{queue}-plain", f"{queue}-window", f"{queue}-delay"
    ns = f"ns-{queue}"
    await _namespace(
        api, ns, (plain, {}), (quiet, {"windowBuffer": 30}), (late, {"delayedProcessing": 60})
    )
    for name in ("free", "leased", "waiting", "done"):
        await api.push(plain, name, 1)
    assert len(await api.messages(plain, "done", autoAck=True)) == 1
    for name in ("leased", "waiting"):
        assert len(await api.messages(plain, name)) == 1
    await _hold(db, plain, "waiting", "not_before")
    await db.rows(  # the lease of "waiting" ends: only its retry delay holds it
        "UPDATE queen.cursors SET lease_expires_at = NULL, lease_id = NULL, lease_end = NULL"
        " WHERE lease_expires_at IS NOT NULL AND not_before IS NOT NULL"
    )
    await api.push(quiet, "quiet", 1)
    await api.push(late, "old", 1)
    await age_messages(db, quiet, 31)
    await age_messages(db, late, 61)
    await api.push(quiet, "busy", 1)
    await api.push(late, "young", 1)
    wanted = sorted([(plain, "free"), (quiet, "quiet"), (late, "old")])
    hints = {plain: ["free", "leased", "waiting", "done"], quiet: ["quiet", "busy"]}
    hints[late] = ["old", "young"]
    looks: list[tuple[str | None, str, list[str] | None]] = [(None, ns, None)]
    looks += [(q, "", None) for q in (plain, quiet, late)]
    looks += [(q, "", hints[q]) for q in (plain, quiet, late)]
    answers = await trio.to_thread.run_sync(_looks, db.url, looks, False)
    several, one_queue, hinted = answers[0][0], answers[1:4], answers[4:7]
    assert several == wanted
    assert sorted(p for claimed, _ in one_queue for p in claimed) == wanted
    assert sorted(p for claimed, _ in hinted for p in claimed) == wanted


async def test_each_walk_counts_its_spread_by_the_same_rule(api: Api, queue: str, db: Db) -> None:
    """p_spread: a pop claims more than one partition only when at least that many are
    claimable; the leased and the consumed ones do not count."""
    ns = f"ns-{queue}"
    await _namespace(api, ns, (queue, {}))
    names = ["a", "b", "c", "leased", "done"]
    for name in names:
        await api.push(queue, name, 1)
    assert len(await api.messages(queue, "done", autoAck=True)) == 1
    assert len(await api.messages(queue, "leased")) == 1
    looks: list[tuple[str | None, str, list[str] | None]] = [
        (None, ns, None),
        (queue, "", None),
        (queue, "", names),
    ]
    for spread, claimed in ((3, 3), (4, 1), (1, 3)):
        answers = await trio.to_thread.run_sync(_looks, db.url, looks, False, spread)
        assert [len(pairs) for pairs, _ in answers] == [claimed] * 3, spread
        for pairs, _ in answers:
            assert {p for _, p in pairs} <= {"a", "b", "c"}


def _side_by_side(url: str, queue: str) -> tuple[list[str], list[str]]:
    """The partitions two pops of one message each claim while both are open (a wide width,
    a spread of 8): the second pop's walk runs while the first still holds what it locked."""
    with psycopg.connect(url) as first, psycopg.connect(url) as second:
        pop = POP.replace("100, 100, false", "1, 32, false")
        a = first.execute(pop, (queue, "", GROUP, False, None, 8)).fetchall()
        b = second.execute(pop, (queue, "", GROUP, False, None, 8)).fetchall()
        first.rollback()
        second.rollback()
    return [r[2] for r in a], [r[2] for r in b]


async def test_a_pop_whose_first_claim_fills_its_batch_fetches_nothing_ahead(
    api: Api, queue: str, db: Db
) -> None:
    """Candidates are fetched ahead (and locked) only when a second claim may follow: a pop
    filled by its first partition leaves the others free for a pop running beside it."""
    for name in ("a", "b", "c"):
        await api.push(queue, name, 1, 2)
    # a first look makes the group's cursors (a second one would wait for them) and leases one
    status, body = await api.pop(queue, batch=1)
    assert status == 200
    first, second = await trio.to_thread.run_sync(_side_by_side, db.url, queue)
    assert len(first) == 1 and len(second) == 1
    assert sorted(first + second + [body["partition"]]) == ["a", "b", "c"]


async def test_each_ripe_scan_dates_the_same_wait(api: Api, queue: str, db: Db) -> None:
    held, empty = f"{queue}-held", f"{queue}-empty"
    ns = f"ns-{queue}"
    await _namespace(api, ns, (held, {"windowBuffer": 600}), (empty, {}))
    for name in ("leased", "waiting", "loud"):
        await api.push(held, name, 1)
    for name in ("leased", "waiting"):
        await age_messages(db, held, 601)
        assert len(await api.messages(held, name)) == 1
    await _hold(db, held, "waiting", "not_before")
    await db.rows(
        "UPDATE queen.cursors SET lease_expires_at = now() + interval '20 minutes'"
        " WHERE lease_expires_at IS NOT NULL AND not_before IS NULL"
    )
    await api.push(held, "loud", 2)  # quiet in ten minutes: the earliest
    looks = [(None, ns, None), (held, "", None), (held, "", ["leased", "waiting", "loud"])]
    answers = await trio.to_thread.run_sync(_looks, db.url, looks, True)
    assert [claimed for claimed, _ in answers] == [[], [], []]
    [several], [one_queue], [hinted] = (ripe for _, ripe in answers)
    assert several == one_queue == hinted
    assert 590 < several <= 600


def _nested_plans(url: str, queue: str, ns: str, hint: list[str]) -> list[tuple[str, str]]:
    """(query text, plan) of every statement run inside queen.pop for a look at ``queue``
    with ``hint``, one at ``queue`` and one at the namespace ``ns`` (a spread of 2): each
    walk and, as nothing is claimable, each ripe scan."""
    with psycopg.connect(url, autocommit=True) as conn:
        logged = explain_nested(
            conn, "SET auto_explain.log_verbose = on", "SET client_min_messages = log"
        )
        for look in ((queue, "", hint), (queue, "", None), (None, ns, None)):
            for _ in range(2):  # the second: the cached generic plans
                conn.execute("BEGIN")
                conn.execute(POP, (look[0], look[1], GROUP, True, look[2], 2))
                conn.execute("ROLLBACK")
    return [(entry["Query Text"], json.dumps(entry["Plan"])) for entry in logged]


async def test_the_claim_rule_is_written_once_and_inlined_into_every_walk(
    api: Api, queue: str, db: Db
) -> None:
    """Every walk and ripe scan reads queen.cursor_claim (the whole scope's ripe scans through
    queen.group_ripe), and the planner inlines both into each (a SET clause, STRICT, a
    security definer stop that): called once per cursor instead, a
    Function Scan would run the segment look-ups whether their queue option is set or not,
    and the walks would lose the plans they were written for."""
    ns = f"ns-{queue}"
    await _namespace(api, ns, (queue, {"windowBuffer": 30}), (f"{queue}-other", {}))
    await api.push(queue, "p", 1)  # within its window buffer: nothing claimable
    plans = await trio.to_thread.run_sync(_nested_plans, db.url, queue, ns, ["p"])
    reading = ("queen.cursor_claim(", "queen.group_ripe(")
    texts = [text for text, _ in plans if any(f in text for f in reading)]
    readers = [plan for text, plan in plans if any(f in text for f in reading)]
    # three walks and three ripe scans (of the named partitions; queen.group_ripe's, in the
    # walks of one queue and after the walk across queues), each run twice
    assert len(set(texts)) == 6, sorted(set(texts))
    assert sum("queen.group_ripe(" in text for text in texts) == 4
    assert len(readers) == 12
    for plan in readers:
        assert "cursor_claim" not in plan, plan
        assert "group_ripe" not in plan, plan
        assert "segments_pkey" in plan, plan  # the window buffer's look-up, inlined
    [source] = await db.rows(
        "SELECT p.prosrc FROM pg_proc p WHERE p.oid = 'queen.pop(text, text, text, text, text,"
        " integer, integer, boolean, text, timestamptz, uuid, boolean, bigint, text[],"
        " integer)'"
        "::regprocedure"
    )
    for condition in (  # the rule's conditions are queen.cursor_claim's alone
        "lease_expires_at <= now()",
        "not_before <= now()",
        "window_buffer_s = 0",
        "delayed_processing_s = 0",
    ):
        assert condition not in source[0], condition


async def test_the_read_of_a_claimed_partition_inlines_its_slice_of_each_write(
    api: Api, queue: str, db: Db
) -> None:
    """The statement that reads and leases a claimed partition's messages takes each write's
    range from queen.segment_range; inlined, it is a few expressions per segment, where a
    Function Scan would be a call per segment."""
    ns = f"ns-{queue}"
    await _namespace(api, ns, (queue, {}))
    await api.push(queue, "p", *range(5))  # claimable at once: every look reads it
    plans = await trio.to_thread.run_sync(_nested_plans, db.url, queue, ns, ["p"])
    readers = [plan for text, plan in plans if "queen.segment_range(" in text]
    assert len(readers) == 6  # three looks, each twice, each one read
    for plan in readers:
        assert "segment_range" not in plan, plan
        assert "unnest" in plan, plan

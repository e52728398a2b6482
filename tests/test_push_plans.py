"""A push transaction plans nothing once its session has run a few.

``queen.push_frames`` runs on every push transaction; left to choose, PostgreSQL made a custom
plan of its partition lock on every call, a fifth of a small transaction's backend CPU. Here
the server reports every planning (``log_planner_stats``, sent to the client as a notice)
while one session calls the function with batches of several shapes, after a warm-up longer
than the five custom plans PostgreSQL tries before it weighs a generic one."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import trio

from queen import open_broker

CALL = "SELECT statuses, originals FROM queen.push_frames(%s, %s, %s, %s, %s, %s, %s, %s)"


def _count_plannings(url: str, queue: str) -> tuple[int, list[str]]:
    notices: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id"
                " WHERE q.name = %s ORDER BY p.id",
                (queue,),
            )
        ]
        serial = 0

        def call(partitions: int, per: int) -> None:
            nonlocal serial
            count = partitions * per
            txids = [f"plan-{serial + i}" for i in range(count)]
            serial += count
            statuses = conn.execute(
                CALL,
                (
                    ids[:partitions],
                    [per] * partitions,
                    [uuid.uuid4() for _ in range(count)],
                    txids,
                    ['{"n": 1}'] * count,
                    None,
                    None,
                    None,
                ),
                prepare=True,
            ).fetchone()
            assert statuses is not None and statuses[0] == "0" * count  # all stored

        # Fewer than 64 items check the tables' statistics at random: a fixed seed, and a
        # first call of 64 (which always checks) plans that check among the warm-up's.
        conn.execute("SELECT setseed(0.5)")
        call(1, 64)
        shapes = [(1, 1), (3, 2), (1, 5), (3, 1)]
        for _ in range(3):  # 12 calls
            for shape in shapes:
                call(*shape)
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute("SET client_min_messages = log")
        conn.execute("SET log_planner_stats = on")
        for shape in shapes:
            call(*shape)
        conn.execute("SET log_planner_stats = off")
    return sum("PLANNER STATISTICS" in n for n in notices), notices


async def test_push_transactions_plan_nothing_once_warm(settings: Any, queue: str) -> None:
    async with open_broker(settings) as broker:
        await broker.push([{"queue": queue, "partition": f"p{i}", "payload": i} for i in range(3)])
    url = settings.database_url
    plannings, notices = await trio.to_thread.run_sync(_count_plannings, url, queue)
    assert plannings == 0, notices

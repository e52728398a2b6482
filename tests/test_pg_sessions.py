"""What keeps the broker fast on every PostgreSQL version with its default settings: the broker's
sessions run without JIT, no function of its schema steers the planner with ``enable_*``
settings, and tables that outgrew their statistics are analysed, so the plans sessions keep
follow the tables' size. Run on the embedded PostgreSQL 18 and, by ``scripts/test.sh``, on a
PostgreSQL 15 with default settings (``QUEEN_TEST_PG=15``)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import trio
from psycopg.conninfo import make_conninfo

from queen import open_broker
from queen.broker import Broker
from queen.settings import Settings
from queen.storage.pool import ConnectionPool, connection_kwargs
from queen.storage.postgres import PUSH_SQL_PSYCOPG, migrate_sync
from tests.conftest import Db, scratch_database

SEP = "\x1f"
T = TypeVar("T")


def pool_of(broker: Broker) -> ConnectionPool:
    pool = broker.store.pool  # type: ignore[attr-defined]
    assert isinstance(pool, ConnectionPool)
    return pool


def jit_of(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_setting('jit')").fetchone()
    assert row is not None
    return str(row[0])


async def test_every_broker_session_runs_without_jit(broker: Broker) -> None:
    pool = pool_of(broker)
    assert await pool.run(jit_of) == "off"  # calls through a worker thread
    rows = await pool.query("test_jit", b"SELECT current_setting('jit')", [])
    assert rows == [(b"off",)]  # the push path's direct calls
    conn = await trio.to_thread.run_sync(pool.connect_sync)  # as the push listener opens it
    try:
        assert jit_of(conn) == "off"
    finally:
        conn.close()


async def test_options_of_the_database_url_are_kept_beside_the_broker_session_settings(
    settings: Settings,
) -> None:
    url = make_conninfo(settings.database_url or "", options="-c work_mem=7MB")
    async with open_broker(dataclasses.replace(settings, database_url=url)) as b:

        def read(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            return conn.execute(
                "SELECT current_setting('work_mem'), current_setting('jit')"
            ).fetchone()

        assert await pool_of(b).run(read) == ("7MB", "off")


async def test_no_function_of_the_schema_sets_planner_switches(broker: Broker, db: Db) -> None:
    functions = await db.value(
        "SELECT count(*) FROM pg_proc WHERE pronamespace = 'queen'::regnamespace"
    )
    assert functions > 10  # the schema is there
    steering = await db.rows(
        """SELECT p.proname, c FROM pg_proc p CROSS JOIN LATERAL unnest(p.proconfig) AS c
           WHERE p.pronamespace = 'queen'::regnamespace AND c LIKE 'enable%%'"""
    )
    assert steering == []


def _doubling(url: str) -> list[int]:
    """What queen.refresh_statistics answers, and the pages recorded, as a table grows."""
    seen: list[int] = []
    with psycopg.connect(url, autocommit=True) as conn:
        migrate_sync(conn)

        def value(sql: str) -> int:
            row = conn.execute(sql).fetchone()
            assert row is not None
            return int(row[0])

        def step(rows: int) -> None:
            conn.execute(
                f"INSERT INTO queen.growth SELECT g, repeat('x', 200) "
                f"FROM generate_series(1, {rows}) g"
            )
            seen.append(value("SELECT queen.refresh_statistics(ARRAY['queen.growth'::regclass])"))
            seen.append(value("SELECT relpages FROM pg_class WHERE oid = 'queen.growth'::regclass"))

        conn.execute("CREATE TABLE queen.growth (id integer, pad text)")
        conn.execute("ANALYZE queen.growth")  # statistics of an empty table
        seen.append(value("SELECT relpages FROM pg_class WHERE oid = 'queen.growth'::regclass"))
        step(1000)  # about 30 pages
        step(0)  # not grown since
        step(300)  # grown, not doubled
        step(2000)  # more than doubled
    return seen


async def test_a_table_is_analysed_each_time_it_has_doubled_since_its_statistics(
    pg_url: str,
) -> None:
    seen = await trio.to_thread.run_sync(_in_own_database, pg_url, _doubling)
    empty, first, pages, *rest = seen
    assert (empty, first) == (0, 1) and pages >= 8
    assert rest[0:4] == [0, pages, 0, pages]  # not doubled: left alone
    assert rest[4] == 1 and rest[5] >= 2 * pages


def _pushes_before_analysed(url: str) -> dict[int, int]:
    """For pushes of 64 items and of 1: the sidecar grown (by plain inserts) past twice the
    pages its statistics record, how many pushes of that size go by before one analyses it."""
    found: dict[int, int] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        migrate_sync(conn)
        conn.execute("SELECT setseed(0.5)")  # this session's random(): the same every run
        row = conn.execute("SELECT queen.ensure_partition('q', 'p')").fetchone()
        assert row is not None
        pid = int(row[0])
        relpages = "SELECT relpages FROM pg_class WHERE oid = 'queen.dedup'::regclass"
        for frames in (64, 1):
            conn.execute("ANALYZE queen.dedup")
            before = conn.execute(relpages).fetchone()
            assert before is not None
            conn.execute(
                "INSERT INTO queen.dedup (key_hash, partition_id, transaction_id, msg_offset) "
                "SELECT g, 0, 'grown-' || g, g FROM generate_series(1, 4000 + 200 * %s) g",
                (before[0],),
            )
            for pushes in range(1, 1001):
                mids = SEP.join(str(uuid.uuid4()) for _ in range(frames))
                payloads = SEP.join(["{}"] * frames)
                args = (str(pid), str(frames), mids, mids, payloads, None, None, None)
                conn.execute(PUSH_SQL_PSYCOPG, args)
                if conn.execute(relpages).fetchone() != before:
                    found[frames] = pushes
                    break
    return found


async def test_a_push_checks_the_sidecars_statistics_always_when_large_now_and_then_when_small(
    pg_url: str,
) -> None:
    """The check costs a tenth of a small push transaction: a push of 64 items or more makes
    it every time, a smaller one once in 16 at random (so not the first push, nor 1,000)."""
    found = await trio.to_thread.run_sync(_in_own_database, pg_url, _pushes_before_analysed)
    assert found.get(64) == 1, found
    assert 1 < found.get(1, 0) <= 1000, found  # (21 with this seed)


def _grow_after_empty_statistics(url: str) -> list[str]:
    """Statistics taken on empty tables, plans kept by a session while they are tiny, then
    10,000 partitions created and 12,000 frames pushed through that session: the plans of a
    push and of a partition look-up afterwards, as auto_explain reports them."""
    conn = psycopg.connect(url, **connection_kwargs(5, 0, conninfo=url))
    try:
        migrate_sync(conn)
        conn.execute("ANALYZE queen.queues, queen.partitions, queen.segments, queen.dedup")

        def ensure(names: list[str]) -> list[int]:
            row = conn.execute(
                "SELECT queen.ensure_partitions(string_to_array(%s, chr(31)), "
                "string_to_array(%s, chr(31)))",
                (SEP.join(["q"] * len(names)), SEP.join(names)),
            ).fetchone()
            assert row is not None
            return list(row[0])

        def push(pid: int, frames: int = 1) -> None:
            mids = SEP.join(str(uuid.uuid4()) for _ in range(frames))
            conn.execute(
                PUSH_SQL_PSYCOPG,
                (str(pid), str(frames), mids, mids, SEP.join(["{}"] * frames), None, None, None),
            )

        warm = ensure(["w0", "w1"])
        for _ in range(10):  # past the plan cache's five custom plans: the plans are kept
            ensure(["w0", "w1"])
            push(warm[0])
        for b in range(50):
            ids = ensure([f"n{b}-{i}" for i in range(200)])
        for pid in ids[:60]:  # and 12,000 rows in the sidecar
            push(pid, 200)

        plans: list[str] = []
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_nested_statements = on")
        conn.execute("SET auto_explain.log_level = notice")
        push(ids[-1])
        ensure([f"n7-{i}" for i in range(200)])
        return plans
    finally:
        conn.close()


def _in_own_database(pg_url: str, work: Callable[[str], list[T]]) -> list[T]:
    with scratch_database(pg_url, "queen_growth") as url:
        return work(url)


async def test_partitions_and_sidecar_are_read_by_key_after_growing_from_empty_statistics(
    pg_url: str,
) -> None:
    plans = await trio.to_thread.run_sync(_in_own_database, pg_url, _grow_after_empty_statistics)
    text = "\n".join(plans)
    assert "FOR UPDATE OF p" in text and "INSERT INTO queen.partitions" in text
    assert "Seq Scan on partitions" not in text
    assert "partitions_pkey" in text
    assert "Seq Scan on dedup" not in text
    assert "dedup_probe" in text

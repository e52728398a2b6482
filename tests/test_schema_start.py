"""Starting a broker on a database while others push: the schema is applied only when it is
not this build's, and no start (a worker restarted under load, an upgrade) fails a push."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

from queen import open_broker
from queen.broker import Broker
from queen.settings import Settings
from queen.storage.pool import ConnectionPool
from queen.storage.postgres import (
    MIGRATION_LOCK,
    PUSH_SQL_PSYCOPG,
    Migration,
    PgStore,
    SchemaBusy,
    migrate_sync,
    schema_digest,
)
from tests.conftest import Db, scratch_database

# Every catalog row of schema "queen" (functions, triggers, relations) and the transaction
# that last wrote it: applying the schema again rewrites at least every function's row.
CATALOG = """
    SELECT 'function ' || p.oid::regprocedure::text, p.xmin::text FROM pg_proc p
    WHERE p.pronamespace = 'queen'::regnamespace
    UNION ALL
    SELECT 'trigger ' || t.tgname, t.xmin::text FROM pg_trigger t
    JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'queen'::regnamespace
    UNION ALL
    SELECT 'relation ' || c.relname, c.xmin::text FROM pg_class c
    WHERE c.relnamespace = 'queen'::regnamespace
    ORDER BY 1"""

DIGEST = "SELECT value ->> 'digest' FROM queen.system_state WHERE key = 'schema'"
STALE = """UPDATE queen.system_state SET value = '{"digest": "0123456789abcdef"}'
           WHERE key = 'schema'"""


@pytest.fixture
def own_database(pg_url: str) -> Iterator[str]:
    """A new, empty database on the session's server; dropped afterwards."""
    with scratch_database(pg_url, "schema") as url:
        yield url


class Answers:
    """The statuses pushes were answered with, and a way to wait for more of them."""

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter()
        self.grew = trio.Event()

    def add(self, status: str) -> None:
        self.statuses[status] += 1
        self.grew.set()

    async def more(self, n: int = 10) -> None:
        """Return once ``n`` more pushes have been answered (they are flowing)."""
        goal = self.statuses.total() + n
        with trio.fail_after(30):
            while self.statuses.total() < goal:
                self.grew = trio.Event()
                await self.grew.wait()


@asynccontextmanager
async def pushing(broker: Broker, tasks: int = 4) -> AsyncIterator[Answers]:
    """Tasks pushing one item at a time through ``broker`` (each to a queue of its own, over
    four partitions) until the block ends."""
    answers = Answers()
    run = uuid.uuid4().hex[:8]

    async def push(task: int) -> None:
        n = 0
        while True:
            n += 1
            item = {
                "queue": f"load-{run}-{task}",
                "partition": f"p{n % 4}",
                "payload": {"n": n},
                "transactionId": f"{task}-{n}",
            }
            for result in await broker.push([item]):
                answers.add(result.status)

    async with trio.open_nursery() as nursery:
        for task in range(tasks):
            nursery.start_soon(push, task)
        await answers.more()
        try:
            yield answers
            await answers.more()  # pushes still answered after the last start
        finally:
            nursery.cancel_scope.cancel()


async def test_restarts_under_pushes_apply_nothing_and_fail_no_push(
    broker: Broker, settings: Settings, db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    """What a worker restarted under load does, five times: its start finds the schema
    current, changes no catalog row and fails no push, its own or the running broker's."""
    catalog = await db.rows(CATALOG)
    recorded = await db.rows(
        "SELECT value, updated_at FROM queen.system_state WHERE key = 'schema'"
    )
    async with pushing(broker) as answers:
        for start in range(5):
            await answers.more()
            async with open_broker(settings) as restarted:
                item = {"queue": f"restarted-{uuid.uuid4().hex[:8]}", "payload": start}
                assert [r.status for r in await restarted.push([item])] == ["queued"]
    assert set(answers.statuses) == {"queued"}, answers.statuses
    assert [r.getMessage() for r in caplog.records if "deadlock" in r.getMessage()] == []
    assert await db.rows(CATALOG) == catalog, "a start with the schema current applied it"
    assert (
        await db.rows("SELECT value, updated_at FROM queen.system_state WHERE key = 'schema'")
        == recorded
    )


def _hold_a_push(
    url: str, partition_id: int, holding: threading.Event, done: threading.Event
) -> None:
    """One push to ``partition_id`` in a transaction left open (so it keeps every lock a
    push takes) until ``done``."""
    with psycopg.connect(url) as conn:
        mid = str(uuid.uuid4())
        row = conn.execute(
            PUSH_SQL_PSYCOPG, (str(partition_id), "1", mid, mid, "{}", None, None, None)
        ).fetchone()
        assert row is not None and row[0] == "0"
        holding.set()
        done.wait(60)
        conn.rollback()


async def test_a_start_waits_for_no_lock_a_push_holds(
    broker: Broker, settings: Settings, db: Db, pg_url: str, queue: str
) -> None:
    assert [r.status for r in await broker.push([{"queue": queue, "payload": 0}])] == ["queued"]
    partition_id = await db.value(
        """SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
           WHERE q.name = %s""",
        queue,
    )
    holding, done = threading.Event(), threading.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: trio.to_thread.run_sync(_hold_a_push, pg_url, partition_id, holding, done)
        )
        try:
            await trio.to_thread.run_sync(holding.wait, 30)
            # a statement waiting for the push's locks would be cancelled after 2 s
            quick = settings.with_changes(db_statement_timeout_ms=2_000)
            with trio.fail_after(30):
                async with open_broker(quick) as restarted:
                    item = {"queue": f"{queue}-other", "payload": 1}
                    assert [r.status for r in await restarted.push([item])] == ["queued"]
        finally:
            done.set()


def _push_in_ack_transaction(url: str, ready: threading.Event, go: threading.Event) -> str:
    """A transaction as an ack-and-push one takes its locks: cursor rows first (here only the
    table's lock), then a push. Returns the push's statuses; commits."""
    with psycopg.connect(url, options="-c statement_timeout=20000") as conn:
        row = conn.execute(
            "SELECT queen.ensure_partitions(ARRAY['upgrade'], ARRAY['p'])"
        ).fetchone()
        assert row is not None
        conn.commit()
        conn.execute("UPDATE queen.cursors SET acked = acked WHERE false")
        ready.set()
        go.wait(30)
        mid = str(uuid.uuid4())
        pushed = conn.execute(
            PUSH_SQL_PSYCOPG, (str(row[0][0]), "1", mid, mid, "{}", None, None, None)
        ).fetchone()
        assert pushed is not None
        conn.commit()
        return str(pushed[0])


def _waiting_for_a_lock(url: str, pid: int) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)", (pid,)
        ).fetchone() == (True,)


def test_an_upgrade_does_not_deadlock_with_a_transaction_that_pushes(own_database: str) -> None:
    """A stale schema is migrated while a transaction holding cursor rows pushes: the
    migration waits for it without holding what its push needs, then applies the schema."""
    with psycopg.connect(own_database, autocommit=True) as conn:
        migrate_sync(conn)
        conn.execute(STALE)
    ready, go = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def transaction() -> None:
        try:
            results["push"] = _push_in_ack_transaction(own_database, ready, go)
        except BaseException as exc:
            results["push"] = exc
            raise

    def migration(conn: psycopg.Connection[Any]) -> None:
        try:
            results["migration"] = migrate_sync(conn)
        except BaseException as exc:
            results["migration"] = exc
            raise

    with psycopg.connect(own_database, autocommit=True) as migrating:
        pid = migrating.info.backend_pid
        threads = [
            threading.Thread(target=transaction),
            threading.Thread(target=migration, args=(migrating,)),
        ]
        threads[0].start()
        assert ready.wait(30)
        threads[1].start()
        deadline = time.monotonic() + 30
        while not _waiting_for_a_lock(own_database, pid):  # for the transaction's
            assert time.monotonic() < deadline and threads[1].is_alive(), results
            time.sleep(0.005)
        go.set()  # its push, then its commit
        for thread in threads:
            thread.join(60)
    assert results == {"push": "0", "migration": Migration.APPLIED}
    with psycopg.connect(own_database, autocommit=True) as conn:
        assert conn.execute(DIGEST).fetchone() == (schema_digest(),)


async def test_an_upgrade_held_up_by_a_long_transaction_gives_up_changing_nothing(
    own_database: str,
) -> None:
    """A transaction that keeps a table of the schema locked: the broker's migration tries
    again and again, then gives up with a clear error; the schema is left as it was, and the
    transaction goes on."""
    db = Db(own_database)
    with psycopg.connect(own_database, autocommit=True) as conn:
        migrate_sync(conn)
        conn.execute(STALE)
    catalog = await db.rows(CATALOG)
    pool = ConnectionPool(own_database, size=2, connect_timeout_s=5, statement_timeout_ms=30_000)
    try:
        with psycopg.connect(own_database) as long:
            long.execute("LOCK TABLE queen.retention_totals IN ROW EXCLUSIVE MODE")
            started = trio.current_time()
            with pytest.raises(SchemaBusy, match="stayed locked by other transactions for 2 s"):
                await PgStore(pool).migrate(give_up_s=2)
            assert trio.current_time() - started < 5
            long.execute("SELECT count(*) FROM queen.queues").fetchone()
            long.rollback()
        assert await db.rows(CATALOG) == catalog
        assert await db.value(DIGEST) == "0123456789abcdef"
        assert await PgStore(pool).migrate() is Migration.APPLIED  # once it has ended
    finally:
        await pool.aclose()


async def test_upgrades_under_pushes_apply_the_schema_and_fail_no_push(
    own_database: str, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Five starts of a broker, each finding the schema stale (an upgrade while another
    broker pushes): each applies the schema and records its digest; no push fails and every
    start comes up."""
    settings = Settings(
        database_url=own_database,
        file_buffer_dir=str(tmp_path / "spool"),
        db_pool_size=6,
        write_concurrency=2,
    )
    db = Db(own_database)
    applied = []
    async with open_broker(settings) as broker, pushing(broker) as answers:
        for _ in range(5):
            catalog = await db.rows(CATALOG)
            await db.rows(STALE)
            async with open_broker(settings):
                pass
            applied.append(await db.rows(CATALOG) != catalog)
            assert await db.value(DIGEST) == schema_digest()
    assert applied == [True] * 5, "each start applied the schema"
    assert set(answers.statuses) == {"queued"}, answers.statuses
    # a push transaction that met a deadlock says so, even when retrying it alone succeeded
    assert [r.getMessage() for r in caplog.records if "deadlock" in r.getMessage()] == []


async def test_two_brokers_starting_together_on_an_empty_database_both_come_up(
    own_database: str, tmp_path: Any
) -> None:
    """Both wait for the migration's lock; the first applies the schema, the second then finds
    it current and applies nothing."""
    db = Db(own_database)
    waiting = """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
    up = {"first": trio.Event(), "second": trio.Event()}

    async def start(name: str, hold: trio.Event) -> None:
        settings = Settings(database_url=own_database, file_buffer_dir=str(tmp_path / name))
        async with open_broker(settings) as broker:
            assert [r.status for r in await broker.push([{"queue": name, "payload": 1}])] == [
                "queued"
            ]
            up[name].set()
            await hold.wait()

    with psycopg.connect(own_database, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        hold = trio.Event()
        async with trio.open_nursery() as nursery:
            for name in up:
                nursery.start_soon(start, name, hold)
            with trio.fail_after(30):
                while await db.value(waiting) < 2:  # noqa: ASYNC110 (a state of the server)
                    await trio.sleep(0.005)
            gate.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
            with trio.fail_after(30):
                for started in up.values():
                    await started.wait()
            hold.set()
    writers = {xmin for _, xmin in await db.rows(CATALOG)}
    assert len(writers) == 1, "the schema was applied by one transaction, once"
    assert await db.value(DIGEST) == schema_digest()

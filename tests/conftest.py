"""Shared fixtures: one embedded PostgreSQL for the session, a broker per test, an HTTP client.

Set QUEEN_TEST_DATABASE_URL to run the suite against another PostgreSQL server instead, or
QUEEN_TEST_PG to a major version (``15``: the binaries of Debian's ``postgresql-15`` package,
``/usr/lib/postgresql/15/bin``) or to a directory of server binaries: the session then starts
that server in a temporary directory with PostgreSQL's default settings (``jit`` on), as an
operator's server would run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from psycopg.conninfo import make_conninfo

from queen import open_broker
from queen.broker import Broker
from queen.http.app import create_app
from queen.settings import ORIGINAL_NAMES, Settings
from queen.storage.embedded import EmbeddedPostgres

pytest_plugins = ("tests.hang_guard",)

# A `queen serve` a test starts is one process unless the test asks for more (`queen serve`
# alone runs one per core: tests/test_workers.py checks that default).
os.environ.setdefault("QUEEN_WORKERS", "1")
# The original broker's names for our settings (HOST, PORT, RETENTION_INTERVAL, ...) are read
# where ours are unset; whatever the machine exports under them is not the tests' setting.
for _variable, _to_ours, _unit in ORIGINAL_NAMES.values():
    os.environ.pop(_variable, None)

# A harness may start the suite with SIGINT ignored (a background job of a non-interactive shell)
# or blocked (a supervisor that reads its signals from a signalfd). Children inherit both, and a
# child that cannot hear SIGINT cannot stand for a command at a terminal, as the Ctrl-C tests'
# children do. So SIGINT is unblocked here, and handled (a handler, unlike SIG_IGN, is not
# inherited across exec: children start with the default and Python installs its own).
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

FIRST = "test_hypercorn_contract.py"
"""Run before the rest: after an upgrade of Hypercorn, h11 or Quart-Trio it says which
assumption of the serving code broke before the serving tests fail for it."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name != FIRST)  # (a stable sort: the rest keep order)


TEST_SERVER_OPTIONS = {
    # The suite does not survive power loss, so it does not pay for it: no fsync. Commits stay
    # synchronous (the WAL reaches the kernel before a commit is acknowledged), so a crashed or
    # immediately stopped server keeps every acknowledged commit, as the fault tests require.
    "fsync": "off",
    "full_page_writes": "off",
}


@contextlib.contextmanager
def embedded_pg_dir() -> Iterator[Path]:
    """A data directory for an embedded server, outside pytest's temporary tree: the server
    runs as another user, which must be able to reach it whatever pytest does to its own
    directories (another pytest session on the machine resets their permissions)."""
    path = Path(tempfile.mkdtemp(prefix="queen-test-pg-"))
    try:
        yield path / "data"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def installed_server_bin_dir(wanted: str) -> Path:
    """The binaries QUEEN_TEST_PG names: a major version or a directory."""
    path = Path(wanted) if "/" in wanted else Path(f"/usr/lib/postgresql/{wanted}/bin")
    if not (path / "pg_ctl").exists():
        pytest.fail(
            f"QUEEN_TEST_PG={wanted}: no PostgreSQL server binaries in {path} "
            f"(Debian: apt-get install postgresql-{wanted})",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres | None]:
    if os.environ.get("QUEEN_TEST_DATABASE_URL"):
        yield None
        return
    wanted = os.environ.get("QUEEN_TEST_PG", "")
    with embedded_pg_dir() as data:
        if wanted:
            server = EmbeddedPostgres(data, bin_dir=installed_server_bin_dir(wanted), tuned=False)
        else:
            server = EmbeddedPostgres(data, server_options=TEST_SERVER_OPTIONS)
        server.start()
        try:
            yield server
        finally:
            server.stop("immediate")


@contextlib.contextmanager
def scratch_database(pg_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database on the server of ``pg_url`` (its conninfo), named ``prefix_...``;
    dropped afterwards, its sessions ended."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(pg_url, dbname=name)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_url(pg_server: EmbeddedPostgres | None) -> str:
    if pg_server is None:
        return os.environ["QUEEN_TEST_DATABASE_URL"]
    return pg_server.conninfo


@pytest.fixture
def settings(pg_url: str, tmp_path: Any) -> Settings:
    return Settings(
        database_url=pg_url,
        file_buffer_dir=str(tmp_path / "spool"),
        db_pool_size=6,
        write_concurrency=2,
        shutdown_grace_s=5,
    )


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    async with open_broker(settings) as b:
        yield b


@pytest.fixture
def client(broker: Broker) -> Any:
    return create_app(broker).test_client()


@pytest.fixture
def queue() -> str:
    """A queue name no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


class Db:
    """Read the broker's tables from tests (through a worker thread, like the broker)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    async def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return await trio.to_thread.run_sync(self._query, sql, params)

    async def value(self, sql: str, *params: Any) -> Any:
        rows = await self.rows(sql, *params)
        return rows[0][0] if rows else None

    async def frames(self, queue: str, partition: str) -> list[dict[str, Any]]:
        """Every stored frame of one partition, in offset order."""
        rows = await self.rows(
            """
            SELECT s.first_offset + u.i - 1 AS off, s.first_offset, u.mid::text, u.tx,
                   u.payload, u.sub, u.trace::text
            FROM queen.segments s
            JOIN queen.partitions p ON p.id = s.partition_id
            JOIN queen.queues q ON q.id = p.queue_id
            CROSS JOIN LATERAL unnest(s.message_ids, s.transaction_ids, s.payloads,
                                      coalesce(s.producer_subs, '{}'::text[]),
                                      coalesce(s.trace_ids, '{}'::uuid[]))
                 WITH ORDINALITY AS u(mid, tx, payload, sub, trace, i)
            WHERE q.name = %s AND p.name = %s
            ORDER BY off
            """,
            queue,
            partition,
        )
        keys = ("offset", "segment", "message_id", "transaction_id", "payload", "sub", "trace")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    async def count_frames(self, queue_like: str = "%") -> int:
        return int(
            await self.value(
                """SELECT coalesce(sum(s.last_offset - s.first_offset + 1), 0)
                   FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id WHERE q.name LIKE %s""",
                queue_like,
            )
        )


@pytest.fixture
def db(pg_url: str) -> Db:
    return Db(pg_url)


@pytest.fixture
def api(client: Any) -> Any:
    """The HTTP routes in the official client's shapes (tests/consuming.py)."""
    from tests.consuming import Api

    return Api(client)


@pytest.fixture
def need_browser() -> None:
    """Fails (never skips) a browser test on a machine without Chromium and its driver,
    saying what to install."""
    from tests import browser

    problem = browser.missing()
    if problem is not None:
        pytest.fail(problem)

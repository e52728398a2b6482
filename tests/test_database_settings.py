"""Which database the broker uses: ``DATABASE_URL``, the original broker's ``PG_*`` settings,
and a database that already holds the original broker's schema."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from queen.server import serve
from queen.settings import Settings
from queen.storage.database import external_database, pg_settings_url
from tests.procs import queen_without_embedded_extra


def pg_settings(pg_url: str) -> dict[str, Any]:
    """The test server's connection as the ``PG_*`` settings."""
    parts = conninfo_to_dict(pg_url)
    return {
        "pg_host": str(parts["host"]),
        "pg_port": int(parts.get("port") or 5432),
        "pg_user": str(parts.get("user") or "postgres"),
        "pg_password": str(parts.get("password") or "postgres"),
        "pg_db": str(parts.get("dbname") or "postgres"),
    }


def test_pg_settings_are_read_from_the_original_variables() -> None:
    env = {
        "PG_HOST": "db.internal",
        "PG_PORT": "6543",
        "PG_USER": "app",
        "PG_PASSWORD": "s3cret",
        "PG_DB": "queen",
    }
    settings = Settings.from_env(env)
    chosen = external_database(settings)
    assert chosen is not None
    url, description = chosen
    assert url == "postgresql://app:s3cret@db.internal:6543/queen"
    assert "s3cret" not in description
    assert (
        description
        == "postgresql://app:***@db.internal:6543/queen (PG_HOST, PG_PORT, PG_USER, PG_DB)"
    )
    defaults = Settings.from_env({"PG_HOST": "db"})  # the original's defaults
    assert pg_settings_url(defaults) == "postgresql://postgres:postgres@db:5432/postgres"


def test_database_url_wins_over_pg_host_and_neither_means_embedded() -> None:
    both = Settings.from_env({"DATABASE_URL": "postgresql://u@h/d", "PG_HOST": "other"})
    assert external_database(both) == (
        "postgresql://u@h/d",
        "postgresql://u@h/d (DATABASE_URL; PG_HOST ignored)",
    )
    assert external_database(Settings.from_env({})) is None
    assert external_database(Settings.from_env({"PG_HOST": ""})) is None  # empty means unset


def test_pg_settings_url_quotes_what_a_url_cannot_hold() -> None:
    settings = Settings(
        pg_host="/run/postgresql", pg_user="a@b", pg_password="p:w/d@x", pg_db="my db"
    )
    url = pg_settings_url(settings)
    assert url == "postgresql://a%40b:p%3Aw%2Fd%40x@%2Frun%2Fpostgresql:5432/my%20db"
    parts = conninfo_to_dict(url)
    assert (parts["host"], parts["user"], parts["password"], parts["dbname"]) == (
        "/run/postgresql",
        "a@b",
        "p:w/d@x",
        "my db",
    )
    assert pg_settings_url(Settings(pg_host="::1")).startswith(
        "postgresql://postgres:postgres@[::1]:5432/"
    )


async def test_serve_with_pg_settings_uses_that_database_and_says_so(
    pg_url: str, tmp_path: Any, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queen.server")
    settings = Settings(
        host="127.0.0.1",
        port=0,
        file_buffer_dir=str(tmp_path / "spool"),
        db_pool_size=4,
        write_concurrency=2,
        **pg_settings(pg_url),
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            resp = await http.post(
                "/api/v1/push", json={"items": [{"queue": queue, "payload": {"n": 1}}]}
            )
            assert resp.status_code == 201 and resp.json()[0]["status"] == "queued"
        nursery.cancel_scope.cancel()
    with psycopg.connect(pg_url) as conn:  # the push landed in the database PG_* named
        row = conn.execute(
            "SELECT count(*) FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id"
            " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s",
            (queue,),
        ).fetchone()
    assert row == (1,)
    started = [r.getMessage() for r in caplog.records if "listening on" in r.getMessage()]
    assert started and "(PG_HOST, PG_PORT, PG_USER, PG_DB)" in started[0]
    assert f"@{pg_settings_url(settings).split('@', 1)[1]}" in started[0]


@pytest.fixture
async def foreign_db(pg_url: str) -> AsyncIterator[str]:
    """A fresh database holding a table of the original broker's schema (own minimal DDL)."""
    name = f"foreign_{uuid.uuid4().hex[:10]}"

    def admin(sql: str) -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql)

    await trio.to_thread.run_sync(admin, f"CREATE DATABASE {name}")
    url = make_conninfo(pg_url, dbname=name)
    try:

        def original_schema() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE SCHEMA queen")
                conn.execute(
                    "CREATE TABLE queen.queues (id uuid PRIMARY KEY, name varchar(255) UNIQUE)"
                )
                conn.execute(
                    "CREATE TABLE queen.partition_consumers (id uuid PRIMARY KEY, "
                    "partition_id uuid NOT NULL, consumer_group varchar(255), "
                    "last_consumed_id uuid)"
                )

        await trio.to_thread.run_sync(original_schema)
        yield url
    finally:
        await trio.to_thread.run_sync(admin, f"DROP DATABASE {name} WITH (FORCE)")


async def test_the_original_brokers_schema_stops_queen_serve_with_a_clear_message(
    foreign_db: str, tmp_path: Any
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QUEEN_", "PG_"))}
    env.update(DATABASE_URL=foreign_db, FILE_BUFFER_DIR=str(tmp_path / "spool"))
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "queen.cli", "serve", "--host", "127.0.0.1", "--port", "0"],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "original Queen broker" in err and "queen.partition_consumers" in err
    assert "another database" in err
    assert "Traceback" not in err

    def tables() -> list[str]:
        with psycopg.connect(foreign_db) as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'queen' ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    assert await trio.to_thread.run_sync(tables) == ["partition_consumers", "queues"]


def test_without_a_database_setting_or_the_embedded_extra_serve_names_the_extra(
    tmp_path: Path,
) -> None:
    """An install without the ``embedded`` extra and no database setting: ``queen serve``
    says what to install or set, in one line, exits 2 and makes nothing (no data directory,
    no spool directory)."""
    done = queen_without_embedded_extra("serve", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "queen-trio[embedded]" in done.stderr and "DATABASE_URL" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []

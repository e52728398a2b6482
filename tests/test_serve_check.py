"""``queen serve --check`` and ``queen --version``, run as an operator runs them, over real
databases: one to create, one up to date, one to migrate, one of the original broker, none."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import psycopg
import pytest

from queen.storage.embedded import EmbeddedPostgres
from queen.storage.postgres import SchemaState, migrate_sync, schema_state
from tests.conftest import embedded_pg_dir, scratch_database
from tests.ctl_env import closed_port, environ
from tests.procs import queen_without_embedded_extra


def check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``queen serve --check`` run from ``tmp_path`` (this tree's package, whatever the cwd)."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "PG_HOST", "QUEEN_PG_DATA_DIR", "FILE_BUFFER_DIR")
    }
    return subprocess.run(
        [sys.executable, "-m", "queen", "serve", "--check"],
        env={
            "FILE_BUFFER_DIR": str(tmp_path / "spool"),
            **base,
            "PYTHONPATH": environ()["PYTHONPATH"],
            **env,
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def marks(out: str) -> dict[str, str]:
    """``{check name: "ok" | "FAIL"}`` from the printed lines."""
    found = {}
    for line in out.splitlines():
        mark, _, rest = line.partition("  ")
        if mark.strip() in ("ok", "FAIL"):
            found[rest.split()[0]] = mark.strip()
    return found


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    """A new, empty database on the session's server; dropped afterwards."""
    with scratch_database(pg_url, "check") as url:
        yield url


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "queen", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, f"queen {version('queen-trio')}\n")


def test_an_empty_database_would_get_the_schema(tmp_path: Path, database: str) -> None:
    done = check(tmp_path, DATABASE_URL=database)
    assert done.returncode == 0, done.stdout + done.stderr
    assert marks(done.stdout) == {
        "settings": "ok",
        "authentication": "ok",
        "database": "ok",
        "schema": "ok",
        "spool": "ok",
    }
    assert 'no schema "queen" yet: queen serve will create it' in done.stdout
    assert done.stdout.rstrip().endswith("every check passed")
    with psycopg.connect(database) as conn:  # the check changed nothing
        assert schema_state(conn)[0] is SchemaState.ABSENT
    assert not (tmp_path / "spool").exists()


def test_a_migrated_database_is_up_to_date_and_a_changed_one_would_migrate(
    tmp_path: Path, database: str
) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        migrate_sync(conn)
    done = check(tmp_path, DATABASE_URL=database)
    assert done.returncode == 0, done.stdout
    assert "schema         up to date" in done.stdout

    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            'UPDATE queen.system_state SET value = \'{"digest": "0123456789abcdef"}\' '
            "WHERE key = 'schema'"
        )
    done = check(tmp_path, DATABASE_URL=database)
    assert done.returncode == 0
    assert "would migrate: the database has schema 0123456789abcdef" in done.stdout
    with psycopg.connect(database, autocommit=True) as conn:
        migrate_sync(conn)  # what queen serve does at start
        assert schema_state(conn)[0] is SchemaState.CURRENT


def test_the_original_brokers_schema_is_refused(tmp_path: Path, database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA queen; CREATE TABLE queen.messages (id uuid)")
    done = check(tmp_path, DATABASE_URL=database)
    assert done.returncode == 1
    assert marks(done.stdout)["schema"] == "FAIL"
    assert "schema of the original Queen broker" in done.stdout
    assert done.stdout.rstrip().endswith("failed: schema")


def test_an_unreachable_database_and_an_unwritable_spool_fail(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = check(
        tmp_path,
        DATABASE_URL=f"postgresql://queen@127.0.0.1:{closed_port()}/queen",
        QUEEN_DB_CONNECT_TIMEOUT_S="2",
        FILE_BUFFER_DIR=str(blocker / "spool"),
    )
    assert done.returncode == 1
    found = marks(done.stdout)
    assert (found["database"], found["spool"]) == ("FAIL", "FAIL")
    assert "schema" not in found  # not checked without a database
    assert "Connection refused" in done.stdout
    assert done.stdout.rstrip().endswith("failed: database, spool")


def test_a_bad_setting_fails_the_settings_check(tmp_path: Path) -> None:
    done = check(tmp_path, QUEEN_ENCRYPTION_KEY="not-hex")
    assert done.returncode == 1
    assert marks(done.stdout) == {"settings": "FAIL"}
    assert "QUEEN_ENCRYPTION_KEY" in done.stdout
    done = check(tmp_path, JWT_ENABLED="true", JWT_ALGORITHM="RS256")
    assert done.returncode == 1
    assert marks(done.stdout)["authentication"] == "FAIL"


def test_without_a_database_setting_or_the_embedded_extra_the_check_names_the_extra(
    tmp_path: Path,
) -> None:
    done = queen_without_embedded_extra("serve", "--check", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert marks(done.stdout)["database"] == "FAIL"
    assert "queen-trio[embedded]" in done.stdout and "Traceback" not in done.stderr


def test_a_bad_flag_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "queen", "serve", "--check", "--port", "abc"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "QUEEN_PORT='abc' is not a valid int" in done.stderr


@pytest.mark.timeout(180)
def test_the_embedded_server_is_not_left_running(tmp_path: Path) -> None:
    with embedded_pg_dir() as data:
        done = check(tmp_path, QUEEN_PG_DATA_DIR=str(data))
        assert done.returncode == 0, done.stdout
        assert "no data directory at" in done.stdout and "will initialise it" in done.stdout
        assert not data.exists()  # nothing initialised

        server = EmbeddedPostgres(data)
        server.start()
        server.stop()
        done = check(tmp_path, QUEEN_PG_DATA_DIR=str(data))
        assert done.returncode == 0, done.stdout
        assert "(started for the check, stopped after it)" in done.stdout
        assert 'no schema "queen" yet' in done.stdout
        assert not EmbeddedPostgres(data).is_running()


def test_the_package_loads_the_broker_only_when_asked() -> None:
    code = (
        "import sys, queen\n"
        "assert 'queen.broker' not in sys.modules\n"
        "assert sorted(queen.__all__) == sorted(queen._EXPORTS)\n"
        "for name in queen.__all__: getattr(queen, name)\n"
        "assert 'queen.broker' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr

"""The real server (Hypercorn over a socket), the command line, and database outages."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from queen import open_broker
from queen.cli import shown_default
from queen.server import StartupError, check_spool_dir, serve
from queen.settings import Settings, describe
from queen.storage.embedded import EmbeddedPostgres
from tests.conftest import TEST_SERVER_OPTIONS, Db, embedded_pg_dir


async def test_serve_over_a_real_socket(
    settings: Settings, queue: str, db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queen.server")
    settings = settings.with_changes(host="127.0.0.1", port=0, max_body_bytes=4096)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base) as http:
            health = await http.get("/health")
            assert health.status_code == 200
            assert health.json()["status"] == "healthy"
            assert health.json()["database"] == "connected"

            resp = await http.post(
                "/api/v1/push",
                json={
                    "items": [
                        {
                            "queue": queue,
                            "partition": "p",
                            "payload": {"n": 1},
                            "transactionId": "a",
                        }
                    ]
                },
            )
            assert resp.status_code == 201
            assert resp.json()[0]["status"] == "queued"

            big = b'{"items": [{"queue": "q", "payload": "' + b"x" * 8000 + b'"}]}'
            too_big = await http.post(
                "/api/v1/push", content=big, headers={"content-type": "application/json"}
            )
            assert too_big.status_code == 413
            assert "error" in too_big.json()

            async def chunks() -> Any:
                for _ in range(10):
                    yield b" " * 1000  # no Content-Length: the limit applies while reading

            chunked = await http.post(
                "/api/v1/push", content=chunks(), headers={"content-type": "application/json"}
            )
            assert chunked.status_code == 413

            metrics = await http.get("/metrics")
            assert "queen_push_transactions_total 1" in metrics.text
        nursery.cancel_scope.cancel()
    assert len(await db.frames(queue, "p")) == 1
    started = [r.getMessage() for r in caplog.records if "listening on" in r.getMessage()]
    assert started and f":{port}" in started[0]
    assert "database:" in started[0] and f"spool: {settings.file_buffer_dir}" in started[0]


def test_spool_dir_that_cannot_be_created_names_the_variable(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StartupError, match="FILE_BUFFER_DIR"):
        check_spool_dir(Settings(file_buffer_dir=str(blocker / "buffers")))


def test_help_lists_every_setting_with_env_and_default() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "queen.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    flat = " ".join(out.split())
    for name, env, _kind, default, _help in describe():
        assert "--" + name.replace("_", "-") in flat
        assert f"env {env};" in flat
        assert f"default {shown_default(default)}]" in flat


SETTINGS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


def _documented_defaults(page: str) -> dict[str, str]:
    """``variable -> default`` from the rows of the settings page's tables: a row names one or
    more variables (backquoted, comma-separated) in its first cell and their defaults, in the
    same order, in its second."""
    found: dict[str, str] = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        variables = [v.strip().strip("`") for v in cells[0].split(",")]
        defaults = [d.strip().strip("`") for d in cells[1].split(", ")]
        found.update(zip(variables, defaults, strict=True))
    return found


def _as_documented(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, float):
        return f"{default:g}"
    return str(default) if default != "" else "(none)"


def test_the_settings_page_documents_every_setting_with_its_default() -> None:
    documented = _documented_defaults(SETTINGS_PAGE.read_text())
    missing = [env for _n, env, _k, _d, _h in describe() if env not in documented]
    assert missing == [], "settings absent from docs/settings.md"
    wrong = {
        env: (documented[env], _as_documented(default))
        for _n, env, _k, default, _h in describe()
        if documented[env] != _as_documented(default)
    }
    assert wrong == {}, "docs/settings.md gives another default (page, code)"
    known = {env for _n, env, _k, _d, _h in describe()}
    assert sorted(set(documented) - known) == [], "docs/settings.md names unknown settings"


def test_the_settings_page_reader() -> None:
    page = (
        "| variable | default | meaning |\n|---|---|---|\n"
        "| `A`, `B` | `x`, 5 | two |\n| `C` | unset | one |\n| `D` | `/a,/b` | paths |\n"
    )
    assert _documented_defaults(page) == {"A": "x", "B": "5", "C": "unset", "D": "/a,/b"}
    assert [_as_documented(v) for v in (None, False, 2.0, 0.05, 10, "")] == [
        "unset",
        "false",
        "2",
        "0.05",
        "10",
        "(none)",
    ]


def test_settings_from_env_and_overrides() -> None:
    env = {"QUEEN_MAX_BODY_BYTES": "1024", "FILE_BUFFER_DIR": "/x", "QUEEN_PORT": "7000"}
    settings = Settings.from_env(env, port=7001)
    assert settings.max_body_bytes == 1024
    assert settings.file_buffer_dir == "/x"
    assert settings.port == 7001
    assert Settings.from_env({}).max_body_bytes == 64 * 1024 * 1024
    with pytest.raises(ValueError, match="QUEEN_MAX_BODY_BYTES"):
        Settings.from_env({"QUEEN_MAX_BODY_BYTES": "lots"})
    with pytest.raises(ValueError, match="QUEEN_DB_POOL_SIZE"):
        Settings.from_env({"QUEEN_DB_POOL_SIZE": "0"})
    with pytest.raises(ValueError, match="larger than QUEEN_WRITE_CONCURRENCY"):
        Settings.from_env({"QUEEN_DB_POOL_SIZE": "4", "QUEEN_WRITE_CONCURRENCY": "4"})


def test_the_original_brokers_variables_are_read_where_ours_are_unset() -> None:
    original = {
        "HOST": "127.0.0.2",
        "PORT": "7100",
        "LOG_LEVEL": "warn",
        "RETENTION_INTERVAL": "2000",  # ms
        "RETENTION_BATCH_SIZE": "50",
        "DB_CONNECTION_TIMEOUT": "1500",  # ms
        "DB_STATEMENT_TIMEOUT": "9000",
        "DB_TCP_USER_TIMEOUT_MS": "8000",
    }
    settings = Settings.from_env(original)
    assert (settings.host, settings.port, settings.log_level) == ("127.0.0.2", 7100, "warning")
    assert (settings.retention_interval_s, settings.retention_batch_limit) == (2.0, 50)
    assert settings.db_connect_timeout_s == 1.5
    assert (settings.db_statement_timeout_ms, settings.db_tcp_user_timeout_ms) == (9000, 8000)
    ours = Settings.from_env({**original, "QUEEN_PORT": "7200", "QUEEN_RETENTION_INTERVAL_S": "3"})
    assert (ours.port, ours.retention_interval_s) == (7200, 3.0)  # ours wins
    assert Settings.from_env(original, port=7300).port == 7300  # and a flag over both
    with pytest.raises(ValueError, match=r"RETENTION_INTERVAL='soon' .*QUEEN_RETENTION_INTERVAL_S"):
        Settings.from_env({"RETENTION_INTERVAL": "soon"})
    assert Settings.from_env({"NUM_WORKERS": "10", "DB_POOL_SIZE": "150"}) == Settings.from_env({})


def test_connection_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="QUEEN_MAX_DECODING_BYTES must be at least"):
        Settings.from_env({"QUEEN_MAX_BODY_BYTES": "2048", "QUEEN_MAX_DECODING_BYTES": "1024"})
    with pytest.raises(ValueError, match="QUEEN_HEADER_TIMEOUT_S must be > 0"):
        Settings.from_env({"QUEEN_HEADER_TIMEOUT_S": "0"})
    with pytest.raises(ValueError, match="QUEEN_KEEP_ALIVE_TIMEOUT_S must be > 0"):
        Settings.from_env({"QUEEN_KEEP_ALIVE_TIMEOUT_S": "0"})
    settings = Settings.from_env(
        {"QUEEN_MAX_DECODING_BYTES": "200000000", "QUEEN_HEADER_TIMEOUT_S": "2.5"}
    )
    assert settings.max_decoding_bytes == 200_000_000
    assert settings.header_timeout_s == 2.5


def test_settings_read_the_jwt_variables() -> None:
    env = {
        "JWT_ENABLED": "true",
        "JWT_SECRET": "sekrit",
        "JWT_CLOCK_SKEW": "5",
        "JWT_ISSUER": "https://idp",
        "JWT_SKIP_PATHS": "/health",
        "JWT_JWKS_REFRESH_INTERVAL": "60",
        "JWT_JWKS_TIMEOUT_MS": "250",
    }
    s = Settings.from_env(env)
    assert s.jwt_enabled is True
    assert (s.jwt_secret, s.jwt_clock_skew_s, s.jwt_issuer) == ("sekrit", 5, "https://idp")
    assert (s.jwt_jwks_refresh_interval_s, s.jwt_jwks_timeout_ms) == (60, 250)
    assert s.jwt_skip_paths == "/health"
    defaults = Settings.from_env({})
    assert defaults.jwt_enabled is False and defaults.jwt_algorithm == "HS256"
    assert defaults.jwt_secret is None and defaults.jwt_audience is None
    assert (
        defaults.jwt_clock_skew_s == 30
        and defaults.jwt_skip_paths == "/health,/metrics,/metrics/prometheus,/"
    )
    assert (defaults.jwt_jwks_refresh_interval_s, defaults.jwt_jwks_timeout_ms) == (3600, 5000)
    assert Settings.from_env({"JWT_ENABLED": "false"}).jwt_enabled is False
    assert Settings.from_env({"JWT_ENABLED": ""}).jwt_enabled is False  # empty means unset


@pytest.mark.parametrize("raw", ["1", "TRUE", "True", "yes", "on"])
def test_jwt_enabled_is_true_or_false_exactly(raw: str) -> None:
    with pytest.raises(ValueError, match="JWT_ENABLED"):
        Settings.from_env({"JWT_ENABLED": raw})


async def test_health_and_pushes_follow_the_database(tmp_path: Any) -> None:
    """Stop PostgreSQL under a running broker: /health says 503, pushes answer ``buffered`` at
    once, and when PostgreSQL is back the broker recovers by itself and replays them."""
    with embedded_pg_dir() as data:
        await _outage_round_trip(
            EmbeddedPostgres(data, server_options=TEST_SERVER_OPTIONS), tmp_path
        )


async def _outage_round_trip(server: EmbeddedPostgres, tmp_path: Any) -> None:
    url = await trio.to_thread.run_sync(server.start)
    settings = Settings(database_url=url, file_buffer_dir=str(tmp_path / "spool"))
    try:
        async with open_broker(settings) as broker:
            first = await broker.push([{"queue": "outage", "payload": 1, "transactionId": "a"}])
            assert first[0].status == "queued"
            assert (await broker.health()).healthy

            await trio.to_thread.run_sync(server.stop, "fast")
            report = await broker.health()
            assert not report.healthy and report.status == "unhealthy"
            with trio.fail_after(10):  # bounded: no long TCP timeout
                down = await broker.push([{"queue": "outage", "payload": 2, "transactionId": "b"}])
            assert down[0].status == "buffered"
            assert broker.spool is not None and broker.spool.index.total == 1

            await trio.to_thread.run_sync(server.start)
            assert (await broker.health()).healthy
            with trio.fail_after(30):
                await broker.wait_spool_empty()
            back = await broker.push([{"queue": "outage", "payload": 2, "transactionId": "b"}])
            assert back[0].status == "duplicate"
            assert back[0].message_id == down[0].message_id
            again = await broker.push([{"queue": "outage", "payload": 1, "transactionId": "a"}])
            assert again[0].status == "duplicate"
            assert again[0].message_id == first[0].message_id
    finally:
        await trio.to_thread.run_sync(server.stop, "immediate")


def test_switch_flags_take_true_or_false() -> None:
    import click

    from queen.cli import serve_command

    def flags(*args: str) -> dict[str, Any]:
        return serve_command.make_context("serve", list(args)).params

    given = flags("--jwt-enabled", "true", "--jwt-clock-skew-s", "7")
    assert given["jwt_enabled"] is True and given["jwt_clock_skew_s"] == 7
    assert flags("--jwt-enabled", "false")["jwt_enabled"] is False
    with pytest.raises(click.BadParameter, match="JWT_ENABLED='yes' must be true or false"):
        flags("--jwt-enabled", "yes")


def test_gc_tuning_freezes_and_raises_the_young_threshold() -> None:
    import gc

    from queen.server import tune_gc

    before = gc.get_threshold()
    try:
        tune_gc(0)
        assert gc.get_threshold() == before  # 0: Python's defaults stay
        tune_gc(40_000)
        assert gc.get_threshold() == (40_000, 5, 400)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

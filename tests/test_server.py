"""The real server (Hypercorn over a socket), the command line, and database outages."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import httpx
import pytest
import trio

from queen import open_broker
from queen.server import StartupError, check_spool_dir, serve
from queen.settings import Settings, describe
from queen.storage.embedded import EmbeddedPostgres
from tests.conftest import TEST_SERVER_OPTIONS, Db


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
        shown = "(unset)" if default is None else str(default)
        assert f"default {shown}]" in flat


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


async def test_health_and_pushes_follow_the_database(tmp_path: Any, pg_dir: Any) -> None:
    """Stop PostgreSQL under a running broker: /health says 503, pushes answer at once without
    storing anything, and when PostgreSQL is back the broker recovers by itself."""
    server = EmbeddedPostgres(pg_dir / "pg", server_options=TEST_SERVER_OPTIONS)
    url = await trio.to_thread.run_sync(server.start)
    settings = Settings(database_url=url, file_buffer_dir=str(tmp_path / "spool"))
    try:
        async with open_broker(settings) as broker:
            first = await broker.push([{"queue": "outage", "payload": 1, "transactionId": "a"}])
            assert first[0]["status"] == "queued"
            assert (await broker.health())[0]

            await trio.to_thread.run_sync(server.stop, "fast")
            healthy, body = await broker.health()
            assert not healthy and body["database"] == "disconnected"
            with trio.fail_after(10):  # bounded: no long TCP timeout
                down = await broker.push([{"queue": "outage", "payload": 2, "transactionId": "b"}])
            assert down[0]["status"] == "failed"

            await trio.to_thread.run_sync(server.start)
            assert (await broker.health())[0]
            back = await broker.push([{"queue": "outage", "payload": 2, "transactionId": "b"}])
            assert back[0]["status"] == "queued"
            again = await broker.push([{"queue": "outage", "payload": 1, "transactionId": "a"}])
            assert again[0]["status"] == "duplicate"
            assert again[0]["message_id"] == first[0]["message_id"]
    finally:
        await trio.to_thread.run_sync(server.stop, "immediate")

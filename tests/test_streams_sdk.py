"""The official Streams SDK (queen-mq 2.6.0), unchanged, against a real broker socket.

Each test starts ``queen.server.serve`` on a free port and runs one flow of
``tests/streams_flows.py`` in the client's own virtualenv, then checks what the SDK produced
and what the database holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from queen.server import serve
from queen.settings import Settings
from tests.client_env import ensure_client_python
from tests.conftest import Db

FLOWS = Path(__file__).with_name("streams_flows.py")


@pytest.fixture(scope="session")
def client_python() -> Path:
    return ensure_client_python()


@pytest.fixture
def flow(client_python: Path, settings: Settings, queue: str, tmp_path: Path) -> Any:
    async def run(name: str) -> dict[str, Any]:
        served = settings.with_changes(host="127.0.0.1", port=0)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve, served)
            env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
            with trio.fail_after(120):
                done = await trio.run_process(
                    [str(client_python), "-I", str(FLOWS), name, f"http://127.0.0.1:{port}", queue],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    cwd=tmp_path,
                    env=env,
                )
            nursery.cancel_scope.cancel()
        out = done.stdout.decode()
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, f"{out}\n{done.stderr.decode()}"
        result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
        return result

    return run


async def test_tumbling_counts_survive_a_restart_without_double_counting(
    flow: Any, queue: str, db: Db
) -> None:
    r = await flow("tumbling")
    assert sum(r["expected"].values()) == r["total"] == 3000
    assert r["observed"] == r["expected"]
    assert r["windows_emitted_twice"] == []
    assert 0 < r["first_run_messages"] < r["total"]  # the restart came mid-stream
    assert r["errors"] == 0
    # every source message is acked by the query's group; its open windows stay in state
    pending = await db.value(
        "SELECT sum(p.next_offset - c.next_offset) FROM queen.cursors c "
        "JOIN queen.partitions p ON p.id = c.partition_id "
        "JOIN queen.queues q ON q.id = p.queue_id "
        "WHERE q.name = %s AND c.consumer_group = %s",
        f"{queue}-src",
        f"streams.{queue}-query",
    )
    assert pending == 0
    open_windows = await db.value(
        "SELECT count(*) FROM queen_streams.state s JOIN queen_streams.queries q "
        "ON q.id = s.query_id WHERE q.name = %s AND s.key LIKE 'tumb:%%'",
        f"{queue}-query",
    )
    assert open_windows == 4  # the window of each partition's last event


async def test_session_windows_close_on_the_gap(flow: Any) -> None:
    r = await flow("session")
    assert r["observed"] == {p: [list(s) for s in v] for p, v in r["expected"].items()}
    assert len(r["observed"]["u0"]) == 3 and len(r["observed"]["u1"]) == 3
    assert r["errors"] == 0


async def test_a_changed_operator_chain_is_refused_unless_reset(flow: Any) -> None:
    r = await flow("config_hash")
    assert r["refused"] is True and r["error_type"] == "StreamsConfigHashMismatch"
    assert "config_hash mismatch" in r["error"]
    assert r["reset_accepted"] is True

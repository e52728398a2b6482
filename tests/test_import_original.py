"""``queen import`` of a database the original Queen server itself wrote, checked with the
official client (tests/import_original.py does the work and says what it checked). Runs where
the original is built (bench/peer_run.py says where it looks); skipped, saying so, elsewhere. The
self-contained import tests are tests/test_import.py."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from bench.peer_run import missing
from tests.client_env import ensure_client_python

ROOT = Path(__file__).resolve().parent.parent
WHY_NOT = missing()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(
    WHY_NOT is not None, reason=f"the original Queen server is needed for this test: {WHY_NOT}"
)
async def test_import_of_a_database_the_original_wrote() -> None:
    # Outside pytest's tree: the embedded server runs as a user of its own.
    workdir = Path(tempfile.mkdtemp(prefix="queen-import-original-"))
    try:
        await _check(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _check(workdir: Path) -> None:
    env = {**os.environ, "QUEEN_CLIENT_PYTHON": str(ensure_client_python())}
    done = await trio.run_process(
        [sys.executable, "-m", "tests.import_original", "--workdir", str(workdir)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
        cwd=str(ROOT),
    )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()[-2000:]
    assert "imported 20100 messages of 3 queues" in out
    assert "second run" in out and "imported 0 messages" in out
    assert "every group resumed where it was" in out

"""The suite's hang guard (tests/hang_guard.py): a hung test fails alone, quickly, and the
session goes on. Run in a pytest of its own, with this project's configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parent.parent

HUNG = """
import pytest
import trio

from queen.metrics import Metrics
from queen.model import PartitionKey
from queen.spool.format import SpoolRecord
from queen.spool.index import SpoolIndex
from queen.spool.writer import SpoolWriter


@pytest.mark.timeout(1)
async def test_an_append_never_answered(tmp_path, monkeypatch):
    async def never(self, chunk):
        await trio.sleep_forever()

    monkeypatch.setattr(SpoolWriter, "_write_chunk", never)
    writer = SpoolWriter(tmp_path, SpoolIndex(), Metrics(), group_max_records=8,
                         file_max_bytes=1 << 20, file_max_age_s=3600)
    mid = "0190c7e0-0000-7000-8000-000000000001"
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.append([SpoolRecord(PartitionKey("q", "p"), 0, [mid], ["t"], [b"1"])])


@pytest.mark.timeout(1)
async def test_hung_on_virtual_time(autojump_clock):
    await trio.Event().wait()


async def test_the_next_one():
    await trio.sleep(0)
"""


@pytest.mark.timeout(120)
def test_a_hung_test_fails_alone_and_the_session_goes_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_hung=HUNG)
    pytester.makeconftest('pytest_plugins = ("tests.hang_guard",)\n')
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--rootdir={pytester.path}")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*Failed: Timeout: the test ran past 1.0 s"])
    assert "in append" in result.stdout.str()  # the stacks show where it hung

"""The original broker's dashboard (its Vue app) against this broker, in headless Chromium:
every page of it loads and shows its figures, with no console error, no failed request to
the broker and nothing its policy refused.

The app is not ours and is in no package registry: ``scripts/original-dashboard.sh
APP_SOURCE`` builds it from a checkout of the original's ``app/`` folder (npm, cached) and runs
this test with ``QUEEN_ORIGINAL_APP`` naming the build; without it the test is skipped.
``QUEEN_ORIGINAL_APP_SHOTS`` names a directory for a screenshot of every page.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from queen.server import serve
from queen.settings import Settings
from tests import original_app

pytestmark = pytest.mark.slow

BUILT = os.environ.get("QUEEN_ORIGINAL_APP")
SHOTS = os.environ.get("QUEEN_ORIGINAL_APP_SHOTS")


@pytest.mark.skipif(
    not BUILT,
    reason="QUEEN_ORIGINAL_APP names no build of the original's app "
    "(scripts/original-dashboard.sh builds it and runs this test)",
)
@pytest.mark.timeout(330)
async def test_every_page_of_the_original_app_loads_clean(
    need_browser: None, settings: Settings
) -> None:
    settings = settings.with_changes(host="127.0.0.1", port=0, webapp_root=BUILT)
    shots = Path(SHOTS) if SHOTS else None
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        base = f"http://127.0.0.1:{port}"
        await trio.to_thread.run_sync(original_app.seed, base)
        # the app leaves out the minute still filling: its per-minute charts (the queue
        # operations' leaders among them) need the seeding's minute complete
        await trio.to_thread.run_sync(original_app.settle_minute, base)
        with trio.fail_after(200):
            reports = await trio.to_thread.run_sync(original_app.walk, base, shots)
        nursery.cancel_scope.cancel()
    problems = {
        r.page.name: {
            "ready": r.showed_ready_text,
            "console": r.console_errors,
            "requests": r.failed_requests,
            "policy": r.policy_violations,
        }
        for r in reports
        if not (r.clean and r.showed_ready_text)
    }
    assert [r.page.name for r in reports] == [p.name for p in original_app.PAGES]
    assert problems == {}

"""A consumer group's page in a real browser (Debian's Chromium through Selenium): the groups
list links to it; "Seek to time" sends the time typed into the page (read as UTC) and refuses
to send nothing; after a seek to before every message the group's lag is the whole queue again.
Screenshot: ``tests/artifacts/screenshots/group.png``."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from queen.server import serve
from queen.settings import Settings
from tests import browser
from tests.test_dashboard_actions_browser import click, toast
from tests.test_dashboard_browser import call, view_loaded, wait_for

pytestmark = pytest.mark.slow


def consume_all(base: str, queue: str) -> None:
    items = [{"queue": queue, "partition": f"p{n % 3}", "payload": {"n": n}} for n in range(6)]
    call(base, "POST", "/api/v1/push", {"items": items})
    while popped := call(
        base, "GET", f"/api/v1/pop/queue/{queue}?batch=10&wait=false&consumerGroup=g-{queue}"
    ):
        for m in popped["messages"]:
            ack = {
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "leaseId": m["leaseId"],
                "status": "completed",
                "consumerGroup": f"g-{queue}",
            }
            call(base, "POST", "/api/v1/ack", ack)


def lag(base: str, queue: str) -> int:
    detail = call(base, "GET", f"/api/v1/consumer-groups/g-{queue}")
    return int(detail[queue]["totalLag"])


def run_group_page(base: str, queue: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    browser.SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with browser.chromium() as driver:
        driver.get(f"{base}/#/groups?queue={queue}")
        wait_for(driver, view_loaded(f"/groups?queue={queue}"), "the groups page")
        driver.find_element("css selector", f"#main a[href='#/group/g-{queue}']").click()
        wait_for(driver, view_loaded(f"/group/g-{queue}"), "the group's page")
        seek = "#main button[data-fields='timestamp']"
        click(driver, seek, accept=True)  # nothing typed yet
        out["empty"] = toast(driver)
        out["lag_before"] = lag(base, queue)
        driver.execute_script(
            "document.querySelector(\"#main input[name='timestamp']\").value = arguments[0];",
            "2020-01-01T00:00",
        )
        out["confirm"] = click(driver, seek, accept=True)
        out["toast"] = toast(driver)
        out["lag_after"] = lag(base, queue)
        wait_for(driver, view_loaded(f"/group/g-{queue}"), "the page again")
        driver.save_screenshot(str(browser.SCREENSHOTS / "group.png"))
        out["errors"] = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        out["refused"] = browser.policy_violations(driver)
    return out


async def test_a_group_seeks_to_a_time_typed_into_its_page(
    need_browser: None, settings: Settings, queue: str
) -> None:
    settings = settings.with_changes(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        base = f"http://127.0.0.1:{port}"
        await trio.to_thread.run_sync(consume_all, base, queue)
        with trio.fail_after(120):
            out = await trio.to_thread.run_sync(run_group_page, base, queue)
        nursery.cancel_scope.cancel()
    assert out["empty"] == "fill in timestamp first"
    assert out["lag_before"] == 0
    assert out["confirm"].startswith(f"Move g-{queue} on {queue} to the time given (UTC)?")
    assert not out["toast"].startswith("4")  # not refused
    assert out["lag_after"] == 6  # back before every message: all due again
    assert out["errors"] == []
    assert out["refused"] == []

"""The dashboard's actions on dead letters, messages and queues in a real browser (Debian's
Chromium through Selenium): each button asks for a confirmation, does nothing when it is
declined, and calls the API when it is accepted; and with authentication on, the page says why
a token was refused and which role an action needs. Screenshots go to
``tests/artifacts/screenshots/`` (``dlq-actions.png``, ``message-actions.png``,
``queue-actions.png``, ``sign-in-expired.png``, ``action-refused.png``)."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
import trio

from queen.server import serve
from queen.settings import Settings
from tests import browser
from tests.test_dashboard_browser import call, view_loaded, wait_for

pytestmark = pytest.mark.slow


def seed_dead_letters(base: str, queue: str, token: str | None = None) -> str:
    """Four messages in one partition, the first two in queue mode's DLQ; their partition id."""
    items = [
        {"queue": queue, "partition": "p", "transactionId": f"tx-{n}", "payload": {"n": n}}
        for n in range(4)
    ]
    call(base, "POST", "/api/v1/push", {"items": items}, token)
    pid = ""
    for _ in range(2):
        popped = call(base, "GET", f"/api/v1/pop/queue/{queue}?batch=1&wait=false", None, token)
        m = popped["messages"][0]
        pid = m["partitionId"]
        ack = {
            "transactionId": m["transactionId"],
            "partitionId": pid,
            "leaseId": m["leaseId"],
            "status": "dlq",
            "error": "bad input",
        }
        call(base, "POST", "/api/v1/ack", ack, token)
    return pid


def dlq_total(base: str, queue: str, token: str | None = None) -> int:
    return int(call(base, "GET", f"/api/v1/dlq?queue={queue}", None, token)["total"])


def toast(driver: Any) -> str:
    return str(
        wait_for(
            driver,
            lambda d: d.execute_script(
                "var t = document.getElementById('toast');"
                "return t.style.display === 'block' ? t.textContent : null;"
            ),
            "a toast",
        )
    )


def click(driver: Any, selector: str, *, accept: bool) -> str:
    """Click the button, answer its confirmation; the confirmation's text."""
    driver.execute_script(
        "var t = document.getElementById('toast'); t.style.display = 'none'; t.textContent = '';"
    )
    wait_for(driver, lambda d: d.find_elements("css selector", selector), selector)
    driver.find_element("css selector", selector).click()
    alert = wait_for(driver, lambda d: d.switch_to.alert, "the confirmation")
    text = str(alert.text)
    if accept:
        alert.accept()
    else:
        alert.dismiss()
    return text


def run_actions(base: str, queue: str, pid: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    browser.SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with browser.chromium() as driver:
        driver.get(f"{base}/#/dlq?queue={queue}")
        wait_for(driver, view_loaded(f"/dlq?queue={queue}"), "the DLQ page")
        driver.save_screenshot(str(browser.SCREENSHOTS / "dlq-actions.png"))
        retry_one = "#main td.actions button:not(.danger)"
        out["declined"] = click(driver, retry_one, accept=False)
        out["after_declining"] = dlq_total(base, queue)
        out["retry_confirm"] = click(driver, retry_one, accept=True)
        out["retry_toast"] = toast(driver)
        out["after_retry"] = dlq_total(base, queue)

        wait_for(driver, lambda d: d.find_elements("id", "retry-all"), "the retry-all button")
        out["retry_all_confirm"] = click(driver, "#retry-all", accept=True)
        out["retry_all_toast"] = toast(driver)
        out["after_retry_all"] = dlq_total(base, queue)

        driver.get(f"{base}/#/message/{pid}/tx-3")
        wait_for(driver, view_loaded(f"/message/{pid}/tx-3"), "the message page")
        driver.save_screenshot(str(browser.SCREENSHOTS / "message-actions.png"))
        out["dlq_confirm"] = click(driver, "#main button[data-action$='/dlq']", accept=True)
        out["dlq_toast"] = toast(driver)
        out["after_move"] = dlq_total(base, queue)

        driver.get(f"{base}/#/queue/{queue}")
        wait_for(driver, view_loaded(f"/queue/{queue}"), "the queue page")
        driver.save_screenshot(str(browser.SCREENSHOTS / "queue-actions.png"))
        out["clear_confirm"] = click(driver, "#clear-queue", accept=True)
        out["clear_toast"] = toast(driver)
        out["errors"] = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        out["refused"] = browser.policy_violations(driver)
    return out


async def test_dead_letter_message_and_queue_actions_ask_first(
    need_browser: None, settings: Settings, queue: str
) -> None:
    settings = settings.with_changes(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        base = f"http://127.0.0.1:{port}"
        pid = await trio.to_thread.run_sync(seed_dead_letters, base, queue)
        with trio.fail_after(180):
            out = await trio.to_thread.run_sync(run_actions, base, queue, pid)
        popped = await trio.to_thread.run_sync(
            call, base, "GET", f"/api/v1/pop/queue/{queue}?batch=10&wait=false"
        )
        nursery.cancel_scope.cancel()
    assert out["declined"].startswith("Deliver tx-")
    assert out["after_declining"] == 2  # declined: nothing happened
    assert out["after_retry"] == 1 and out["retry_toast"] == "Delivered again"
    assert out["retry_all_confirm"].startswith(f"Deliver all 1 dead letters of {queue}")
    assert (out["after_retry_all"], out["retry_all_toast"]) == (0, "1 dead letter delivered again")
    assert out["dlq_confirm"].startswith("Move tx-3 to queue mode's dead letter queue")
    assert out["after_move"] == 1
    assert out["dlq_toast"] == "Moved to the dead letter queue of __QUEUE_MODE__"
    assert out["clear_confirm"].startswith(f"Remove every message stored in {queue}")
    assert out["clear_toast"].endswith(f"removed from {queue}")
    assert popped is None  # cleared: nothing left to pop
    assert out["errors"] == []
    assert out["refused"] == []


def run_refusals(base: str, expired: str, reader: str, queue: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with browser.chromium() as driver:
        driver.get(f"{base}/#/overview")
        wait_for(driver, lambda d: d.find_element("id", "login").is_displayed(), "the form")
        driver.find_element("id", "token").send_keys(expired)
        driver.find_element("css selector", "#login button").click()
        out["expired"] = wait_for(
            driver,
            lambda d: (t := d.find_element("id", "login-why").text) and "refused" in t and t,
            "the reason",
        )
        driver.save_screenshot(str(browser.SCREENSHOTS / "sign-in-expired.png"))
        driver.find_element("id", "token").send_keys(reader)
        driver.find_element("css selector", "#login button").click()
        wait_for(driver, view_loaded("/overview"), "overview with a read token")
        driver.get(f"{base}/#/dlq?queue={queue}")
        wait_for(driver, view_loaded(f"/dlq?queue={queue}"), "the DLQ page")
        click(driver, "#main td.actions button:not(.danger)", accept=True)
        out["refused"] = toast(driver)
        driver.save_screenshot(str(browser.SCREENSHOTS / "action-refused.png"))
    return out


async def test_the_page_says_why_a_token_or_an_action_is_refused(
    need_browser: None, settings: Settings, queue: str
) -> None:
    secret = "dashboard-secret-" + "x" * 16
    settings = settings.with_changes(host="127.0.0.1", port=0, jwt_enabled=True, jwt_secret=secret)
    now = int(time.time())
    expired = jwt.encode(
        {"sub": "ops", "roles": ["admin"], "iat": now - 7200, "exp": now - 3600},
        secret,
        algorithm="HS256",
    )
    reader = jwt.encode({"sub": "viewer", "roles": ["read", "write"]}, secret, algorithm="HS256")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        base = f"http://127.0.0.1:{port}"
        await trio.to_thread.run_sync(seed_dead_letters, base, queue, reader)
        with trio.fail_after(120):
            out = await trio.to_thread.run_sync(run_refusals, base, expired, reader, queue)
        left = await trio.to_thread.run_sync(dlq_total, base, queue, reader)
        nursery.cancel_scope.cancel()
    assert out["expired"] == "The token was refused: Token has expired. Paste another one."
    assert out["refused"] == "403: Insufficient permissions (needs the admin role)"
    assert left == 2

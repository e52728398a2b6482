"""The dashboard in a real browser (Debian's Chromium, headless, through Selenium): every page
loads without a console error, the overview shows a queue pushed here, a message opens in the
viewer, and with authentication on the page asks for a token and then works with it. A
screenshot of every page goes to ``tests/artifacts/screenshots/`` for a person to look at.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import jwt
import pytest
import trio

from queen.server import serve
from queen.settings import Settings
from tests import browser

pytestmark = pytest.mark.slow

PAGES = (
    "overview?search={q}",  # (the suite's other queues may push it off the first page)
    "queue/{q}",
    "messages?queue={q}",
    "dlq",
    "groups",
    "traces?name=trace-{q}",
    "system",
)


def call(base: str, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read()
        return json.loads(text) if text else None


def seed(base: str, queue: str, token: str | None = None) -> None:
    items = [
        {"queue": queue, "partition": f"p{n % 3}", "transactionId": f"tx-{n}", "payload": {"n": n}}
        for n in range(12)
    ]
    call(base, "POST", "/api/v1/push", {"items": items}, token)
    popped = call(
        base, "GET", f"/api/v1/pop/queue/{queue}?batch=2&wait=false&consumerGroup=g1", None, token
    )
    first = popped["messages"][0]
    trace = {
        "transactionId": first["transactionId"],
        "partitionId": first["partitionId"],
        "consumerGroup": "g1",
        "eventType": "processed",
        "traceNames": f"trace-{queue}",
        "data": {"step": 1},
    }
    call(base, "POST", "/api/v1/traces", trace, token)


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 20, poll_frequency=0.1).until(condition, message=what)


def view_loaded(route: str) -> Callable[[Any], str | None]:
    """The heading of the view of ``route`` (``/overview``...), once the page's script has put
    it in place (read in one script call: the view is replaced as it refreshes)."""

    def heading(driver: Any) -> str | None:
        text = driver.execute_script(
            "var m = document.getElementById('main');"
            "if (m.dataset.route !== arguments[0]) { return null; }"
            "var e = m.querySelector('h1, .error-box');"
            "return e ? e.textContent.trim() : null;",
            route,
        )
        return str(text) if text else None

    return heading


def main_text(driver: Any) -> str:
    return str(driver.execute_script("return document.getElementById('main').innerText;"))


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def run_pages(base: str, queue: str) -> dict[str, Any]:
    out: dict[str, Any] = {"errors": {}, "headings": {}, "refused": {}}
    browser.SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with browser.chromium() as driver:
        for page in PAGES:
            hash_path = page.format(q=queue)
            driver.get(f"{base}/#/{hash_path}")
            heading = wait_for(driver, view_loaded("/" + hash_path), f"view {page}")
            out["headings"][page] = heading
            name = page.split("?")[0].split("/")[0]
            driver.save_screenshot(str(browser.SCREENSHOTS / f"{name}.png"))
            out["errors"][page] = console_errors(driver)
            out["refused"][page] = browser.policy_violations(driver)
            if page.startswith("overview"):
                out["overview_text"] = main_text(driver)
            if page.startswith("traces"):
                out["traces_text"] = main_text(driver)
        # Open a message from the browser's list.
        driver.get(f"{base}/#/messages?queue={queue}&partition=p1")
        wait_for(driver, view_loaded(f"/messages?queue={queue}&partition=p1"), "message list")
        out["opened"] = wait_for(
            driver,
            lambda d: d.execute_script(
                "var a = document.querySelector(\"#main a[href^='#/message/']\");"
                "if (!a) { return null; } var t = a.textContent; a.click(); return t;"
            ),
            "a message link",
        )
        payload = wait_for(
            driver,
            lambda d: d.execute_script(
                "var e = document.getElementById('payload'); return e ? e.textContent : null;"
            ),
            "the viewer",
        )
        out["payload"] = json.loads(payload)
        driver.save_screenshot(str(browser.SCREENSHOTS / "message.png"))
        out["errors"]["message"] = console_errors(driver)
        out["refused"]["message"] = browser.policy_violations(driver)
        # The view refreshes itself: a push shows up on the overview without a reload. (The
        # page is narrowed to this test's queues: the session's database holds many more.)
        driver.get(f"{base}/#/overview?search={queue}")
        wait_for(driver, view_loaded(f"/overview?search={queue}"), "overview")
        call(base, "POST", "/api/v1/push", {"items": [{"queue": f"{queue}-late", "payload": 1}]})
        wait_for(driver, lambda d: f"{queue}-late" in main_text(d), "refresh")
        out["refreshed"] = True
    return out


async def test_every_page_loads_and_a_message_opens(
    need_browser: None, settings: Settings, queue: str
) -> None:
    settings = settings.with_changes(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        base = f"http://127.0.0.1:{port}"
        await trio.to_thread.run_sync(seed, base, queue)
        with trio.fail_after(180):
            out = await trio.to_thread.run_sync(run_pages, base, queue)
        nursery.cancel_scope.cancel()
    assert out["errors"] == {page: [] for page in (*PAGES, "message")}
    assert out["refused"] == {page: [] for page in (*PAGES, "message")}
    assert out["headings"]["overview?search={q}"] == "Overview"
    assert out["headings"]["queue/{q}"] == f"Queue {queue}"
    assert queue in out["overview_text"]
    assert f"trace-{queue}" in out["traces_text"] and "processed" in out["traces_text"]
    assert out["opened"].startswith("tx-")
    assert out["payload"] == {"n": int(out["opened"].removeprefix("tx-"))}
    assert out["refreshed"]


def run_with_token(base: str, token: str) -> dict[str, Any]:
    with browser.chromium() as driver:
        driver.get(f"{base}/#/overview")
        form = wait_for(
            driver, lambda d: d.find_element("id", "login").is_displayed(), "the token form"
        )
        driver.save_screenshot(str(browser.SCREENSHOTS / "sign-in.png"))
        driver.find_element("id", "token").send_keys(token)
        driver.find_element("css selector", "#login button").click()
        heading = wait_for(driver, view_loaded("/overview"), "overview after signing in")
        return {"form": form, "heading": heading}


async def test_with_authentication_the_page_asks_for_a_token(
    need_browser: None, settings: Settings, queue: str
) -> None:
    secret = "dashboard-secret-" + "x" * 16
    settings = settings.with_changes(host="127.0.0.1", port=0, jwt_enabled=True, jwt_secret=secret)
    token = jwt.encode({"sub": "ops", "roles": ["read-only"]}, secret, algorithm="HS256")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        base = f"http://127.0.0.1:{port}"
        with trio.fail_after(120):
            out = await trio.to_thread.run_sync(run_with_token, base, token)
        nursery.cancel_scope.cancel()
    assert out == {"form": True, "heading": "Overview"}


HOSTILE = "<img src=x onerror=\"window.__ran = 'handler'\">"


def run_hostile(base: str) -> dict[str, Any]:
    """A view opened straight from a link that names markup, then the same markup put into the
    page by a script: neither runs."""
    out: dict[str, Any] = {}
    with browser.chromium() as driver:
        driver.get(f"{base}/dashboard/view/group/{quote(HOSTILE, safe='')}")
        out["direct_text"] = driver.execute_script("return document.body.textContent;")
        out["direct_ran"] = driver.execute_script("return window.__ran || null;")
        driver.get(f"{base}/#/group/{quote(HOSTILE, safe='')}")
        out["shown"] = wait_for(
            driver, view_loaded(f"/group/{quote(HOSTILE, safe='')}"), "the 404 in the page"
        )
        driver.execute_script(
            "document.getElementById('main').insertAdjacentHTML('beforeend', arguments[0]);",
            HOSTILE,
        )
        ran = "return window.__ran || null;"
        wait_for(
            driver,
            lambda d: browser.policy_violations(d) or d.execute_script(ran),
            "the policy's refusal (or the handler)",
        )
        out["refused"] = browser.policy_violations(driver)
        out["injected_ran"] = driver.execute_script(ran)
    return out


async def test_markup_in_a_url_never_runs_in_the_dashboard(
    need_browser: None, settings: Settings
) -> None:
    settings = settings.with_changes(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        with trio.fail_after(120):
            out = await trio.to_thread.run_sync(run_hostile, f"http://127.0.0.1:{port}")
        nursery.cancel_scope.cancel()
    # escaped: the markup is text, on the view alone and inside the page
    assert out["direct_text"] == f"consumer group {HOSTILE} does not exist"
    assert out["direct_ran"] is None
    assert out["shown"] == f"404: consumer group {HOSTILE} does not exist"
    # and had some reached the page as markup, its policy refuses inline handlers
    assert out["refused"] == ["script-src-attr inline"]
    assert out["injected_ran"] is None

"""The dashboard's refresh in a real browser (Debian's Chromium through Selenium): a tab put in
the background stops its refresh timer and asks for no view until it is shown again, when it
loads the view at once and starts the timer again; a page left (another URL in the tab) stops
it too, and coming back starts one.

What the page does is recorded by a script run before the page's own (DevTools' scripts are
exempt from the page's policy): every refresh timer set or cleared (an interval of the page's
refresh period), every view asked for, and the page's visibility and page events, in order,
kept in the tab's ``sessionStorage`` so that the record outlives a page that is left."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from queen.server import serve
from queen.settings import Settings
from tests import browser
from tests.test_dashboard_browser import view_loaded, wait_for

pytestmark = pytest.mark.slow

_RECORD = """
(function () {
  function note(what) {
    try {
      var kept = JSON.parse(sessionStorage.getItem("__refreshRecord") || "[]");
      kept.push([what, document.visibilityState]);
      sessionStorage.setItem("__refreshRecord", JSON.stringify(kept));
    } catch (e) { /* a document without storage (about:blank) */ }
  }
  function period() { return Number(document.body && document.body.dataset.refreshMs); }
  var live = {}, setI = window.setInterval, clearI = window.clearInterval, get = window.fetch;
  window.setInterval = function (fn, ms) {
    var id = setI.apply(window, arguments);
    if (ms === period()) { live[id] = true; note("set"); }
    return id;
  };
  window.clearInterval = function (id) {
    if (live[id]) { delete live[id]; note("clear"); }
    return clearI.apply(window, arguments);
  };
  window.fetch = function (url) {
    if (String(url).indexOf("/dashboard/view/") === 0) { note("view"); }
    return get.apply(window, arguments);
  };
  window.__liveRefreshTimers = function () { return Object.keys(live).length; };
  document.addEventListener("visibilitychange", function () { note("visibilitychange"); });
  window.addEventListener("pagehide", function () { note("pagehide"); });
})();
"""


def record(driver: Any) -> list[list[str]]:
    found = driver.execute_script("return sessionStorage.getItem('__refreshRecord') || '[]';")
    return list(json.loads(found))


def since(events: list[list[str]], what: str, state: str) -> list[list[str]]:
    """The events from the last ``what`` seen in ``state`` on."""
    marks = [i for i, e in enumerate(events) if e == [what, state]]
    assert marks, f"no {what} ({state}) in {events}"
    return events[marks[-1] :]


def run_refresh(base: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with browser.chromium() as driver:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _RECORD})
        driver.get(f"{base}/#/overview")
        wait_for(driver, view_loaded("/overview"), "the overview")
        out["timers_shown"] = driver.execute_script("return window.__liveRefreshTimers();")
        dashboard = driver.current_window_handle
        # Another tab in front: the dashboard's is hidden.
        driver.switch_to.new_window("tab")
        driver.get("about:blank")
        other = driver.current_window_handle
        # Back to the dashboard's tab: shown again.
        driver.switch_to.window(dashboard)
        wait_for(
            driver,
            lambda d: ["view", "visible"] in since(record(d), "visibilitychange", "visible")[1:],
            "a view asked for on return",
        )
        out["hidden_and_back"] = since(record(driver), "visibilitychange", "hidden")
        out["timers_back"] = driver.execute_script("return window.__liveRefreshTimers();")
        driver.switch_to.window(other)
        driver.close()
        driver.switch_to.window(dashboard)
        # Leave the page for another of the broker's (same origin: the record is kept), and
        # come back.
        driver.get(f"{base}/dashboard/assets/dashboard.css")
        out["left_full"] = record(driver)
        driver.back()
        wait_for(driver, view_loaded("/overview"), "the overview again")
        out["timers_returned"] = driver.execute_script("return window.__liveRefreshTimers();")
        out["errors"] = [  # (the style sheet opened as a page asks for a favicon: none here)
            e["message"]
            for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "/favicon.ico " not in e["message"]
        ]
        out["refused"] = browser.policy_violations(driver)
    return out


async def test_a_hidden_or_left_page_stops_refreshing_and_starts_again_on_return(
    need_browser: None, settings: Settings
) -> None:
    settings = settings.with_changes(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        with trio.fail_after(120):
            out = await trio.to_thread.run_sync(run_refresh, f"http://127.0.0.1:{port}")
        nursery.cancel_scope.cancel()
    assert out["timers_shown"] == 1
    events = out["hidden_and_back"]
    back = events.index(["visibilitychange", "visible"])
    hidden, shown = events[:back], events[back:]
    # hidden: the timer stops at once, and no view is asked for until the tab is shown
    assert hidden == [["visibilitychange", "hidden"], ["clear", "hidden"]]
    # shown: the timer starts again and the view is loaded at once
    assert shown[:3] == [["visibilitychange", "visible"], ["set", "visible"], ["view", "visible"]]
    assert ["view", "hidden"] not in events
    assert out["timers_back"] == 1
    # left: no refresh timer outlives the page (it stopped as the page was hidden or left)
    left = out["left_full"]
    last_set = max(i for i, e in enumerate(left) if e[0] == "set")
    assert any(e[0] == "clear" for e in left[last_set:]), left
    assert out["timers_returned"] == 1
    assert out["errors"] == []
    assert out["refused"] == []

"""The dashboard during a database outage: a real ``queen serve`` on a PostgreSQL of its own,
which the test stops ``immediate``. The overview and system views then show, from the broker's
memory, since when the database is down, the spool, the switches, the loops and this process's
rates; every view shows the outage in a banner and the page as it last was, with its age."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from queen.http.dashboard import PageMemory
from queen.storage.embedded import EmbeddedPostgres
from tests import browser
from tests.conftest import TEST_SERVER_OPTIONS, embedded_pg_dir
from tests.procs import BrokerProcess
from tests.test_dashboard_browser import call, main_text, view_loaded, wait_for

pytestmark = pytest.mark.slow


async def test_the_dashboard_shows_what_it_knows_while_the_database_is_away(
    tmp_path: Path,
) -> None:
    with embedded_pg_dir() as data:
        server = EmbeddedPostgres(data, server_options=TEST_SERVER_OPTIONS)
        url = await trio.to_thread.run_sync(server.start)
        broker = BrokerProcess(
            {
                "DATABASE_URL": url,
                "FILE_BUFFER_DIR": str(tmp_path / "spool"),
                "QUEEN_DB_CONNECT_TIMEOUT_S": "2",
            }
        )
        try:
            async with trio.open_nursery() as nursery:
                await broker.start(nursery)
                async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
                    await _exercise(http, server)
                await broker.stop()
                nursery.cancel_scope.cancel()
        finally:
            await trio.to_thread.run_sync(lambda: server.stop("immediate"))


def _push(queue: str, n: int) -> dict[str, object]:
    return {"items": [{"queue": queue, "partition": "p", "payload": {"n": i}} for i in range(n)]}


async def _exercise(http: httpx.AsyncClient, server: EmbeddedPostgres) -> None:
    queue = "outage-q"
    pushed = await http.post("/api/v1/push", json=_push(queue, 5))
    assert [i["status"] for i in pushed.json()] == ["queued"] * 5

    before = await http.get("/dashboard/view/overview")
    assert before.status_code == 200 and "<h1>Overview</h1>" in before.text
    assert "unreachable" not in before.text
    seen = await http.get(f"/dashboard/view/messages?queue={queue}")
    assert seen.status_code == 200 and "unreachable" not in seen.text

    await trio.to_thread.run_sync(lambda: server.stop("immediate"))
    spooled = await http.post("/api/v1/push", json=_push(queue, 3))
    assert [i["status"] for i in spooled.json()] == ["buffered"] * 3  # the broker knows

    overview = await http.get("/dashboard/view/overview")
    assert overview.status_code == 200
    page = overview.text
    assert "PostgreSQL is unreachable" in page
    assert re.search(r"since \d{4}-\d\d-\d\dT", page), page  # since when
    assert _card(page, "spool items") == "3"
    assert int(_card(page, "spool bytes").replace(",", "")) > 0
    assert _card(page, "push maintenance") == "off"
    assert _card(page, "pop maintenance") == "off"
    assert "Background loops" in page and "database-probe" in page
    # ... and the figures it had, marked with their age
    assert "this page as it was" in page and "<h1>Overview</h1>" in page

    system = await http.get("/dashboard/view/system")
    assert system.status_code == 200
    assert "PostgreSQL is unreachable" in system.text and _card(system.text, "spool items") == "3"
    # never shown before the outage: said so, with this process's state still there
    assert "none of its figures were seen" in system.text

    messages = await http.get(f"/dashboard/view/messages?queue={queue}")
    assert messages.status_code == 200
    assert "PostgreSQL is unreachable" in messages.text and "this page as it was" in messages.text
    assert "Background loops" not in messages.text  # the banner only, then the kept page
    never = await http.get("/dashboard/view/traces")
    assert never.status_code == 200 and "none of its figures were seen" in never.text


MEET_THE_OUTAGE = ("retention", "push-listener", "maintenance-switch", "encryption-refresh")


async def test_loops_that_meet_the_outage_are_shown_failing_and_ok_once_it_ends(
    tmp_path: Path,
) -> None:
    """The loops that catch the database's errors themselves (logging them and trying again
    at their next turn) are failing in /health, /metrics and the dashboard while PostgreSQL
    is away, with their errors, since when and the last one; ok again once it is back."""
    with embedded_pg_dir() as data:
        server = EmbeddedPostgres(data, server_options=TEST_SERVER_OPTIONS)
        url = await trio.to_thread.run_sync(server.start)
        broker = BrokerProcess(
            {
                "DATABASE_URL": url,
                "FILE_BUFFER_DIR": str(tmp_path / "spool"),
                "QUEEN_DB_CONNECT_TIMEOUT_S": "2",
                "QUEEN_RETENTION_INTERVAL_S": "0.2",
            }
        )
        try:
            async with trio.open_nursery() as nursery:
                await broker.start(nursery)
                async with httpx.AsyncClient(base_url=broker.base, timeout=30) as http:
                    health = (await http.get("/health")).json()
                    assert health["status"] == "healthy", health
                    await trio.to_thread.run_sync(lambda: server.stop("immediate"))
                    loops = await _loops_until(http, lambda s: s == "failing")
                    for name in MEET_THE_OUTAGE:
                        assert loops[name]["errors"] >= 1, loops
                        assert re.match(r"\d{4}-\d\d-\d\dT", loops[name]["failingSince"])
                        assert loops[name]["lastError"], loops
                    assert loops["database-probe"]["state"] == "ok"  # it found the outage
                    text = (await http.get("/metrics")).text
                    assert 'queen_background_loop_failing{loop="retention"} 1.0' in text
                    page = (await http.get("/dashboard/view/overview")).text
                    assert re.search(r'<td class="mono">retention</td><td>failing</td>', page)

                    await trio.to_thread.run_sync(server.start)
                    loops = await _loops_until(http, lambda s: s == "ok")
                    assert all(loops[n]["errors"] >= 1 for n in MEET_THE_OUTAGE)
                    health = (await http.get("/health")).json()
                    assert health["status"] == "healthy", health
                await broker.stop()
                nursery.cancel_scope.cancel()
        finally:
            await trio.to_thread.run_sync(lambda: server.stop("immediate"))


async def _loops_until(
    http: httpx.AsyncClient, wanted: Callable[[str], bool], timeout_s: float = 60
) -> dict[str, Any]:
    """Ask /health (the state lives in the broker process) until every loop of
    :data:`MEET_THE_OUTAGE` is in a state ``wanted`` accepts; its loops then."""
    with trio.fail_after(timeout_s):
        while True:
            loops: dict[str, Any] = (await http.get("/health")).json()["loops"]
            if all(wanted(loops[name]["state"]) for name in MEET_THE_OUTAGE):
                return loops
            await trio.sleep(0.1)


def _card(page: str, label: str) -> str:
    found = re.search(
        rf'<div class="k">{re.escape(label)}</div><div class="v[^"]*">([^<]*)</div>', page
    )
    assert found, f"no card {label!r}"
    return found.group(1).strip()


def test_the_page_memory_keeps_the_newest_pages_and_forgets_the_oldest() -> None:
    memory = PageMemory(size=2)
    memory.keep("/a", "A")
    memory.keep("/b", "B")
    memory.keep("/a", "A2")  # shown again: the newest now
    memory.keep("/c", "C")
    assert memory.recall("/b") is None
    kept_a, kept_c = memory.recall("/a"), memory.recall("/c")
    assert kept_a is not None and kept_a[1] == "A2"
    assert kept_c is not None and kept_c[1] == "C"


def browse_outage(base: str, stop_database: Callable[[], None]) -> dict[str, Any]:
    """The overview in Chromium before and during the outage (screenshot ``outage.png``)."""
    out: dict[str, Any] = {}
    browser.SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with browser.chromium() as driver:
        driver.get(f"{base}/#/overview")
        out["before"] = wait_for(driver, view_loaded("/overview"), "the overview")
        stop_database()
        pushed = call(base, "POST", "/api/v1/push", _push("outage-browser", 2))
        out["pushed"] = [item["status"] for item in pushed]
        driver.get(f"{base}/#/system")  # away and back: a fresh load of the overview
        wait_for(driver, view_loaded("/system"), "the system page")
        driver.get(f"{base}/#/overview")
        out["during"] = wait_for(
            driver,
            lambda d: (t := view_loaded("/overview")(d)) and "unreachable" in t and t,
            "the outage banner",
        )
        out["text"] = main_text(driver)
        driver.save_screenshot(str(browser.SCREENSHOTS / "outage.png"))
        out["errors"] = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        out["refused"] = browser.policy_violations(driver)
    return out


async def test_in_a_browser_the_overview_says_the_database_is_away_and_what_it_knows(
    need_browser: None, tmp_path: Path
) -> None:
    with embedded_pg_dir() as data:
        server = EmbeddedPostgres(data, server_options=TEST_SERVER_OPTIONS)
        url = await trio.to_thread.run_sync(server.start)
        broker = BrokerProcess({"DATABASE_URL": url, "FILE_BUFFER_DIR": str(tmp_path / "spool")})
        try:
            async with trio.open_nursery() as nursery:
                await broker.start(nursery)
                with trio.fail_after(120):
                    out = await trio.to_thread.run_sync(
                        browse_outage, broker.base, lambda: server.stop("immediate")
                    )
                await broker.stop()
                nursery.cancel_scope.cancel()
        finally:
            await trio.to_thread.run_sync(lambda: server.stop("immediate"))
    assert out["before"] == "Overview"
    assert out["pushed"] == ["buffered", "buffered"]
    assert out["during"].startswith("PostgreSQL is unreachable since")
    text = out["text"]
    shouting = text.upper()  # headings are shown in capitals
    assert "THIS PROCESS, FROM ITS OWN MEMORY" in shouting and "BACKGROUND LOOPS" in shouting
    assert "this page as it was" in text  # the figures from before, with their age
    assert out["errors"] == []
    assert out["refused"] == []

"""Debian's Chromium driven by Selenium through ``/usr/bin/chromedriver``, for the dashboard's
browser tests. Nothing is downloaded: the browser and its driver come from apt (``scripts/
test.sh`` installs them when run as root)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parent / "artifacts" / "screenshots"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,1000",
)


def missing() -> str | None:
    """What to install, or None when the browser and its driver are here."""
    absent = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if not absent:
        return None
    return (
        f"{', '.join(absent)} missing: install Debian's browser and driver with "
        "`apt-get install chromium chromium-driver` (scripts/test.sh does it as root)"
    )


# Run in every document before its own scripts (DevTools' scripts are exempt from the page's
# policy): collects what the Content-Security-Policy refused, as the page reports it.
_WATCH_POLICY = """
window.__policyViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__policyViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


def policy_violations(driver: Any) -> list[str]:
    """What the current document's Content-Security-Policy refused so far."""
    return list(driver.execute_script("return window.__policyViolations || [];"))


@contextmanager
def chromium(extra_flags: tuple[str, ...] = (), *, performance_log: bool = False) -> Iterator[Any]:
    """A headless Chromium with a fresh profile; its console is readable with
    ``driver.get_log("browser")``, and :func:`policy_violations` lists what the page's
    Content-Security-Policy refused. ``extra_flags`` come after the usual ones (a later
    ``--window-size`` wins); with ``performance_log`` the DevTools network events are kept
    too (``driver.get_log("performance")``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="queen-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, *extra_flags):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    logs = {"browser": "ALL", "performance": "ALL"} if performance_log else {"browser": "ALL"}
    options.set_capability("goog:loggingPrefs", logs)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _WATCH_POLICY})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)

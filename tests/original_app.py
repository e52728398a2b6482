"""The original broker's dashboard (its Vue app, built by ``scripts/original-dashboard.sh``)
against this broker: fill a running broker with data every page shows, open every page of the
app in headless Chromium, and collect per page its console errors, the requests that failed
and a screenshot.

``python -m tests.original_app BASE_URL [SCREENSHOT_DIR]`` fills the broker at ``BASE_URL``
(served with ``WEBAPP_ROOT`` naming the built app) and prints a report; the exit status is 1
when a page logged an error or a request of the broker's failed.

The browser resolves no name but the broker's: the app's ``index.html`` links a web font on
another host, which is refused here without a request leaving the machine (that refusal is
reported apart, as it is not the broker's).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from tests import browser

ORDERS = "orders"
PAYMENTS = "payments"
EMAILS = "emails"
CLEARED = "audit-log"
ORDER_PARTITIONS = 24
TRACE_NAME = "order-flow"


NOT_THE_BROKERS = ("/api/me",)
"""Paths the app asks for that neither broker serves, so that their 404 is expected: the app
asks ``/api/me`` whether it runs behind its authors' login proxy (which answers it), and shows
no signed-in user when it is 404, as against the original broker."""


@dataclass(frozen=True)
class Page:
    name: str
    path: str
    # text the page shows once its figures have loaded
    ready: str
    # a script run until it returns true, before the text is looked for (a form filled in)
    act: str | None = None
    # requests of the broker's this page makes fail on purpose
    refused: tuple[str, ...] = ()


# The Migration page: the target's form filled in, "Test Connection" pressed; the broker
# answers 501 and the page shows why (queen import).
TEST_CONNECTION = """
var inputs = Array.prototype.slice.call(document.querySelectorAll('main input'));
var host = inputs.findIndex(function (i) { return i.placeholder === 'db.example.com'; });
var button = Array.prototype.slice.call(document.querySelectorAll('button'))
    .find(function (b) { return b.textContent.trim() === 'Test Connection'; });
if (host < 0 || !button) { return false; }
function set(el, v) { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }
set(inputs[host], 'db.example');
set(inputs[host + 2], 'queen');
set(inputs[host + 3], 'queen');
setTimeout(function () { button.click(); }, 50);
return true;
"""

PAGES: tuple[Page, ...] = (
    Page("dashboard", "/", ORDERS),
    Page("queues", "/queues", ORDERS),
    Page("queue-detail", f"/queues/{ORDERS}", "Messages in DLQ"),
    Page("messages", "/messages", ORDERS),
    Page("traces", "/traces", TRACE_NAME),
    Page("consumers", "/consumers", "billing"),
    Page("analytics", "/analytics", ORDERS),
    Page("dead-letter", "/dlq", ORDERS),
    Page("operations", "/operations", ORDERS),
    Page("system", "/system", "1 replicas"),
    Page(
        "migration",
        "/migration",
        "queen import",
        act=TEST_CONNECTION,
        refused=("/api/v1/migration/test-connection",),
    ),
)


def call(base: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read()
        return json.loads(text) if text else None


def _push(base: str, queue: str, items: list[dict[str, Any]]) -> None:
    for start in range(0, len(items), 500):
        call(base, "POST", "/api/v1/push", {"items": items[start : start + 500]})


def _pop(base: str, queue: str, query: str) -> dict[str, Any]:
    got = call(base, "GET", f"/api/v1/pop/queue/{quote(queue, safe='')}?wait=false&{query}")
    return got or {"messages": []}


def _ack(base: str, message: dict[str, Any], status: str, group: str | None) -> None:
    call(
        base,
        "POST",
        "/api/v1/ack",
        {
            "transactionId": message["transactionId"],
            "partitionId": message["partitionId"],
            "leaseId": message["leaseId"],
            "status": status,
            "consumerGroup": group,
            "error": "card declined" if status != "completed" else None,
        },
    )


def seed(base: str) -> None:
    """Queues with many partitions, groups with lag and live leases, dead letters, traces,
    messages in every state; a namespace and a task; a cleared queue."""
    call(
        base,
        "POST",
        "/api/v1/configure",
        {
            "queue": ORDERS,
            "namespace": "shop",
            "task": "fulfilment",
            "options": {"leaseTime": 600, "retryLimit": 1, "retryDelay": 0},
        },
    )
    call(
        base,
        "POST",
        "/api/v1/configure",
        {"queue": PAYMENTS, "namespace": "shop", "options": {"leaseTime": 600}},
    )
    call(base, "POST", "/api/v1/configure", {"queue": EMAILS, "options": {"leaseTime": 600}})
    _push(
        base,
        ORDERS,
        [
            {
                "queue": ORDERS,
                "partition": f"p-{n % ORDER_PARTITIONS:02d}",
                "transactionId": f"order-{n}",
                "payload": {"orderId": n, "total": 10 * n},
            }
            for n in range(600)
        ],
    )
    _push(
        base,
        PAYMENTS,
        [
            {
                "queue": PAYMENTS,
                "partition": f"acct-{n % 8}",
                "transactionId": f"pay-{n}",
                "payload": {"payment": n},
            }
            for n in range(160)
        ],
    )
    _push(
        base,
        EMAILS,
        [{"queue": EMAILS, "transactionId": f"mail-{n}", "payload": {"to": n}} for n in range(40)],
    )
    _push(
        base,
        CLEARED,
        [{"queue": CLEARED, "transactionId": f"log-{n}", "payload": {"n": n}} for n in range(20)],
    )
    try:
        call(base, "DELETE", f"/api/v1/queues/{CLEARED}/clear")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:  # the original broker has no clear route
            raise
    # billing: consumes most of orders, acks, fails some into the DLQ, traces what it does
    traced = 0
    for _ in range(12):
        got = _pop(base, ORDERS, "batch=30&consumerGroup=billing")
        for n, message in enumerate(got["messages"]):
            if n % 10 == 3:
                _ack(base, message, "dlq", "billing")
                continue
            if traced < 30:
                traced += 1
                call(
                    base,
                    "POST",
                    "/api/v1/traces",
                    {
                        "transactionId": message["transactionId"],
                        "partitionId": message["partitionId"],
                        "consumerGroup": "billing",
                        "eventType": "processing" if traced % 3 else "error",
                        "traceNames": [TRACE_NAME, f"order-{message['data']['orderId']}"],
                        "data": {"text": f"invoiced {message['data']['orderId']}"},
                    },
                )
            _ack(base, message, "completed", "billing")
    # audit: holds live leases on a few partitions, acks nothing
    for _ in range(3):
        _pop(base, ORDERS, "batch=10&consumerGroup=audit")
    # shipping (subscribed to new messages only) and queue mode: a little each
    _pop(base, ORDERS, "batch=5&consumerGroup=shipping&subscriptionMode=new")
    for _ in range(3):
        got = _pop(base, PAYMENTS, "batch=20")
        for n, message in enumerate(got["messages"]):
            _ack(base, message, "completed" if n % 7 else "dlq", None)
    got = _pop(base, PAYMENTS, "batch=15&consumerGroup=ledger")
    for message in got["messages"]:
        _ack(base, message, "completed", "ledger")
    _pop(base, EMAILS, "batch=10")  # a lease in queue mode
    # newer messages for shipping to lag behind on
    _push(
        base,
        ORDERS,
        [
            {
                "queue": ORDERS,
                "partition": f"p-{n % ORDER_PARTITIONS:02d}",
                "transactionId": f"order-late-{n}",
                "payload": {"orderId": 1000 + n},
            }
            for n in range(48)
        ],
    )


def wait_for_history(base: str, deadline_s: float = 40.0) -> None:
    """Until the broker's 10-second history holds a point with the seeded traffic."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        status = call(base, "GET", "/api/v1/status")
        points = status.get("throughput") or []
        if any((p.get("ingestedPerSecond") or 0) > 0 for p in points):
            return
        time.sleep(0.5)
    raise AssertionError("the broker's history kept no point with the seeded pushes")


@dataclass
class PageReport:
    page: Page
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)  # refused requests to other hosts
    expected: list[str] = field(default_factory=list)  # NOT_THE_BROKERS
    policy_violations: list[str] = field(default_factory=list)
    showed_ready_text: bool = False

    @property
    def clean(self) -> bool:
        return not (self.console_errors or self.failed_requests or self.policy_violations)


@contextmanager
def offline_chromium(base: str) -> Iterator[Any]:
    """Chromium (``tests.browser``) that resolves only the broker's host, with the network log
    kept for :func:`visit`."""
    host = urlsplit(base).hostname or "127.0.0.1"
    rules = f"MAP * ~NOTFOUND, EXCLUDE {host}"
    with browser.chromium(
        extra_flags=(f"--host-resolver-rules={rules}",), performance_log=True
    ) as driver:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False},
        )
        yield driver


def _network(driver: Any, base: str) -> tuple[list[str], list[str]]:
    """(failed requests to the broker, failed requests elsewhere) since the last call."""
    urls: dict[str, str] = {}
    ours: list[str] = []
    other: list[str] = []
    for entry in driver.get_log("performance"):
        event = json.loads(entry["message"])["message"]
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
        elif method == "Network.responseReceived":
            response = params["response"]
            if response["status"] >= 400:
                line = f"{response['status']} {response['url']}"
                (ours if response["url"].startswith(base) else other).append(line)
        elif method == "Network.loadingFailed":
            url = urls.get(params["requestId"], "?")
            if params.get("canceled"):
                continue
            line = f"{params.get('errorText')} {url}"
            (ours if url.startswith(base) else other).append(line)
    return ours, other


def visit(
    driver: Any,
    base: str,
    page: Page,
    shots: Path | None,
    settle: Callable[[Any, Page], bool] | None = None,
    deadline_s: float = 15.0,
) -> PageReport:
    report = PageReport(page)
    driver.get_log("browser")
    driver.get_log("performance")
    driver.get(base + page.path)
    end = time.monotonic() + deadline_s
    acted = page.act is None
    while time.monotonic() < end:
        if not acted:
            acted = bool(driver.execute_script(page.act))
        text = driver.execute_script("return document.body ? document.body.innerText : ''")
        if acted and page.ready in text and (settle is None or settle(driver, page)):
            report.showed_ready_text = True
            break
        time.sleep(0.2)
    # let requests started by the first render finish (bounded)
    time.sleep(1.5)
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shots / f"{page.name}.png"))
    for entry in driver.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        message = entry["message"]
        url = message.split(" ", 1)[0]
        expected = (*NOT_THE_BROKERS, *page.refused)
        if url.startswith("http") and not url.startswith(base):
            report.elsewhere.append(message)
        elif any(url == base + path for path in expected):
            report.expected.append(message)
        elif page.refused and "[API Error]" in message and "queen import" in message:
            report.expected.append(message)  # the app logs the refusal it shows
        else:
            report.console_errors.append(message)
    ours, other = _network(driver, base)
    for line in ours:
        if any(line.endswith(" " + base + path) for path in (*NOT_THE_BROKERS, *page.refused)):
            report.expected.append(line)
        else:
            report.failed_requests.append(line)
    report.elsewhere += other
    for violation in browser.policy_violations(driver):
        blocked = violation.rsplit(" ", 1)[-1]
        if blocked.startswith("http") and not blocked.startswith(base):
            report.elsewhere.append(violation)
        else:
            report.policy_violations.append(violation)
    return report


def walk(base: str, shots: Path | None) -> list[PageReport]:
    """Every page of :data:`PAGES`, in one browser."""
    with offline_chromium(base) as driver:
        return [visit(driver, base, page, shots) for page in PAGES]


def settle_minute(base: str) -> None:
    """Until the minute the seeding ended in is over (and a 10-second history point after
    it), so that the per-minute series the app charts have a complete bucket."""
    wait_for_history(base)
    now = time.time()
    time.sleep(60 - now % 60 + 12)


def main(argv: list[str]) -> int:
    base = argv[1].rstrip("/")
    shots = Path(argv[2]) if len(argv) > 2 else None
    try:
        seed(base)
    except urllib.error.HTTPError as exc:
        print(f"seeding failed: {exc.code} {exc.read()[:300]!r}", file=sys.stderr)
        return 2
    settle_minute(base)
    failed = 0
    for report in walk(base, shots):
        page = report.page
        mark = "ok  " if report.clean and report.showed_ready_text else "FAIL"
        failed += mark == "FAIL"
        print(f"{mark} {page.name:14} {page.path}  ready={report.showed_ready_text}")
        for line in report.console_errors:
            print(f"     console: {line[:400]}")
        for line in report.failed_requests:
            print(f"     request: {line[:400]}")
        for line in report.policy_violations:
            print(f"     policy:  {line[:400]}")
        for line in sorted(set(report.elsewhere)):
            print(f"     (another host's, not the broker's: {line[:160]})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

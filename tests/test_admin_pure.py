"""Pure parts of the admin side: query parameters, the history's rates, the SVG charts, the
scrapes' shared reads."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import trio
import trio.testing

from queen.admin import charts, messages, params
from queen.admin.gauges import FreshRead
from queen.admin.history import History
from queen.consume.errors import InvalidRequest
from queen.metrics import Metrics, render_labelled_gauges


def test_pages_are_bounded() -> None:
    assert params.page({}) == params.Page(100, 0)
    assert params.page({"limit": "5", "offset": "10"}) == params.Page(5, 10)
    for bad in ({"limit": "0"}, {"limit": "1001"}, {"offset": "-1"}, {"limit": "x"}):
        with pytest.raises(InvalidRequest):
            params.page(bad)


def test_window_defaults_and_order() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert params.window({}, default=timedelta(hours=1), now=now) == (
        now - timedelta(hours=1),
        now,
    )
    with pytest.raises(InvalidRequest):
        params.window(
            {"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
            default=timedelta(hours=1),
        )
    assert messages.status({"status": "dlq"}) == "dead_letter"


def test_history_rates_are_differences_per_second() -> None:
    metrics = Metrics()
    now = [1000.0]
    history = History(metrics, step_s=10, span_s=60, clock=lambda: now[0])
    history.sample()
    metrics.push_items_queued += 50
    metrics.acks += 20
    now[0] += 10
    history.sample()
    now[0] += 5
    history.sample()  # younger than a step: not recorded
    [point] = history.series()
    assert (point.rates.ingested_per_s, point.rates.processed_per_s) == (5.0, 2.0)
    assert history.latest_rates().ingested_per_s == 5.0
    for _ in range(20):
        now[0] += 10
        history.sample()
    assert len(history.points) == 7  # the ring keeps span / step + 1 points


def test_charts_escape_their_text() -> None:
    svg = charts.bar_chart([("<script>", 3.0)], title="a & b")
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "a &amp; b" in svg
    line = charts.line_chart([("push", [0.0, 2.0, 4.0])], title="t")
    assert line.count("<polyline") == 1


def test_a_line_chart_labels_its_time_axis_with_clock_times() -> None:
    start = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    times = [start + timedelta(seconds=10 * i) for i in range(361)]  # an hour of samples
    svg = charts.line_chart([("push", [1.0] * 361)], times=times)
    labels = re.findall(r'class="axis" text-anchor="(?:start|middle|end)">(\d\d:\d\d)</text>', svg)
    assert labels == ["09:00", "09:15", "09:30", "09:45", "10:00"]
    short = charts.line_chart([("pop", [1.0, 2.0])], times=times[:2])
    assert ">09:00:00<" in short and ">09:00:10<" in short  # seconds on a short span
    assert ">09:00<" not in charts.line_chart([("pop", [1.0, 2.0])])  # no times, no labels


def test_labelled_gauges_escape_label_values() -> None:
    text = render_labelled_gauges({"queue_depth": {(("queue", 'a"b\\c'),): 3}})
    assert text == (
        "# HELP queen_queue_depth queue depth\n"
        '# TYPE queen_queue_depth gauge\nqueen_queue_depth{queue="a\\"b\\\\c"} 3.0\n'
    )


async def test_scrapes_share_a_read_only_if_it_started_after_they_asked() -> None:
    finish: list[trio.Event] = []

    async def fetch() -> int:
        finish.append(trio.Event())
        run = len(finish)
        await finish[-1].wait()
        return run

    reads = FreshRead(fetch)
    got: dict[str, int] = {}

    async def scrape(name: str) -> None:
        got[name] = await reads.read()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scrape, "a")
        await trio.testing.wait_all_tasks_blocked()
        assert len(finish) == 1  # a's run is in flight
        nursery.start_soon(scrape, "b")
        nursery.start_soon(scrape, "c")
        await trio.testing.wait_all_tasks_blocked()
        assert len(finish) == 1  # b and c wait: that run started before they asked
        finish[0].set()
        await trio.testing.wait_all_tasks_blocked()
        assert got == {"a": 1} and len(finish) == 2  # one run for both
        finish[1].set()
    assert got == {"a": 1, "b": 2, "c": 2}
    finish.clear()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scrape, "d")  # later: a run of its own
        await trio.testing.wait_all_tasks_blocked()
        finish[0].set()
    assert got["d"] == 1 and len(finish) == 1

"""This broker against the original's answers (``tests/golden/original/``, captured by
``python -m tests.golden_capture``): the same fixed data set (:func:`tests.golden.sequence`)
on a fresh database, then every read route of the original's dashboard app (and, last, a
deletion), compared as :data:`tests.golden.RULES` says (key paths and types everywhere, values
where the data makes them deterministic, and the figures with no meaning here named)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from queen import open_broker
from queen.http.app import create_app
from queen.settings import Settings
from tests.conftest import scratch_database
from tests.golden import ROUTES, RULES, _matches, _under, compare, resolve, sequence

GOLDEN = Path(__file__).resolve().parent / "golden" / "original"
INDEX = json.loads((GOLDEN / "routes.json").read_text())["routes"]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fresh_url(pg_url: str) -> Iterator[str]:
    """A database of its own: the overview, the groups and the history count everything."""
    with scratch_database(pg_url, "golden") as url:
        yield url


@pytest.fixture
async def golden_client(fresh_url: str, tmp_path: Path) -> AsyncIterator[Any]:
    settings = Settings(
        database_url=fresh_url,
        file_buffer_dir=str(tmp_path / "spool"),
        db_pool_size=6,
        write_concurrency=2,
        shutdown_grace_s=5,
    )
    async with open_broker(settings) as broker:
        yield create_app(broker).test_client()


async def _answer(resp: Any) -> Any:
    text = await resp.get_data(as_text=True)
    return json.loads(text) if text else None


async def _fill(client: Any) -> dict[str, str]:
    steps = sequence()
    answer: Any = None
    try:
        while True:
            method, path, body = steps.send(answer)
            resp = await client.open(path, method=method, json=body)
            assert resp.status_code < 300, f"{method} {path}: {resp.status_code}"
            answer = await _answer(resp)
    except StopIteration as done:
        return dict(done.value)


def _golden(name: str) -> Any:
    return json.loads((GOLDEN / f"{name}.json").read_text())


async def _ours(client: Any, ids: dict[str, str]) -> dict[str, tuple[int, Any]]:
    await client.post("/api/v1/stats/refresh")
    out: dict[str, tuple[int, Any]] = {}
    for route in ROUTES:  # the ones that change the data come last
        resp = await client.open(
            resolve(route, ids), method=route.method, headers={"Accept": route.accept}
        )
        out[route.name] = (resp.status_code, await _answer(resp))
    return out


def _report(ours: dict[str, tuple[int, Any]], dump: Path) -> list[str]:
    """Every difference from the original's answers (our answers are written to ``dump``)."""
    dump.mkdir(parents=True, exist_ok=True)
    report: list[str] = []
    for route in ROUTES:
        status, body = ours[route.name]
        (dump / f"{route.name}.json").write_text(json.dumps(body, indent=1) + "\n")
        rules = RULES.get(route.name)
        wanted = INDEX[route.name]["status"]
        if rules is not None and rules.status != 200:
            assert wanted == rules.status, f"{route.name}: the original answered {wanted}"
            continue
        if status != 200:
            report.append(f"{route.name}: {status} here, {wanted} there")
            continue
        outcome = compare(route.name, _golden(route.name), body)
        report += [f"{route.name}: {p}" for p in outcome.problems]
    return report


async def test_every_route_of_the_app_answers_the_originals_figures(
    golden_client: Any, tmp_path: Path
) -> None:
    """Each route's key paths and types, and its deterministic figures, as the original's;
    ``QUEEN_GOLDEN_DUMP=DIR`` keeps our answers in DIR."""
    ids = await _fill(golden_client)
    ours = await _ours(golden_client, ids)
    dump = Path(os.environ.get("QUEEN_GOLDEN_DUMP") or tmp_path / "ours")
    report = _report(ours, dump)
    assert not report, f"(our answers are in {dump})\n" + "\n".join(report)


@pytest.mark.parametrize("route", [r.name for r in ROUTES])
def test_every_rule_names_a_path_of_the_originals_answer(route: str) -> None:
    """A figure compared by value, or named as differing here (with why), is one the
    original's answer has: no rule passes by naming nothing."""
    rules = RULES.get(route)
    assert rules is not None, f"{route}: no rules"
    assert INDEX[route]["status"] == rules.status
    theirs = _golden(route)
    if rules.status != 200:
        return
    outcome = compare(route, theirs, theirs)
    assert not outcome.problems
    for pattern in rules.equal:
        assert any(_matches(pattern, p) for p in outcome.equal), f"{route}: {pattern} names nothing"
    for pattern, why in rules.differs.items():
        assert why, f"{route}: {pattern} says not why it differs"
        hit = any(_under(pattern, p) or _under(p, pattern) for p in outcome.skipped)
        assert hit, f"{route}: {pattern} names nothing"

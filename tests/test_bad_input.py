"""Hostile and malformed push bodies: each gets a 4xx with an error text, the server stays up,
and nothing is stored. A NUL (which PostgreSQL text cannot hold) in any route's path, query
string or text field gets 400 and changes nothing."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from werkzeug.routing import Rule

from queen import open_broker
from queen.auth import AccessGate
from queen.broker import Broker
from queen.http.app import create_app
from queen.settings import Settings
from tests.conftest import Db

MAX_BODY = 64 * 1024
Q = "bad-input-queue"


def body(*items: Any) -> bytes:
    return orjson.dumps({"items": list(items)})


def ok_item(**extra: Any) -> dict[str, Any]:
    return {"queue": Q, "partition": "p", "payload": 1, **extra}


CASES: list[tuple[str, bytes, int]] = [
    ("empty body", b"", 400),
    ("whitespace body", b"  \n", 400),
    ("not json", b"hello", 400),
    ("truncated json", b'{"items": [{"queue": "q"', 400),
    ("invalid utf-8", b'{"items": [{"queue": "\xff\xfe", "payload": 1}]}', 400),
    (
        "invalid utf-8 with long digits",
        b'{"items": [{"queue": "\xff", "payload": 12345678901234567890}]}',
        400,
    ),
    ("body is an array", b"[]", 400),
    ("body is a string", b'"items"', 400),
    ("body is null", b"null", 400),
    ("items missing", b"{}", 400),
    ("items null", b'{"items": null}', 400),
    ("items an object", b'{"items": {"queue": "q"}}', 400),
    ("items a string", b'{"items": "q"}', 400),
    ("item a number", body(1), 400),
    ("item a string", body("x"), 400),
    ("item null", body(None), 400),
    ("item an array", body([ok_item()]), 400),
    ("valid then non-object", body(ok_item(), 7), 400),
    ("queue missing", body({"partition": "p", "payload": 1}), 400),
    ("payload missing", body({"queue": Q, "partition": "p"}), 400),
    ("valid then payload missing", body(ok_item(), {"queue": Q}), 400),
    ("queue a number", body({"queue": 1, "payload": 1}), 400),
    ("queue an object", body({"queue": {"a": 1}, "payload": 1}), 400),
    ("queue empty", body({"queue": "", "payload": 1}), 400),
    ("partition a number", body(ok_item(partition=3)), 400),
    ("partition empty", body(ok_item(partition="")), 400),
    ("partition a list", body(ok_item(partition=["p"])), 400),
    ("transactionId a number", body(ok_item(transactionId=5)), 400),
    ("transactionId an object", body(ok_item(transactionId={"a": 1})), 400),
    ("transactionId true", body(ok_item(transactionId=True)), 400),
    ("queue with NUL", body(ok_item(queue="q\u0000")), 400),
    ("transactionId with NUL", body(ok_item(transactionId="a\u0000b")), 400),
    ("unpaired surrogate", b'{"items": [{"queue": "q\\ud800", "payload": 1}]}', 400),
    ("NaN payload", b'{"items": [{"queue": "q", "payload": NaN}]}', 400),
    ("Infinity payload", b'{"items": [{"queue": "q", "payload": 1e400}]}', 400),
    ("queue name too long", body(ok_item(queue="q" * 300)), 400),
    ("deeply nested body", b'{"items": [' + b"[" * 5000 + b"]" * 5000 + b"]}", 400),
    (
        "deeply nested payload",
        b'{"items": [{"queue": "q", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}]}",
        400,
    ),
    (
        "body over the limit",
        b'{"items": [{"queue": "q", "payload": "' + b"x" * MAX_BODY + b'"}]}',
        413,
    ),
]


@pytest.fixture
async def small_broker(pg_url: str, tmp_path: Any) -> AsyncIterator[Broker]:
    settings = Settings(database_url=pg_url, file_buffer_dir=str(tmp_path), max_body_bytes=MAX_BODY)
    async with open_broker(settings) as broker:
        yield broker


@pytest.mark.parametrize(
    ("raw", "expected"), [(raw, code) for _, raw, code in CASES], ids=[name for name, _, _ in CASES]
)
async def test_malformed_body_is_refused(
    small_broker: Broker, db: Db, raw: bytes, expected: int
) -> None:
    client = create_app(small_broker).test_client()
    before = await db.count_frames()
    resp = await client.post("/api/v1/push", data=raw, headers={"content-type": "application/json"})
    assert resp.status_code == expected
    answer = await resp.get_json()
    assert isinstance(answer, dict) and isinstance(answer["error"], str) and answer["error"]
    assert await db.count_frames() == before
    health = await client.get("/health")
    assert health.status_code == 200
    ok = await client.post("/api/v1/push", json={"items": [ok_item(transactionId=raw.hex()[:900])]})
    assert ok.status_code == 201


async def test_exact_big_integers_and_deep_payloads_are_kept(
    client: Any, queue: str, db: Db
) -> None:
    deep = b"[" * 300 + b"]" * 300
    raw = (
        b'{"items": [{"queue": "' + queue.encode() + b'", "payload": '
        b'{"big": 123456789012345678901234567890, "deep": ' + deep + b"}}]}"
    )
    resp = await client.post("/api/v1/push", data=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 201
    frames = await db.frames(queue, "Default")
    assert (
        frames[0]["payload"]
        == '{"big":123456789012345678901234567890,"deep":' + deep.decode() + "}"
    )


async def test_binary_push_is_refused_clearly(client: Any) -> None:
    resp = await client.post(
        "/api/v1/push", data=b"QPB1\x00", headers={"content-type": "application/x-queen-push"}
    )
    assert resp.status_code == 400
    assert "binary" in (await resp.get_json())["error"]


async def test_unknown_route_and_method_answer_json(client: Any) -> None:
    missing = await client.get("/api/v1/nothing-here")
    assert missing.status_code == 404
    assert "error" in await missing.get_json()
    wrong = await client.get("/api/v1/push")
    assert wrong.status_code == 405
    assert "error" in await wrong.get_json()


# --- NUL, which PostgreSQL text cannot hold: in a path, a query string or a text field ------

FINGERPRINTED = (
    "queen.queues",
    "queen.partitions",
    "queen.segments",
    "queen.dedup",
    "queen.cursors",
    "queen.cursor_marks",
    "queen.failures",
    "queen.dlq",
    "queen.consumer_groups",
    "queen.consumer_watermarks",
    "queen.traces",
    "queen.system_state",
    "queen_streams.queries",
    "queen_streams.state",
)


async def fingerprint(db: Db) -> dict[str, str]:
    """Every row of the tables a request could change (one digest per table)."""
    digests = " UNION ALL ".join(
        f"SELECT '{table}', md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
        f" FROM {table} t"
        for table in FINGERPRINTED
    )
    return {table: digest for table, digest in await db.rows(digests)}


# A value for every kind of placeholder, so that only the one under test is wrong.
SAMPLE_ARGS = {"partition_id": "1", "lease": "0190a000-0000-7000-8000-000000000000"}
NUL_IN_URL = "a%00b"


def _routes() -> list[tuple[str, Rule]]:
    stub: Any = SimpleNamespace(settings=Settings(), admin=None)
    app = create_app(stub, gate=AccessGate.disabled())
    return sorted(
        (
            (method, rule)
            for rule in app.url_map.iter_rules()
            for method in rule.methods or ()
            if method not in ("HEAD", "OPTIONS")
        ),
        key=lambda pair: (pair[1].rule, pair[0]),
    )


def _url(rule: Rule, wrong: str | None) -> str:
    def value(match: re.Match[str]) -> str:
        converter, name = match[1] or "", match[2]
        if name == wrong:
            return NUL_IN_URL
        return "1" if converter == "int" else SAMPLE_ARGS.get(name, f"nul-{name}")

    return re.sub(r"<(?:(\w+):)?(\w+)>", value, rule.rule)


def _nul_urls(rule: Rule) -> list[str]:
    """The rule's URL with NUL in each text placeholder in turn, then in a query parameter."""
    texts = [a for a in sorted(rule.arguments) if not re.search(rf"<int:{a}>", rule.rule)]
    return [_url(rule, arg) for arg in texts] + [f"{_url(rule, None)}?search={NUL_IN_URL}"]


ROUTES = _routes()


@pytest.mark.parametrize(
    ("method", "rule"), ROUTES, ids=[f"{method} {rule.rule}" for method, rule in ROUTES]
)
async def test_nul_in_a_path_or_a_query_is_refused_and_changes_nothing(
    client: Any, db: Db, method: str, rule: Rule
) -> None:
    before = await fingerprint(db)
    for url in _nul_urls(rule):
        resp = await client.open(url, method=method, json={})
        assert resp.status_code == 400, (url, await resp.get_data(as_text=True))
        assert "NUL" in (await resp.get_json())["error"]
    assert await fingerprint(db) == before


async def test_nul_in_a_query_parameters_name_is_refused(client: Any) -> None:
    resp = await client.get(f"/api/v1/resources/queues?{NUL_IN_URL}=1")
    assert resp.status_code == 400
    assert (await resp.get_json())["error"] == "a query parameter's name must not contain NUL (%00)"


def _ack(tx: str, pid: str, lease: str) -> dict[str, Any]:
    return {"transactionId": tx, "partitionId": pid, "leaseId": lease, "status": "failed"}


# (route, body with NUL in one text field) for every body field bound for a text column that is
# not a name (names: see CASES above and the name rule); pid, lease and tx are a live message's.
NUL_BODY_CASES: list[tuple[str, str, Any]] = [
    ("ack transactionId", "/api/v1/ack", lambda m: _ack("a\x00b", *m[1:]) | {"error": "x"}),
    ("ack error", "/api/v1/ack", lambda m: _ack(*m) | {"error": "a\x00b"}),
    (
        "ack batch transactionId",
        "/api/v1/ack/batch",
        lambda m: {"acknowledgments": [_ack("a\x00b", *m[1:])], "consumerGroup": "g"},
    ),
    (
        "ack batch error",
        "/api/v1/ack/batch",
        lambda m: {"acknowledgments": [_ack(*m) | {"error": "a\x00b"}], "consumerGroup": "g"},
    ),
    (
        "transaction ack transactionId",
        "/api/v1/transaction",
        lambda m: {"operations": [{"type": "ack", **_ack("a\x00b", *m[1:])}]},
    ),
    (
        "transaction ack error",
        "/api/v1/transaction",
        lambda m: {"operations": [{"type": "ack", **_ack(*m), "error": "a\x00b"}]},
    ),
    (
        "dead letter errorMessage",
        "/api/v1/messages/{pid}/{tx}/dlq",
        lambda m: {"errorMessage": "a\x00b"},
    ),
]


@pytest.mark.parametrize(
    ("path", "make_body"),
    [(path, body) for _, path, body in NUL_BODY_CASES],
    ids=[name for name, _, _ in NUL_BODY_CASES],
)
async def test_nul_in_a_text_field_is_refused_and_changes_nothing(
    client: Any, db: Db, queue: str, path: str, make_body: Any
) -> None:
    pushed = await client.post(
        "/api/v1/push", json={"items": [{"queue": queue, "transactionId": "tx", "payload": 1}]}
    )
    assert pushed.status_code == 201
    popped = await client.get(f"/api/v1/pop/queue/{queue}?consumerGroup=g&wait=false")
    message = (await popped.get_json())["messages"][0]
    live = (message["transactionId"], message["partitionId"], message["leaseId"])
    before = await fingerprint(db)
    resp = await client.post(path.format(tx=live[0], pid=live[1]), json=make_body(live))
    assert resp.status_code == 400, await resp.get_data(as_text=True)
    assert "NUL" in (await resp.get_json())["error"]
    assert await fingerprint(db) == before

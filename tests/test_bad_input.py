"""Hostile and malformed push bodies: each gets a 4xx with an error text, the server stays up,
and nothing is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from queen import open_broker
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

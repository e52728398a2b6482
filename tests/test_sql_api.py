"""The SQL interface (queen/storage/sql_api.sql): pushing, popping and acknowledging from an
application's own PostgreSQL transactions, and the queen.messages view, under the same rules
as the HTTP routes and beside a running broker."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
import trio

from queen import open_broker
from queen.broker import Broker
from queen.consume.results import PopResult
from queen.intake import MAX_TRANSACTION_ID_CHARS
from queen.names import MAX_NAME_CHARS
from queen.settings import Settings
from queen.storage.postgres import check_foreign_schema
from tests.conftest import Db

NO_RECHECK = 60_000  # ms: only a wake-up can deliver a waiting pop within the test's limit


def _call(url: str, sql: str, *params: Any, rollback: bool = False) -> Any:
    """Run one statement in a transaction of its own; commit it, or roll it back."""
    with psycopg.connect(url) as conn:
        value = conn.execute(sql, params).fetchone()
        if rollback:
            conn.rollback()
        else:
            conn.commit()
    return None if value is None else value[0]


async def call(url: str, sql: str, *params: Any, rollback: bool = False) -> Any:
    return await trio.to_thread.run_sync(partial(_call, url, sql, *params, rollback=rollback))


async def push_v2(url: str, items: list[dict[str, Any]], **kw: Any) -> list[dict[str, Any]]:
    answer = await call(url, "SELECT queen.push_messages_v2(%s::jsonb)", json.dumps(items), **kw)
    assert isinstance(answer, list)
    return answer


async def test_a_push_from_sql_stores_what_http_would_and_dedups_against_it(
    broker: Broker, db: Db, queue: str
) -> None:
    http = await broker.push(
        [{"queue": queue, "partition": "p", "transactionId": "h", "payload": 0}]
    )
    answer = await push_v2(
        db.url,
        [
            {
                "queue": queue,
                "partition": "p",
                "transactionId": "a",
                "payload": {"x": 1},
                "producerSub": "svc",
            },
            {"queue": queue, "partition": "p", "transactionId": "h", "payload": "again"},
            {"queue": queue, "partition": "p", "transactionId": "a", "payload": "twice"},
            {"queue": queue, "partition": "p", "payload": [1, 2], "producerSub": ""},
            {
                "queue": queue,
                "transactionId": "d",
                "payload": None,
                "traceId": "0190d1b2-7c1e-7d3a-9e8f-1234567890ab",
            },
        ],
    )
    assert [a["status"] for a in answer] == ["queued", "duplicate", "duplicate", "queued", "queued"]
    assert [a["index"] for a in answer] == [0, 1, 2, 3, 4]
    assert answer[1]["message_id"] == http[0].message_id  # repeats the HTTP push
    assert answer[2]["message_id"] == answer[0]["message_id"]  # first wins inside a call
    assert answer[3]["transaction_id"] == answer[3]["message_id"]  # absent: the message id
    assert answer[4]["trace_id"] == "0190d1b2-7c1e-7d3a-9e8f-1234567890ab"

    frames = await db.frames(queue, "p")
    assert [(f["offset"], f["transaction_id"], f["sub"]) for f in frames] == [
        (0, "h", None),
        (1, "a", "svc"),
        (2, answer[3]["message_id"], None),
    ]
    assert await db.frames(queue, "Default") != []  # the default partition, created on use

    # The view reads what is stored, one row per message; payloads as jsonb.
    rows = await db.rows(
        """SELECT m.id::text, m.msg_offset, m.transaction_id, m.payload, m.producer_sub,
                  m.is_encrypted
           FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
           WHERE q.name = %s AND p.name = 'p' ORDER BY m.msg_offset""",
        queue,
    )
    assert rows == [
        (http[0].message_id, 0, "h", 0, None, False),
        (answer[0]["message_id"], 1, "a", {"x": 1}, "svc", False),
        (answer[3]["message_id"], 2, answer[3]["message_id"], [1, 2], None, False),
    ]

    named = await db.rows(
        "SELECT transaction_id FROM queen.messages WHERE queue_name = %s AND partition_name = 'p'"
        " ORDER BY msg_offset",
        queue,
    )
    assert named == [("h",), ("a",), (answer[3]["message_id"],)]

    # A consumer over HTTP gets them in offset order, createdAt from the minted ids.
    popped = await broker.pop(queue, "p", batch=10, auto_ack=True)
    assert [m.transaction_id for m in popped.messages] == ["h", "a", answer[3]["message_id"]]
    assert [m.data for m in popped.messages] == [0, {"x": 1}, [1, 2]]
    minted = await call(db.url, "SELECT queen.message_time(%s::uuid)", answer[0]["message_id"])
    assert abs(minted - datetime.now(UTC)) < timedelta(minutes=5)


async def test_a_push_from_sql_exists_only_if_the_callers_transaction_commits(
    settings: Settings, db: Db, queue: str
) -> None:
    item = {"queue": queue, "partition": "p", "transactionId": "t", "payload": "kept"}
    async with open_broker(settings.with_changes(pop_recheck_ms=NO_RECHECK)) as broker:
        await broker.push([{"queue": queue, "partition": "p", "payload": "first"}])
        await push_v2(db.url, [item], rollback=True)
        assert [f["payload"] for f in await db.frames(queue, "p")] == ['"first"']

        popped = await broker.pop(queue, "p", auto_ack=True)
        assert [m.data for m in popped.messages] == ["first"]
        got: list[PopResult] = []
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:

                async def wait() -> None:
                    got.append(await broker.pop(queue, "p", wait=True, timeout_ms=30_000))

                nursery.start_soon(wait)
                await broker.consume.wakeups.until_waiting(1)
                # Its commit wakes the waiting pop (the broker's listener hears it).
                answer = await push_v2(db.url, [item])
        assert answer[0]["status"] == "queued"
        assert [m.data for m in got[0].messages] == ["kept"]
        assert [m.offset for m in got[0].messages] == [1]  # the rolled-back push took none


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ({"queue": "q"}, "the items must be a JSON array, got object"),
        (["x"], "items[0] must be an object"),
        ([{"payload": 1}], "items[0].queue is required"),
        ([{"queue": "", "payload": 1}], "items[0].queue must not be empty"),
        ([{"queue": 5, "payload": 1}], "items[0].queue must be a string"),
        ([{"queue": "q\u0001", "payload": 1}], "items[0].queue must not contain control"),
        (
            [{"queue": "q" * (MAX_NAME_CHARS + 1), "payload": 1}],
            f"items[0].queue is longer than {MAX_NAME_CHARS}",
        ),
        ([{"queue": "q", "partition": 3, "payload": 1}], "items[0].partition must be a string"),
        ([{"queue": "q", "partition": "", "payload": 1}], "items[0].partition must not be empty"),
        ([{"queue": "q", "payload": 1}, {"queue": "q"}], "items[1].payload is required"),
        ([{"queue": "q", "payload": 1, "transactionId": 7}], "transactionId must be a string"),
        (
            [{"queue": "q", "payload": 1, "transactionId": "t" * (MAX_TRANSACTION_ID_CHARS + 1)}],
            f"longer than {MAX_TRANSACTION_ID_CHARS}",
        ),
        ([{"queue": "q", "payload": 1, "traceId": "zz"}], "items[0].traceId must be a UUID"),
        ([{"queue": "q", "payload": 1, "producerSub": 1}], "producerSub must be a string"),
    ],
)
async def test_an_item_that_cannot_be_stored_fails_the_call_and_stores_nothing(
    broker: Broker, db: Db, queue: str, items: Any, message: str
) -> None:
    def named(item: Any) -> Any:  # the test's own queue names, so nothing else is counted
        if isinstance(item, dict) and isinstance(item.get("queue"), str) and item["queue"]:
            return dict(item, queue=queue + item["queue"])
        return item

    renamed = [named(i) for i in items] if isinstance(items, list) else items
    if message.startswith("items[1]"):  # a good item before the bad one is not stored either
        renamed[0] = {"queue": queue, "partition": "ok", "payload": "not stored"}
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        await call(db.url, "SELECT queen.push_messages_v2(%s::jsonb)", json.dumps(renamed))
    assert message in str(caught.value)
    assert await db.count_frames(f"{queue}%") == 0
    assert await db.value("SELECT count(*) FROM queen.queues WHERE name LIKE %s", f"{queue}%") == 0


async def test_v3_answers_items_with_their_queue_and_each_partitions_last_message(
    broker: Broker, db: Db, queue: str
) -> None:
    items = [
        {"queue": queue, "partition": "a", "transactionId": "1", "payload": 1},
        {"queue": queue, "partition": "b", "transactionId": "2", "payload": 2},
        {"queue": queue, "partition": "a", "transactionId": "3", "payload": 3},
        {"queue": queue, "partition": "a", "transactionId": "1", "payload": 4},
    ]
    answer = await call(db.url, "SELECT queen.push_messages_v3(%s::jsonb)", json.dumps(items))
    assert [(i["status"], i["queueName"]) for i in answer["items"]] == [
        ("queued", queue),
        ("queued", queue),
        ("queued", queue),
        ("duplicate", queue),
    ]
    last = {u["partition_id"]: u["last_message_id"] for u in answer["partition_updates"]}
    by_item = answer["items"]
    assert last == {
        by_item[2]["partition_id"]: by_item[2]["message_id"],
        by_item[1]["partition_id"]: by_item[1]["message_id"],
    }
    assert await call(db.url, "SELECT queen.push_messages_v3('[]')") == {
        "items": [],
        "partition_updates": [],
    }


async def test_pop_and_ack_from_sql_lease_and_release_like_http(
    broker: Broker, db: Db, queue: str
) -> None:
    await broker.configure(queue, {"retryDelay": 0})  # a failed message is back at once
    await broker.push(
        [{"queue": queue, "partition": "p", "transactionId": t, "payload": t} for t in "abc"]
    )
    request = {
        "idx": 0,
        "queue_name": queue,
        "partition_name": "p",
        "batch_size": 2,
        "worker_id": "w-1",
        "lease_seconds": 60,
        "sub_mode": "all",
        "sub_from": "",
    }
    missing = {"idx": 1, "queue_name": queue, "partition_name": "nope"}
    first = await call(
        db.url, "SELECT queen.pop_specific_batch(%s::jsonb)", json.dumps([request, missing])
    )
    assert [a["idx"] for a in first] == [0, 1]
    got = first[0]["result"]
    assert got["success"] and got["consumerGroup"] == "__QUEUE_MODE__"
    assert [m["transactionId"] for m in got["messages"]] == ["a", "b"]
    assert [m["data"] for m in got["messages"]] == ["a", "b"]
    assert first[1]["result"] == {"success": False, "error": "partition_not_found", "messages": []}

    # The lease holds: neither SQL nor HTTP gets those messages while it lives.
    again = await call(db.url, "SELECT queen.pop_specific_batch(%s::jsonb)", json.dumps([request]))
    assert again[0]["result"]["messages"] == [] and again[0]["result"]["leaseId"] is None
    assert (await broker.pop(queue, "p")).messages == []

    renewed = await call(
        db.url,
        "SELECT queen.renew_lease_v2(%s::jsonb)",
        json.dumps(
            [
                {"index": 0, "leaseId": got["leaseId"], "extendSeconds": 3600},
                {"index": 1, "leaseId": "00000000-0000-0000-0000-000000000000"},
                {"index": 2, "leaseId": "not-a-lease"},
            ]
        ),
    )
    assert [(r["index"], r["success"], r["error"]) for r in renewed] == [
        (0, True, None),
        (1, False, "Lease not found"),
        (2, False, "invalid leaseId"),
    ]
    until = datetime.fromisoformat(renewed[0]["expiresAt"].replace("Z", "+00:00"))
    assert until - datetime.now(UTC) > timedelta(minutes=50)  # the queue's lease is 5 minutes

    acks = [
        {
            "index": 0,
            "transactionId": "a",
            "partitionId": got["partitionId"],
            "leaseId": got["leaseId"],
            "status": "completed",
        },
        {
            "index": 1,
            "transactionId": "b",
            "partitionId": got["partitionId"],
            "leaseId": got["leaseId"],
            "status": "failed",
            "error": "boom",
        },
        {"index": 2, "transactionId": "c", "partitionId": "not-an-id"},
        {"index": 3, "transactionId": "c", "partitionId": got["partitionId"], "status": "odd"},
    ]
    answer = await call(db.url, "SELECT queen.ack_messages_v2(%s::jsonb)", json.dumps(acks))
    assert [(a["index"], a["success"]) for a in answer] == [
        (0, True),
        (1, True),
        (2, False),
        (3, False),
    ]
    assert answer[0]["queueName"] == queue and answer[0]["partitionName"] == "p"
    assert "partitionId" in answer[2]["error"] and "status must be" in answer[3]["error"]

    # "a" is done; "b" failed and comes back (the queue's retries), then "c".
    after = await broker.pop(queue, "p", batch=5, auto_ack=True)
    assert [m.transaction_id for m in after.messages] == ["b", "c"]


async def test_a_consumer_group_pops_from_sql_from_a_timestamp(
    broker: Broker, db: Db, queue: str
) -> None:
    await broker.push([{"queue": queue, "payload": "old"}])
    request = {
        "queue_name": queue,
        "partition_name": "Default",
        "consumer_group": "g",
        "batch_size": 5,
        "sub_mode": "new",
        "auto_ack": True,
    }
    answer = await call(db.url, "SELECT queen.pop_specific_batch(%s::jsonb)", json.dumps([request]))
    assert answer[0]["idx"] == 0 and answer[0]["result"]["messages"] == []  # new only
    await broker.push([{"queue": queue, "payload": "new"}])
    answer = await call(db.url, "SELECT queen.pop_specific_batch(%s::jsonb)", json.dumps([request]))
    assert [m["data"] for m in answer[0]["result"]["messages"]] == ["new"]
    assert answer[0]["result"]["leaseId"] is None  # auto-acknowledged

    bad = dict(request, consumer_group="h", sub_from="not a time")
    answer = await call(db.url, "SELECT queen.pop_specific_batch(%s::jsonb)", json.dumps([bad]))
    assert answer[0]["result"]["success"] is False
    assert answer[0]["result"]["error"].startswith("invalid_request")


async def test_an_encrypted_queue_is_refused_from_sql(broker: Broker, db: Db, queue: str) -> None:
    await broker.configure(queue, {"encryptionEnabled": True})
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="is encrypted"):
        await push_v2(db.url, [{"queue": queue, "payload": 1}])
    assert await db.count_frames(queue) == 0
    request = {"queue_name": queue, "partition_name": "Default"}
    await broker.push([{"queue": queue, "payload": "sealed or not"}])
    answer = await call(db.url, "SELECT queen.pop_specific_batch(%s::jsonb)", json.dumps([request]))
    assert answer[0]["result"]["error"] == "encrypted_queue"


async def test_the_view_is_not_mistaken_for_another_brokers_schema(broker: Broker, db: Db) -> None:
    kind = await db.value(
        "SELECT relkind::text FROM pg_class WHERE oid = 'queen.messages'::regclass"
    )
    assert kind == "v"
    with psycopg.connect(db.url) as conn:
        check_foreign_schema(conn)  # raises for the original broker's queen.messages table


async def test_pushes_from_sql_and_from_the_broker_at_once_keep_offsets_and_dedup_exact(
    broker: Broker, db: Db, queue: str
) -> None:
    """Both writers take the same partition rows in id order: every transaction id is stored
    once, at contiguous offsets, whichever of them wins each race."""
    partitions = ["a", "b", "c"]
    keys = [f"k{i}" for i in range(40)]

    def items(start: int) -> list[dict[str, Any]]:  # every key, to every partition, rotated
        rotated = keys[start:] + keys[:start]
        return [
            {"queue": queue, "partition": p, "transactionId": k, "payload": k}
            for k in rotated
            for p in partitions
        ]

    async def over_http(start: int) -> None:
        await broker.push(items(start))

    async def over_sql(start: int) -> None:
        await push_v2(db.url, items(start))

    async with trio.open_nursery() as nursery:
        for start in range(0, 40, 10):
            nursery.start_soon(over_http, start)
            nursery.start_soon(over_sql, start + 5)
    for p in partitions:
        frames = await db.frames(queue, p)
        assert [f["offset"] for f in frames] == list(range(len(keys)))
        assert sorted(f["transaction_id"] for f in frames) == sorted(keys)

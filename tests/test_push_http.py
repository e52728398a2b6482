"""Every rule of the push path, against the real PostgreSQL, through HTTP and the library."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
import trio

from queen.broker import Broker
from queen.http import render
from queen.ids import NIL_UUID
from queen.model import InvalidPush, PartitionKey
from tests.conftest import Db

PUSH = "/api/v1/push"


Post = Callable[[Any], Awaitable[tuple[int, Any]]]


@pytest.fixture(params=["http", "library"])
def post(request: pytest.FixtureRequest, broker: Broker, client: Any) -> Post:
    """Push a body through the HTTP route or through the embedding API; (status, answer)."""
    if request.param == "http":

        async def over_http(body: Any) -> tuple[int, Any]:
            resp = await client.post(
                PUSH, data=orjson.dumps(body), headers={"content-type": "application/json"}
            )
            return resp.status_code, await resp.get_json()

        return over_http

    async def in_process(body: Any) -> tuple[int, Any]:
        try:
            return 201, render.push_answer(await broker.push_service.push(body["items"]))
        except InvalidPush as exc:
            return 400, {"error": str(exc)}

    return in_process


def items(queue: str, *specs: tuple[str, str | None], payload: Any = None) -> dict[str, Any]:
    out = []
    for partition, tx in specs:
        item: dict[str, Any] = {"queue": queue, "partition": partition, "payload": payload}
        if tx is not None:
            item["transactionId"] = tx
        out.append(item)
    return {"items": out}


async def test_push_answers_201_with_one_result_per_item(post: Post, queue: str, db: Db) -> None:
    body = {
        "items": [
            {
                "queue": queue,
                "partition": "cust-42",
                "payload": {"orderId": 91, "total": 4200},
                "transactionId": "order-91-created",
            }
        ]
    }
    status, answer = await post(body)
    assert status == 201
    assert isinstance(answer, list) and len(answer) == 1
    result = answer[0]
    assert result["index"] == 0
    assert result["transaction_id"] == result["transactionId"] == "order-91-created"
    assert result["queueName"] == queue
    assert result["status"] == "queued"
    assert uuid.UUID(result["message_id"]).version == 7
    frames = await db.frames(queue, "cust-42")
    assert [f["message_id"] for f in frames] == [result["message_id"]]
    assert orjson.loads(frames[0]["payload"]) == {"orderId": 91, "total": 4200}


async def test_items_are_grouped_by_queue_and_partition(post: Post, queue: str, db: Db) -> None:
    other = queue + "-b"
    body = {
        "items": [
            {"queue": queue, "partition": "p1", "payload": 0},
            {"queue": other, "partition": "p1", "payload": 1},
            {"queue": queue, "partition": "p2", "payload": 2},
            {"queue": queue, "partition": "p1", "payload": 3},
        ]
    }
    status, answer = await post(body)
    assert status == 201
    assert [r["queueName"] for r in answer] == [queue, other, queue, queue]
    p1 = await db.frames(queue, "p1")
    assert [orjson.loads(f["payload"]) for f in p1] == [0, 3]
    assert [f["offset"] for f in p1] == [0, 1]
    assert len({f["segment"] for f in p1}) == 1  # one segment per partition per write
    assert [f["offset"] for f in await db.frames(queue, "p2")] == [0]
    assert [f["offset"] for f in await db.frames(other, "p1")] == [0]


async def test_body_order_at_consecutive_offsets_in_one_segment(
    post: Post, queue: str, db: Db
) -> None:
    body = {
        "items": [
            {"queue": queue, "partition": "p", "payload": i, "transactionId": f"tx-{i}"}
            for i in range(50)
        ]
    }
    status, answer = await post(body)
    assert status == 201
    frames = await db.frames(queue, "p")
    assert [f["offset"] for f in frames] == list(range(50))
    assert [f["transaction_id"] for f in frames] == [f"tx-{i}" for i in range(50)]
    assert [f["message_id"] for f in frames] == [r["message_id"] for r in answer]
    assert len({f["segment"] for f in frames}) == 1


@pytest.mark.parametrize("missing", ["payload", "queue"])
async def test_item_without_payload_or_queue_fails_the_whole_request(
    post: Post, queue: str, db: Db, missing: str
) -> None:
    good = {"queue": queue, "partition": "p", "payload": 1}
    bad = {"queue": queue, "partition": "p", "payload": 2}
    del bad[missing]
    status, answer = await post({"items": [good, bad]})
    assert status == 400
    assert missing in answer["error"]
    assert await db.count_frames(queue) == 0


async def test_payload_null_is_accepted(post: Post, queue: str, db: Db) -> None:
    status, answer = await post({"items": [{"queue": queue, "payload": None}]})
    assert status == 201 and answer[0]["status"] == "queued"
    frames = await db.frames(queue, "Default")
    assert [f["payload"] for f in frames] == ["null"]


async def test_partition_defaults_to_default(post: Post, queue: str, db: Db) -> None:
    status, answer = await post({"items": [{"queue": queue, "payload": 1}]})
    assert status == 201
    assert answer[0]["partition"] == "Default"
    assert len(await db.frames(queue, "Default")) == 1


async def test_empty_items_answers_201_empty_array(post: Post) -> None:
    assert await post({"items": []}) == (201, [])


async def test_missing_transaction_id_becomes_the_message_id(
    post: Post, queue: str, db: Db
) -> None:
    status, answer = await post({"items": [{"queue": queue, "payload": 1}]})
    assert status == 201
    assert answer[0]["transaction_id"] == answer[0]["message_id"]
    frames = await db.frames(queue, "Default")
    assert frames[0]["transaction_id"] == answer[0]["message_id"]


async def test_duplicate_push_names_the_original(post: Post, queue: str) -> None:
    body = items(queue, ("p", "test-transaction-id"))
    _, first = await post(body)
    status, second = await post(body)
    assert status == 201
    assert first[0]["status"] == "queued"
    assert second[0]["status"] == "duplicate"
    assert second[0]["message_id"] == first[0]["message_id"]


async def test_dedup_scope_is_one_partition(post: Post, queue: str) -> None:
    _, answer = await post(items(queue, ("a", "same"), ("b", "same")))
    assert [r["status"] for r in answer] == ["queued", "queued"]
    _, again = await post(items(queue, ("a", "same"), ("b", "same")))
    assert [r["status"] for r in again] == ["duplicate", "duplicate"]
    assert [r["message_id"] for r in again] == [r["message_id"] for r in answer]


async def test_first_wins_inside_one_body(post: Post, queue: str, db: Db) -> None:
    _, answer = await post(items(queue, ("p", "k"), ("p", "other"), ("p", "k")))
    assert [r["status"] for r in answer] == ["queued", "queued", "duplicate"]
    assert answer[2]["message_id"] == answer[0]["message_id"]
    assert [f["transaction_id"] for f in await db.frames(queue, "p")] == ["k", "other"]


async def test_first_wins_when_the_first_is_itself_a_duplicate(post: Post, queue: str) -> None:
    _, original = await post(items(queue, ("p", "k")))
    _, answer = await post(items(queue, ("p", "k"), ("p", "k")))
    assert [r["status"] for r in answer] == ["duplicate", "duplicate"]
    assert {r["message_id"] for r in answer} == {original[0]["message_id"]}


async def test_dedup_window_is_time_bounded(post: Post, queue: str, db: Db) -> None:
    _, first = await post(items(queue, ("p", "k")))
    await db.rows("UPDATE queen.queues SET dedup_window_seconds = 60 WHERE name = %s", queue)
    _, inside = await post(items(queue, ("p", "k")))
    assert inside[0]["status"] == "duplicate"
    # Age the history past the window instead of waiting for it.
    await db.rows(
        """UPDATE queen.dedup d SET created_at = d.created_at - interval '61 seconds'
           FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
           WHERE d.partition_id = p.id AND q.name = %s""",
        queue,
    )
    _, after = await post(items(queue, ("p", "k")))
    assert after[0]["status"] == "queued"
    assert after[0]["message_id"] != first[0]["message_id"]
    _, repeat = await post(items(queue, ("p", "k")))
    assert repeat[0]["status"] == "duplicate"
    assert repeat[0]["message_id"] == after[0]["message_id"]  # the newest one is the original


async def test_dedup_window_zero_disables_dedup(post: Post, queue: str, db: Db) -> None:
    await post(items(queue, ("p", "warm")))
    await db.rows("UPDATE queen.queues SET dedup_window_seconds = 0 WHERE name = %s", queue)
    _, answer = await post(items(queue, ("p", "k"), ("p", "k")))
    _, again = await post(items(queue, ("p", "k")))
    assert [r["status"] for r in answer + again] == ["queued"] * 3
    assert len({r["message_id"] for r in answer + again}) == 3
    assert [f["transaction_id"] for f in await db.frames(queue, "p")] == ["warm", "k", "k", "k"]


async def test_duplicate_of_a_removed_segment_answers_the_nil_uuid(
    post: Post, queue: str, db: Db
) -> None:
    await post(items(queue, ("p", "k")))
    await db.rows(
        """DELETE FROM queen.segments s USING queen.partitions p, queen.queues q
           WHERE s.partition_id = p.id AND p.queue_id = q.id AND q.name = %s""",
        queue,
    )
    _, answer = await post(items(queue, ("p", "k")))
    assert answer[0]["status"] == "duplicate"
    assert answer[0]["message_id"] == NIL_UUID


async def test_producer_sub_in_body_is_ignored_and_trace_id_dropped(
    post: Post, queue: str, db: Db
) -> None:
    body = {
        "items": [
            {"queue": queue, "payload": 1, "producerSub": "forged", "traceId": str(uuid.uuid4())}
        ]
    }
    status, _ = await post(body)
    assert status == 201
    frames = await db.frames(queue, "Default")
    assert frames[0]["sub"] is None
    assert frames[0]["trace"] is None
    assert (
        await db.value(
            """SELECT count(*) FROM queen.segments s
           JOIN queen.partitions p ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id
           WHERE q.name = %s AND (s.producer_subs IS NOT NULL OR s.trace_ids IS NOT NULL)""",
            queue,
        )
        == 0
    )


async def test_queues_and_partitions_are_created_on_first_push(
    post: Post, queue: str, db: Db
) -> None:
    assert await db.value("SELECT count(*) FROM queen.queues WHERE name = %s", queue) == 0
    await post(items(queue, ("new-partition", None)))
    row = await db.rows(
        """SELECT q.dedup_window_seconds, p.name, p.next_offset FROM queen.queues q
           JOIN queen.partitions p ON p.queue_id = q.id WHERE q.name = %s""",
        queue,
    )
    assert row == [(3600, "new-partition", 1)]


async def test_deleting_a_queue_cascades_and_it_comes_back(post: Post, queue: str, db: Db) -> None:
    _, first = await post(items(queue, ("p", "k")))
    await db.rows("DELETE FROM queen.queues WHERE name LIKE %s", queue)
    assert await db.count_frames(queue) == 0
    _, again = await post(items(queue, ("p", "k")))  # the live actor re-creates it
    assert again[0]["status"] == "queued"
    assert again[0]["message_id"] != first[0]["message_id"]
    assert [f["offset"] for f in await db.frames(queue, "p")] == [0]


async def test_embedding_api_gives_the_same_results(broker: Broker, queue: str, db: Db) -> None:
    results = await broker.push(
        [
            {"queue": queue, "partition": "p", "payload": {"a": 1}, "transactionId": "e1"},
            {"queue": queue, "partition": "p", "payload": 2, "transactionId": "e1"},
        ],
        producer_sub="svc-a",
    )
    assert [r.status for r in results] == ["queued", "duplicate"]
    first, second = results
    assert (first.index, first.queue, first.partition, first.transaction_id) == (
        0,
        queue,
        "p",
        "e1",
    )
    assert second.message_id == first.message_id  # a duplicate names the original
    frames = await db.frames(queue, "p")
    assert [f["sub"] for f in frames] == ["svc-a"]


async def test_100_concurrent_pushes_to_one_partition_get_contiguous_offsets(
    broker: Broker, queue: str, db: Db
) -> None:
    answers: dict[int, list] = {}

    async def push(i: int) -> None:
        answers[i] = await broker.push(
            [
                {
                    "queue": queue,
                    "partition": "hot",
                    "payload": [i, j],
                    "transactionId": f"r{i}-{j}",
                }
                for j in range(3)
            ]
        )

    async with trio.open_nursery() as nursery:
        for i in range(100):
            nursery.start_soon(push, i)
    frames = await db.frames(queue, "hot")
    assert [f["offset"] for f in frames] == list(range(300))  # no gap, no repeat
    by_tx = {f["transaction_id"]: f["offset"] for f in frames}
    for i in range(100):
        offsets = [by_tx[f"r{i}-{j}"] for j in range(3)]
        assert offsets == list(range(offsets[0], offsets[0] + 3))  # each request's run
        assert all(r.status == "queued" for r in answers[i])
    assert broker.metrics.push_requests_committed == 100
    assert broker.metrics.push_transactions < 100  # coalesced


async def test_several_partitions_commit_in_one_transaction(
    settings: Any, queue: str, db: Db
) -> None:
    from queen import open_broker
    from queen.storage.base import SegmentWrite

    async with open_broker(settings.with_changes(write_concurrency=1)) as broker:
        for i in range(8):
            await broker.push([{"queue": queue, "partition": f"p{i}", "payload": 0}])
        gate = trio.Event()
        real = broker.store.write_segments

        async def held(writes: list[SegmentWrite]) -> Any:
            await gate.wait()
            return await real(writes)

        broker.store.write_segments = held  # type: ignore[method-assign]
        before = broker.metrics.push_transactions
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker.push, [{"queue": queue, "partition": "p0", "payload": 1}])
            await trio.testing.wait_all_tasks_blocked()
            for i in range(1, 8):
                nursery.start_soon(
                    broker.push, [{"queue": queue, "partition": f"p{i}", "payload": 1}]
                )
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert broker.metrics.push_transactions - before == 2
        assert broker.metrics.max_partitions_per_transaction == 7
    for i in range(8):
        assert [f["offset"] for f in await db.frames(queue, f"p{i}")] == [0, 1]


async def test_two_brokers_on_one_database_keep_offsets_and_dedup_exact(
    settings: Any, queue: str, db: Db
) -> None:
    from queen import open_broker

    results: list[dict] = []

    async def producer(broker: Broker, who: int) -> None:
        for round_ in range(20):
            body = [
                {
                    "queue": queue,
                    "partition": f"p{k}",
                    "payload": [who, round_],
                    "transactionId": f"tx-{round_}-{k}",
                }
                for k in range(3)
            ]
            results.extend(await broker.push(body))

    async with (
        open_broker(settings) as a,
        open_broker(settings) as b,
        trio.open_nursery() as nursery,
    ):
        for who, broker in enumerate((a, b, a, b)):
            nursery.start_soon(producer, broker, who)
    for k in range(3):
        frames = await db.frames(queue, f"p{k}")
        assert [f["offset"] for f in frames] == list(range(20))
        assert sorted(f["transaction_id"] for f in frames) == sorted(
            f"tx-{r}-{k}" for r in range(20)
        )
    stored = {
        f["transaction_id"]: f["message_id"]
        for k in range(3)
        for f in await db.frames(queue, f"p{k}")
    }
    assert sum(r.status == "queued" for r in results) == 60
    assert sum(r.status == "duplicate" for r in results) == 180
    for r in results:  # every answer names the one stored message of its key
        assert r.message_id == stored[r.transaction_id]


async def test_body_between_quarts_default_limit_and_ours_is_accepted(
    client: Any, queue: str, db: Db
) -> None:
    """Quart refuses bodies over 16 MiB by default; QUEEN_MAX_BODY_BYTES (64 MiB) must rule."""
    payload = "x" * (17 * 1024 * 1024)
    raw = orjson.dumps({"items": [{"queue": queue, "payload": payload}]})
    resp = await client.post(PUSH, data=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 201
    assert await db.count_frames(queue) == 1


async def test_values_holding_the_column_separator_are_stored_exactly(
    broker: Broker, queue: str, db: Db
) -> None:
    sub = "team\x1fservice"  # a producer identity is trusted as given
    results = await broker.push(
        [{"queue": queue, "partition": "p", "payload": {"s": "a\u001fb"}, "transactionId": "x"}],
        producer_sub=sub,
    )
    assert results[0].status == "queued"
    frames = await db.frames(queue, "p")
    assert frames[0]["sub"] == sub
    assert orjson.loads(frames[0]["payload"]) == {"s": "a\u001fb"}


async def test_many_new_partitions_are_created_in_one_round(
    broker: Broker, queue: str, db: Db
) -> None:
    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(broker.push, [{"queue": queue, "partition": f"n{i}", "payload": i}])
    names = await db.rows(
        "SELECT p.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id "
        "WHERE q.name = %s",
        queue,
    )
    assert sorted(n for (n,) in names) == sorted(f"n{i}" for i in range(50))
    other = queue + "-b"
    keys = [
        PartitionKey(queue, "n3"),
        PartitionKey(other, "n3"),
        PartitionKey(queue, "brand-new"),
        PartitionKey(queue, "n3"),
    ]
    ids = await broker.store.ensure_partitions(keys)  # type: ignore[attr-defined]
    assert ids[0] == ids[3] and len(set(ids)) == 3
    stored = dict(
        await db.rows(
            "SELECT q.name || '/' || p.name, p.id FROM queen.partitions p "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name IN (%s, %s)",
            queue,
            other,
        )
    )
    assert ids == [stored[f"{k.queue}/{k.partition}"] for k in keys]

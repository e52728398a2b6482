"""The streams routes on the real database: registration, atomic cycles, state reads."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
import trio

from queen.auth import build_gate
from queen.broker import Broker
from queen.cipher import PREFIX
from queen.http.app import create_app
from queen.lifecycle import open_broker
from queen.settings import Settings
from tests.conftest import Db
from tests.consuming import Api, data_of
from tests.jwt_tools import SECRET as JWT_SECRET
from tests.jwt_tools import bearer, claims, hs256

SECRET = {"card": "4111-1111-1111-1111"}


async def register(api: Api, name: str, source: str, sink: str | None, **extra: Any) -> Any:
    body: dict[str, Any] = {"name": name, "source_queue": source, "config_hash": "h1"}
    if sink is not None:
        body["sink_queue"] = sink
    body.update(extra)
    return await api.post("/streams/v1/queries", body)


async def query_id(api: Api, queue: str) -> str:
    status, body = await register(api, f"q-{queue}", queue, f"{queue}-sink")
    assert status == 200, body
    return body["query_id"]  # type: ignore[no-any-return]


async def state(api: Api, qid: str, pid: str, **extra: Any) -> dict[str, Any]:
    status, body = await api.post(
        "/streams/v1/state/get", {"query_id": qid, "partition_id": pid, **extra}
    )
    assert status == 200 and body["success"] is True, body
    return {row["key"]: row["value"] for row in body["rows"]}


def cycle_body(qid: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    last = messages[-1]
    body: dict[str, Any] = {
        "query_id": qid,
        "partition_id": last["partitionId"],
        "consumer_group": None,
        "state_ops": [],
        "push_items": [],
        "ack": {
            "transactionId": last["transactionId"],
            "leaseId": last["leaseId"],
            "status": "completed",
            "count": len(messages),
        },
    }
    body.update(extra)
    return body


async def test_register_is_idempotent_and_refuses_a_changed_hash(api: Api, queue: str) -> None:
    status, first = await register(api, f"q-{queue}", queue, f"{queue}-sink")
    assert status == 200
    assert first["success"] is True and first["fresh"] is True and first["reset"] is False
    assert uuid.UUID(first["query_id"]) and first["name"] == f"q-{queue}"
    status, again = await register(api, f"q-{queue}", queue, None)
    assert status == 200 and again["fresh"] is False and again["query_id"] == first["query_id"]
    status, refused = await register(api, f"q-{queue}", queue, None, config_hash="h2")
    assert status == 409 and refused["success"] is False
    assert "config_hash mismatch" in refused["error"]


async def test_reset_wipes_the_state_and_takes_the_new_hash(api: Api, queue: str) -> None:
    qid = await query_id(api, queue)
    pushed = await api.push(queue, "p", {"n": 1})
    pid = pushed[0]["partition"]
    [message] = await api.messages(queue, pid)
    ops = [{"type": "upsert", "key": "k", "value": {"count": 1}}]
    status, done = await api.post("/streams/v1/cycle", cycle_body(qid, [message], state_ops=ops))
    assert status == 200 and done["success"] is True, done
    assert await state(api, qid, message["partitionId"]) == {"k": {"count": 1}}

    status, reset = await register(api, f"q-{queue}", queue, None, config_hash="h2", reset=True)
    assert status == 200 and reset["reset"] is True and reset["query_id"] == qid
    assert await state(api, qid, message["partitionId"]) == {}
    status, same = await register(api, f"q-{queue}", queue, None, config_hash="h2")
    assert status == 200 and same["reset"] is False


async def test_a_cycle_applies_state_pushes_and_the_ack_together(
    api: Api, queue: str, db: Db
) -> None:
    qid = await query_id(api, queue)
    sink = f"{queue}-sink"
    await api.push(queue, "p", {"n": 1}, {"n": 2}, {"n": 3})
    messages = await api.messages(queue, "p", batch=3)
    assert len(messages) == 3
    pid = messages[0]["partitionId"]
    await api.post(
        "/streams/v1/cycle",
        {
            "query_id": qid,
            "partition_id": pid,
            "ack": None,
            "state_ops": [{"type": "upsert", "key": "gone", "value": 1}],
        },
    )
    body = cycle_body(
        qid,
        messages,
        state_ops=[
            {"type": "upsert", "key": "b", "value": {"sum": 6}},
            {"type": "upsert", "key": "a", "value": [1]},
            {"type": "upsert", "key": "a", "value": [1, 2]},
            {"type": "delete", "key": "gone"},
        ],
        push_items=[
            {"queue": sink, "partition": "p", "payload": {"sum": 6}, "transactionId": "s1"},
            {"queue": sink, "partition": "p", "payload": {"sum": 7}},
        ],
    )
    status, done = await api.post("/streams/v1/cycle", body)
    assert status == 200, done
    assert done["success"] is True and done["state_ops_applied"] == 4
    assert done["query_id"] == qid and done["partition_id"] == pid
    assert done["queueName"] == queue
    assert done["ack_result"] == {"success": True, "count": 3, "lease_released": True, "dlq": False}
    assert [(r["index"], r["status"], r["queueName"]) for r in done["push_results"]] == [
        (0, "queued", sink),
        (1, "queued", sink),
    ]
    assert done["push_results"][0]["transaction_id"] == "s1"
    assert await state(api, qid, pid) == {"a": [1, 2], "b": {"sum": 6}}
    assert await api.messages(queue, "p") == []
    assert data_of(await api.messages(sink, "p", batch=5)) == [{"sum": 6}, {"sum": 7}]

    # the same sink transaction id again is a duplicate, as on the push route
    [again] = await api.push(queue, "p", {"n": 4})
    [fourth] = await api.messages(queue, "p")
    assert fourth["transactionId"] == again["transactionId"]
    body = cycle_body(
        qid,
        [fourth],
        push_items=[{"queue": sink, "partition": "p", "payload": {}, "transactionId": "s1"}],
    )
    status, dup = await api.post("/streams/v1/cycle", body)
    assert status == 200 and dup["push_results"][0]["status"] == "duplicate"
    assert dup["push_results"][0]["message_id"] == done["push_results"][0]["message_id"]


async def test_a_stale_lease_changes_nothing(api: Api, queue: str, db: Db) -> None:
    qid = await query_id(api, queue)
    sink = f"{queue}-sink"
    await api.push(queue, "p", {"n": 1})
    [message] = await api.messages(queue, "p")
    stale = {**message, "leaseId": str(uuid.uuid4())}
    body = cycle_body(
        qid,
        [stale],
        state_ops=[{"type": "upsert", "key": "k", "value": 1}],
        push_items=[{"queue": sink, "payload": {"x": 1}}],
    )
    status, refused = await api.post("/streams/v1/cycle", body)
    assert status == 200 and refused["success"] is False
    assert refused["error"] == "Invalid or expired lease"
    assert await state(api, qid, message["partitionId"]) == {}
    assert await db.count_frames(f"{sink}%") == 0
    # the live lease still holds the message: the right lease commits it
    status, done = await api.post("/streams/v1/cycle", cycle_body(qid, [message]))
    assert status == 200 and done["success"] is True


async def test_a_partial_ack_keeps_the_lease_and_the_rest_of_the_batch(
    api: Api, queue: str, db: Db
) -> None:
    qid = await query_id(api, queue)
    await api.push(queue, "p", {"n": 1}, {"n": 2}, {"n": 3})
    messages = await api.messages(queue, "p", batch=3)
    status, done = await api.post(
        "/streams/v1/cycle", cycle_body(qid, messages[:2], release_lease=False)
    )
    assert status == 200 and done["ack_result"]["lease_released"] is False
    assert done["ack_result"]["count"] == 2
    # still leased: nobody else gets the third message; the lease then commits it
    assert await api.messages(queue, "p") == []
    status, last = await api.post("/streams/v1/cycle", cycle_body(qid, messages[2:]))
    assert status == 200 and last["success"] is True
    assert last["ack_result"]["count"] == 1 and last["ack_result"]["lease_released"] is True


async def test_state_get_by_keys_prefix_and_ripeness(api: Api, queue: str) -> None:
    qid = await query_id(api, queue)
    ops = [
        {"type": "upsert", "key": "w\u001fa", "value": {"windowEnd": 1000, "acc": 1}},
        {"type": "upsert", "key": "w\u001fb", "value": {"windowEnd": 2000.5, "acc": 2}},
        {"type": "upsert", "key": "x", "value": "plain"},
    ]
    status, done = await api.post(
        "/streams/v1/cycle", {"query_id": qid, "partition_id": "7", "state_ops": ops}
    )
    assert status == 200 and done["success"] is True and done["ack_result"] is None
    assert set(await state(api, qid, "7")) == {"w\u001fa", "w\u001fb", "x"}
    assert await state(api, qid, "7", keys=["x", "nope"]) == {"x": "plain"}
    assert set(await state(api, qid, "7", key_prefix="w\u001f")) == {"w\u001fa", "w\u001fb"}
    ripe = await state(api, qid, "7", key_prefix="w\u001f", ripe_at_or_before=1500)
    assert ripe == {"w\u001fa": {"windowEnd": 1000, "acc": 1}}
    assert await state(api, qid, "8") == {}


_WAITING = """SELECT count(DISTINCT l.pid) FROM pg_locks l
              JOIN pg_stat_activity a ON a.pid = l.pid
              WHERE NOT l.granted AND a.datname = current_database()"""


async def _until_waiting(db: Db, backends: int) -> None:
    with trio.fail_after(30):
        while await db.value(_WAITING) < backends:  # noqa: ASYNC110 (a state of the server)
            await trio.sleep(0.005)


async def test_a_state_read_sent_during_a_cycle_reads_what_the_cycle_left(
    api: Api, queue: str, db: Db, pg_url: str
) -> None:
    """A cycle holds its (query, partition) shard from its start to its commit, and a state
    read of the shard sent meanwhile waits for it: two runners of one query (an idle flush
    beside the main loop) never both read a window that one of them is closing."""
    qid = await query_id(api, queue)
    await api.push(queue, "p", {"n": 1})
    [message] = await api.messages(queue, "p")
    pid = message["partitionId"]
    window = {"type": "upsert", "key": "w", "value": {"windowEnd": 1, "acc": 1}}
    status, done = await api.post(
        "/streams/v1/cycle", {"query_id": qid, "partition_id": pid, "state_ops": [window]}
    )
    assert status == 200 and done["success"] is True
    closing = cycle_body(qid, [message], state_ops=[{"type": "delete", "key": "w"}])
    answers: list[Any] = []
    reads: list[dict[str, Any]] = []

    async def run_cycle() -> None:
        answers.append(await api.post("/streams/v1/cycle", closing))

    async def read() -> None:
        reads.append(await state(api, qid, pid, ripe_at_or_before=5))

    with psycopg.connect(pg_url) as gate:  # holds the source cursor row: the ack waits
        gate.execute("SELECT 1 FROM queen.cursors WHERE partition_id = %s FOR UPDATE", (int(pid),))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_cycle)
            await _until_waiting(db, 1)  # the cycle, its shard taken, waits for the row
            nursery.start_soon(read)
            await _until_waiting(db, 2)  # the read waits for the shard
            assert reads == []
            gate.rollback()
    [(status, done)] = answers
    assert status == 200 and done["success"] is True and done["state_ops_applied"] == 1
    assert reads == [{}]


WINDOW = {"type": "upsert", "key": "w", "value": {"windowEnd": 1000, "acc": 1}}
CLOSE = {"type": "delete", "key": "w"}


async def _main_loop_opened_a_window(api: Api, queue: str) -> tuple[str, str]:
    """A query whose main loop popped and acknowledged one message of ``queue``/p (queue
    mode) in a cycle that opened window ``w``, ripe at 1000 ms; one more message waits."""
    qid = await query_id(api, queue)
    await api.push(queue, "p", {"n": 1})
    [first] = await api.messages(queue, "p")
    status, done = await api.post("/streams/v1/cycle", cycle_body(qid, [first], state_ops=[WINDOW]))
    assert status == 200 and done["success"] is True, done
    await api.push(queue, "p", {"n": 2})
    return qid, first["partitionId"]


def flush_cycle(qid: str, pid: str, sink: str) -> dict[str, Any]:
    """The idle flush's cycle: it closes the window it read, no ack."""
    return {
        "query_id": qid,
        "partition_id": pid,
        "ack": None,
        "release_lease": True,
        "state_ops": [CLOSE],
        "push_items": [{"queue": sink, "partition": "p", "payload": {"acc": 1}}],
    }


async def test_an_idle_flush_holds_the_partition_from_its_read_to_its_cycle(
    api: Api, queue: str, db: Db
) -> None:
    """Between the flush's read of a ripe window and its cycle closing it, the main loop
    cannot pop the partition, so it cannot read that window and close it a second time."""
    qid, pid = await _main_loop_opened_a_window(api, queue)
    assert await state(api, qid, pid, ripe_at_or_before=1500) == {"w": WINDOW["value"]}
    held = await db.rows(
        "SELECT lease_id::text, lease_end = next_offset, lease_expires_at > now() "
        "FROM queen.cursors WHERE partition_id = %s",
        int(pid),
    )
    assert held == [(qid, True, True)]  # a lease of no message, the query's
    assert await api.messages(queue, "p") == []  # the main loop's pop: not now

    status, done = await api.post("/streams/v1/cycle", flush_cycle(qid, pid, f"{queue}-sink"))
    assert status == 200 and done["success"] is True, done
    [second] = await api.messages(queue, "p")  # the hold ended with the flush's cycle
    assert data_of([second]) == [{"n": 2}]
    assert await state(api, qid, pid) == {}  # what the main loop reads: the window is closed
    assert data_of(await api.messages(f"{queue}-sink", "p", batch=5)) == [{"acc": 1}]


async def test_an_idle_flush_finds_nothing_ripe_while_the_main_loop_holds_the_partition(
    api: Api, queue: str, db: Db
) -> None:
    qid, pid = await _main_loop_opened_a_window(api, queue)
    [second] = await api.messages(queue, "p")  # the main loop's cycle is under way
    assert await state(api, qid, pid, ripe_at_or_before=1500) == {}
    assert await state(api, qid, pid) == {"w": WINDOW["value"]}  # (the main loop's own read)
    status, done = await api.post("/streams/v1/cycle", cycle_body(qid, [second], state_ops=[CLOSE]))
    assert status == 200 and done["ack_result"]["lease_released"] is True
    assert await state(api, qid, pid, ripe_at_or_before=1500) == {}  # closed once, by it
    # the main loop's lease was never the flush's to end: no hold was taken
    assert (
        await db.value(
            "SELECT count(*) FROM queen.cursors WHERE partition_id = %s AND lease_id IS NOT NULL",
            int(pid),
        )
        == 0
    )


async def test_a_lapsed_hold_frees_the_partition_and_its_late_cycle_ends_no_lease(
    api: Api, queue: str, db: Db
) -> None:
    """A flush that never sends its cycle holds the partition for 10 s at most; a cycle sent
    after that ends only the flush's own hold, never the lease a pop took since."""
    qid, pid = await _main_loop_opened_a_window(api, queue)
    assert await state(api, qid, pid, ripe_at_or_before=1500) == {"w": WINDOW["value"]}
    lapsed = await db.rows(
        "UPDATE queen.cursors SET lease_expires_at = now() - interval '1 second'"
        " WHERE partition_id = %s AND lease_id = %s::uuid RETURNING 1",
        int(pid),
        qid,
    )
    assert lapsed == [(1,)]
    [second] = await api.messages(queue, "p")  # claimable again
    status, done = await api.post("/streams/v1/cycle", flush_cycle(qid, pid, f"{queue}-sink"))
    assert status == 200 and done["success"] is True
    assert (await api.ack(second))["success"] is True  # the pop's lease stood


async def test_the_flush_cycle_wakes_a_pop_waiting_for_the_held_partition(
    settings: Settings, queue: str
) -> None:
    """A pop that found the partition held waits; the flush's cycle wakes it (a re-check
    would come only when the hold lapses, 10 s later)."""
    async with open_broker(settings.with_changes(pop_recheck_ms=60_000)) as broker:
        api = Api(create_app(broker).test_client())
        qid, pid = await _main_loop_opened_a_window(api, queue)
        assert await state(api, qid, pid, ripe_at_or_before=1500) == {"w": WINDOW["value"]}
        got: list[Any] = []
        with trio.fail_after(8):
            async with trio.open_nursery() as nursery:

                async def wait() -> None:
                    got.append(await api.messages(queue, "p", wait="true", timeout=30_000))

                nursery.start_soon(wait)
                await broker.consume.wakeups.until_waiting(1)
                status, done = await api.post(
                    "/streams/v1/cycle", flush_cycle(qid, pid, f"{queue}-sink")
                )
                assert status == 200 and done["success"] is True
        assert [data_of(m) for m in got] == [[{"n": 2}]]


async def test_an_unknown_query_is_404_and_changes_nothing(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", {"n": 1})
    [message] = await api.messages(queue, "p")
    body = cycle_body(
        str(uuid.uuid4()), [message], push_items=[{"queue": f"{queue}-s", "payload": 1}]
    )
    status, answer = await api.post("/streams/v1/cycle", body)
    assert status == 404 and "unknown query_id" in answer["error"]
    assert await db.count_frames(f"{queue}-s%") == 0
    status, _ = await api.post(
        "/streams/v1/state/get", {"query_id": str(uuid.uuid4()), "partition_id": "1"}
    )
    assert status == 404
    # the message is still leased and pending: an ack with its lease succeeds
    assert (await api.ack(message))["success"] is True


@pytest.mark.parametrize(
    ("path", "body", "error"),
    [
        ("/streams/v1/queries", [], "request body must be a JSON object"),
        ("/streams/v1/queries", {"source_queue": "s", "config_hash": "h"}, "name is required"),
        ("/streams/v1/queries", {"name": "n", "config_hash": "h"}, "source_queue is required"),
        ("/streams/v1/queries", {"name": "n", "source_queue": "s"}, "config_hash is required"),
        (
            "/streams/v1/queries",
            {"name": "n", "source_queue": "s", "config_hash": 1},
            "config_hash must be a string",
        ),
        (
            "/streams/v1/queries",
            {"name": "n", "source_queue": "s", "config_hash": "h", "reset": "yes"},
            "reset must be true or false",
        ),
        ("/streams/v1/cycle", {"partition_id": "1"}, "query_id is required"),
        ("/streams/v1/cycle", {"query_id": "nope", "partition_id": "1"}, "query_id must be a UUID"),
        (
            "/streams/v1/cycle",
            {"query_id": str(uuid.UUID(int=1)), "partition_id": "x"},
            "partition_id must be",
        ),
        (
            "/streams/v1/cycle",
            {
                "query_id": str(uuid.UUID(int=1)),
                "partition_id": "1",
                "state_ops": [{"type": "merge", "key": "k"}],
            },
            "state_ops[0].type must be",
        ),
        (
            "/streams/v1/cycle",
            {
                "query_id": str(uuid.UUID(int=1)),
                "partition_id": "1",
                "state_ops": [{"type": "upsert", "key": ""}],
            },
            "state_ops[0].key is required",
        ),
        (
            "/streams/v1/cycle",
            {
                "query_id": str(uuid.UUID(int=1)),
                "partition_id": "1",
                "state_ops": [{"type": "upsert", "key": "k", "value": "a\u0000"}],
            },
            "NUL",
        ),
        (
            "/streams/v1/cycle",
            {
                "query_id": str(uuid.UUID(int=1)),
                "partition_id": "1",
                "push_items": [{"payload": 1}],
            },
            "push_items: items[0].queue is required",
        ),
        (
            "/streams/v1/cycle",
            {
                "query_id": str(uuid.UUID(int=1)),
                "partition_id": "1",
                "ack": {"status": "completed"},
            },
            "ack.transactionId is required",
        ),
        (
            "/streams/v1/cycle",
            {
                "query_id": str(uuid.UUID(int=1)),
                "partition_id": "1",
                "ack": {"transactionId": "t", "status": "retry"},
            },
            "ack.status must be",
        ),
        (
            "/streams/v1/cycle",
            {"query_id": str(uuid.UUID(int=1)), "partition_id": "1", "release_lease": 1},
            "release_lease must be",
        ),
        (
            "/streams/v1/state/get",
            {"query_id": str(uuid.UUID(int=1)), "partition_id": "1", "keys": "k"},
            "keys must be an array",
        ),
        (
            "/streams/v1/state/get",
            {"query_id": str(uuid.UUID(int=1)), "partition_id": "1", "ripe_at_or_before": "5"},
            "ripe_at_or_before must be a number",
        ),
    ],
)
async def test_bad_bodies_are_400_and_change_nothing(
    api: Api, db: Db, path: str, body: Any, error: str
) -> None:
    before = await db.value("SELECT count(*) FROM queen_streams.queries")
    status, answer = await api.post(path, body)
    assert status == 400 and error in answer["error"], answer
    assert await db.value("SELECT count(*) FROM queen_streams.queries") == before


async def test_sink_pushes_to_an_encrypted_queue_are_sealed(
    settings: Settings, db: Db, queue: str
) -> None:
    sink = f"{queue}-sink"
    async with open_broker(settings.with_changes(encryption_key="11" * 32)) as broker:
        api = Api(create_app(broker).test_client())
        await api.configure(sink, encryptionEnabled=True)
        qid = await query_id(api, queue)
        await api.push(queue, "p", {"n": 1})
        [message] = await api.messages(queue, "p")
        body = cycle_body(qid, [message], push_items=[{"queue": sink, "payload": SECRET}])
        status, done = await api.post("/streams/v1/cycle", body)
        assert status == 200 and done["success"] is True, done
        [stored] = await db.rows(
            "SELECT s.payloads[1] FROM queen.segments s "
            "JOIN queen.partitions p ON p.id = s.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s",
            sink,
        )
        assert stored[0].startswith(PREFIX) and "4111" not in stored[0]
        assert data_of(await api.messages(sink)) == [SECRET]


async def test_a_cycle_is_refused_while_a_sink_partition_cannot_be_written(
    broker: Broker, api: Api, queue: str, db: Db
) -> None:
    """Maintenance mode: sink pushes would have to be spooled, so the cycle is refused with
    503 and Retry-After, and neither the ack nor the state is applied."""
    qid = await query_id(api, queue)
    await api.push(queue, "p", {"n": 1})
    [message] = await api.messages(queue, "p")
    await broker.set_maintenance(True)
    try:
        body = cycle_body(
            qid,
            [message],
            state_ops=[{"type": "upsert", "key": "k", "value": 1}],
            push_items=[{"queue": f"{queue}-sink", "payload": 1}],
        )
        resp = await api.client.post("/streams/v1/cycle", json=body)
        assert resp.status_code == 503 and resp.headers["Retry-After"]
        assert "maintenance" in (await resp.get_json())["error"]
    finally:
        await broker.set_maintenance(False)
    assert await state(api, qid, message["partitionId"]) == {}
    assert await db.count_frames(f"{queue}-sink%") == 0
    assert (await api.ack(message))["success"] is True  # still leased, not acked


async def test_sink_pushes_are_stamped_with_the_callers_sub_and_need_read_write(
    broker: Broker, queue: str, db: Db
) -> None:
    settings = broker.settings.with_changes(jwt_enabled=True, jwt_secret=JWT_SECRET)
    client = create_app(broker, gate=build_gate(settings)).test_client()
    caller = bearer(hs256(claims(sub="svc-stream", roles=["read-write"])))
    write_only = bearer(hs256(claims(sub="svc-w", roles=["write-only"])))
    register_body = {"name": f"q-{queue}", "source_queue": queue, "config_hash": "h"}
    resp = await client.post("/streams/v1/queries", json=register_body, headers=write_only)
    assert resp.status_code == 403
    resp = await client.post("/streams/v1/queries", json=register_body, headers=caller)
    qid = (await resp.get_json())["query_id"]
    body = {
        "query_id": qid,
        "partition_id": "1",
        "push_items": [{"queue": queue, "partition": "p", "payload": 1, "producerSub": "forged"}],
    }
    for path in ("/streams/v1/cycle", "/streams/v1/state/get"):
        resp = await client.post(path, json=body, headers=write_only)
        assert resp.status_code == 403
    resp = await client.post("/streams/v1/cycle", json=body, headers=caller)
    assert resp.status_code == 200 and (await resp.get_json())["success"] is True
    assert [f["sub"] for f in await db.frames(queue, "p")] == ["svc-stream"]


async def test_a_failed_ack_sends_the_named_message_to_the_dlq(
    api: Api, queue: str, db: Db
) -> None:
    qid = await query_id(api, queue)
    await api.push(queue, "p", {"n": 1}, {"n": 2}, {"n": 3})
    messages = await api.messages(queue, "p", batch=3)
    body = cycle_body(qid, messages[:2], state_ops=[{"type": "upsert", "key": "k", "value": 1}])
    body["ack"] |= {"status": "failed", "error": "poison"}
    status, done = await api.post("/streams/v1/cycle", body)
    assert status == 200 and done["success"] is True, done
    assert done["ack_result"] == {"success": True, "count": 2, "lease_released": True, "dlq": True}
    assert await state(api, qid, messages[0]["partitionId"]) == {"k": 1}
    status, page = await api.get(f"/api/v1/dlq?queue={queue}")
    assert status == 200
    assert [(m["data"], m["errorMessage"]) for m in page["messages"]] == [({"n": 2}, "poison")]
    # the lease is released: the third message comes back at once
    assert data_of(await api.messages(queue, "p", batch=3)) == [{"n": 3}]

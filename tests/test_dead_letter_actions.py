"""The operator's actions through HTTP: retry a dead letter (one, or a queue's filter), move a
message to a DLQ by hand, clear a queue or a partition, and deleting a message with its dead
letters. Each is checked by what consumers receive afterwards, and bad input changes nothing."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from queen.auth import build_gate
from queen.broker import Broker
from queen.http.app import create_app
from tests.conftest import Db
from tests.consuming import Api, data_of, end_retry_delays
from tests.jwt_tools import SECRET, bearer, claims, hs256


async def dlq_total(api: Api, queue: str, group: str | None = None) -> int:
    extra = f"&consumerGroup={group}" if group else ""
    status, page = await api.get(f"/api/v1/dlq?queue={queue}{extra}")
    assert status == 200
    return int(page["total"])


async def dead_letter_first(api: Api, queue: str, group: str | None = None) -> dict[str, Any]:
    """Pop one message for ``group`` and send it to the DLQ; returns the message."""
    [message] = await api.messages(queue, batch=1, consumerGroup=group)
    answer = await api.ack(message, "dlq", group=group, error="boom")
    assert answer["dlq"] is True
    return message  # type: ignore[no-any-return]


async def consume_all(api: Api, queue: str, group: str | None = None) -> list[Any]:
    """Pop and complete everything ``group`` can get now; returns the payloads in order."""
    seen: list[Any] = []
    while batch := await api.messages(queue, batch=10, consumerGroup=group):
        seen += data_of(batch)
        for m in batch:
            await api.ack(m, group=group)
    return seen


async def test_a_retry_goes_back_to_the_group_that_gave_up_only(api: Api, queue: str) -> None:
    await api.push(queue, "p", "m1", "m2", "m3", tx=["t1", "t2", "t3"])
    first = await dead_letter_first(api, queue, "ga")
    assert await consume_all(api, queue, "ga") == ["m2", "m3"]
    assert await consume_all(api, queue, "gb") == ["m1", "m2", "m3"]
    assert await consume_all(api, queue) == ["m1", "m2", "m3"]
    pid = first["partitionId"]

    status, body = await api.post(f"/api/v1/messages/{pid}/t1/retry")
    assert status == 200, body
    assert body["retried"] is True and body["partitionId"] == pid
    assert body["transactionId"] == "t1" and body["consumerGroups"] == ["ga"]
    assert await dlq_total(api, queue) == 0
    await api.push(queue, "p", "m4", tx=["t4"])

    # ga gets the message again, before what was pushed after the retry, with no retries
    again = await api.messages(queue, batch=10, consumerGroup="ga")
    assert data_of(again) == ["m1", "m4"]
    assert again[0]["transactionId"] == "t1" and again[0]["retryCount"] == 0
    # the others only get what was pushed after
    assert await consume_all(api, queue, "gb") == ["m4"]
    assert await consume_all(api, queue) == ["m4"]

    status, body = await api.post(f"/api/v1/messages/{pid}/t1/retry")
    assert (status, body["retried"], body["consumerGroups"]) == (200, False, [])
    status, body = await api.post(f"/api/v1/messages/{pid}/never-pushed/retry")
    assert status == 404 and body["error"] == "Message not found"
    status, body = await api.post("/api/v1/messages/notanid/t1/retry")
    assert status == 400


async def test_a_retried_message_starts_its_retry_count_again(api: Api, queue: str, db: Db) -> None:
    await api.configure(queue, retryLimit=1, retryDelay=0)
    await api.push(queue, "p", "x", tx=["tx"])
    for _ in range(2):  # one retry allowed, then the DLQ
        [m] = await api.messages(queue, batch=1)
        await api.ack(m, "failed", error="nope")
        await end_retry_delays(db, queue)
    status, page = await api.get(f"/api/v1/dlq?queue={queue}")
    assert page["total"] == 1 and page["messages"][0]["retryCount"] == 1
    assert await api.messages(queue, batch=1) == []

    status, body = await api.post(f"/api/v1/messages/{m['partitionId']}/tx/retry")
    assert status == 200 and body["consumerGroups"] == ["__QUEUE_MODE__"]
    [again] = await api.messages(queue, batch=1)
    assert (again["data"], again["retryCount"]) == ("x", 0)
    await api.ack(again, "failed", error="still")  # one retry again before the DLQ
    assert await dlq_total(api, queue) == 0


async def test_a_retry_keeps_the_dedup_answer_of_its_transaction_id(api: Api, queue: str) -> None:
    await api.push(queue, "p", "m", tx=["dup"])
    m = await dead_letter_first(api, queue)
    status, _ = await api.post(f"/api/v1/messages/{m['partitionId']}/dup/retry")
    assert status == 200
    [answer] = await api.push(queue, "p", "again", tx=["dup"])
    assert answer["status"] == "duplicate"
    assert data_of(await api.messages(queue, batch=10)) == ["m"]


async def test_bulk_retry_takes_a_queue_a_group_or_a_partition(api: Api, queue: str) -> None:
    await api.push(queue, "p1", "a1", "a2")
    await api.push(queue, "p2", "b1")
    for _ in range(3):
        await dead_letter_first(api, queue)
    await dead_letter_first(api, queue, "g")
    assert await dlq_total(api, queue) == 4
    before = await dlq_total(api, queue)

    for bad in (
        {},
        {"queue": queue, "bogus": 1},
        {"queue": queue, "from": "yesterday"},
        {"queue": queue, "from": "2030-01-02T00:00:00Z", "to": "2030-01-01T00:00:00Z"},
        {"queue": 5},
        [queue],
        {"queue": queue, "partition": ""},
    ):
        status, body = await api.post("/api/v1/dlq/retry", bad)
        assert status == 400 and "error" in body, (bad, body)
    resp = await api.client.post(
        "/api/v1/dlq/retry", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 400
    status, _ = await api.post("/api/v1/dlq/retry", {"queue": f"never-{queue}"})
    assert status == 404
    assert await dlq_total(api, queue) == before

    status, body = await api.post("/api/v1/dlq/retry", {"queue": queue, "partition": "p2"})
    assert (status, body["retried"], body["partition"]) == (200, 1, "p2")
    status, body = await api.post("/api/v1/dlq/retry", {"queue": queue, "consumerGroup": "g"})
    assert (status, body["retried"]) == (200, 1)
    assert await dlq_total(api, queue, "g") == 0
    status, body = await api.post(
        "/api/v1/dlq/retry", {"queue": queue, "from": "2000-01-01T00:00:00Z"}
    )
    assert (status, body["retried"]) == (200, 2)
    status, body = await api.post("/api/v1/dlq/retry", {"queue": queue})
    assert (status, body["retried"]) == (200, 0)
    assert sorted(await consume_all(api, queue)) == ["a1", "a2", "b1"]
    # g never consumed a2 and b1; it gets them once, and a1 again, none of queue mode's copies
    assert sorted(await consume_all(api, queue, "g")) == ["a1", "a2", "b1"]


async def test_moving_a_message_to_the_dlq_by_hand(api: Api, queue: str) -> None:
    await api.push(queue, "p", "m1", "m2", "m3", tx=["t1", "t2", "t3"])
    [probe] = await api.messages(queue, "p", batch=1, consumerGroup="g")  # g knows the queue
    await api.ack(probe, group="g")
    pid = probe["partitionId"]
    url = f"/api/v1/messages/{pid}"

    status, body = await api.post(f"{url}/t1/dlq", {"errorMessage": "poison"})
    assert status == 200, body
    assert (body["moved"], body["consumerGroup"]) == (True, "__QUEUE_MODE__")
    status, page = await api.get(f"/api/v1/dlq?queue={queue}")
    assert page["total"] == 1
    assert (page["messages"][0]["transactionId"], page["messages"][0]["errorMessage"]) == (
        "t1",
        "poison",
    )
    status, body = await api.post(f"{url}/t1/dlq")
    assert (status, body["moved"]) == (200, False)  # already there: nothing changed

    [leased] = await api.messages(queue, batch=1)  # queue mode skips t1
    assert leased["transactionId"] == "t2"
    status, body = await api.post(f"{url}/t2/dlq")
    assert status == 409 and "leased" in body["error"]
    await api.ack(leased)
    status, body = await api.post(f"{url}/t2/dlq")
    assert status == 409 and "consumed" in body["error"]

    for bad in ({"errorMessage": 5}, {"consumerGroup": ""}, {"group": "g"}, ["g"]):
        status, body = await api.post(f"{url}/t3/dlq", bad)
        assert status == 400, (bad, body)
    status, body = await api.post(f"{url}/t3/dlq", {"consumerGroup": "nobody"})
    assert status == 404 and "never read" in body["error"]
    status, body = await api.post(f"{url}/nope/dlq")
    assert status == 404
    assert await dlq_total(api, queue) == 1

    status, body = await api.post(f"{url}/t3/dlq", {"consumerGroup": "g"})
    assert (status, body["moved"]) == (200, True)
    assert await consume_all(api, queue, "g") == ["m2"]  # g never receives t3
    assert await consume_all(api, queue) == ["m3"]
    status, _ = await api.post(f"{url}/t1/retry")
    assert status == 200
    assert await consume_all(api, queue) == ["m1"]


async def test_a_group_that_never_popped_a_partition_can_lose_a_message_of_it(
    api: Api, queue: str
) -> None:
    await api.push(queue, "a", "a1")
    assert await consume_all(api, queue, "g") == ["a1"]
    await api.push(queue, "b", "b1", "b2", tx=["b1", "b2"])
    _, listed = await api.get(f"/api/v1/messages?queue={queue}&partition=b")
    pid = listed["messages"][0]["partitionId"]
    status, body = await api.post(f"/api/v1/messages/{pid}/b1/dlq", {"consumerGroup": "g"})
    assert (status, body["moved"]) == (200, True)
    assert await consume_all(api, queue, "g") == ["b2"]


async def test_clear_removes_what_is_stored_but_what_a_lease_holds(api: Api, queue: str) -> None:
    await api.push(queue, "a", "a1", "a2", "a3")
    await api.push(queue, "b", "b1", "b2")
    [leased] = await api.messages(queue, "b", batch=1)

    status, body = await api.delete(f"/api/v1/queues/{queue}/clear?partition=a")
    assert status == 200, body
    assert (body["cleared"], body["kept"], body["partition"]) == (3, 0, "a")
    status, body = await api.delete(f"/api/v1/queues/{queue}/clear")
    assert (status, body["cleared"], body["kept"]) == (200, 0, 2)  # b's write is leased
    await api.ack(leased)
    status, body = await api.delete(f"/api/v1/queues/{queue}/clear")
    assert (status, body["cleared"], body["kept"]) == (200, 2, 0)
    assert await api.messages(queue, batch=10) == []

    status, _ = await api.delete(f"/api/v1/queues/never-{queue}/clear")
    assert status == 404
    status, _ = await api.delete(f"/api/v1/queues/{queue}/clear?partition=zz")
    assert status == 404
    status, _ = await api.delete(f"/api/v1/queues/{queue}/clear?partition={'x' * 300}")
    assert status == 400
    await api.push(queue, "a", "a4")  # offsets go on after the gap
    assert await consume_all(api, queue) == ["a4"]


async def test_deleting_a_message_removes_its_dead_letters(api: Api, queue: str) -> None:
    await api.push(queue, "p", "m1", tx=["t1"])
    m = await dead_letter_first(api, queue)
    await dead_letter_first(api, queue, "g")
    assert await dlq_total(api, queue) == 2
    status, body = await api.delete(f"/api/v1/messages/{m['partitionId']}/t1")
    assert (status, body["success"]) == (200, True)
    assert await dlq_total(api, queue) == 0
    status, _ = await api.get(f"/api/v1/messages/{m['partitionId']}/t1")
    assert status == 404


async def test_a_dead_letter_whose_message_retention_removed_can_be_deleted(
    api: Api, queue: str, db: Db
) -> None:
    await api.push(queue, "p", "m1", tx=["t1"])
    m = await dead_letter_first(api, queue)
    await db.rows("DELETE FROM queen.segments WHERE partition_id = %s", int(m["partitionId"]))
    status, _ = await api.delete(f"/api/v1/messages/{m['partitionId']}/t1")
    assert status == 200
    assert await dlq_total(api, queue) == 0


ACTIONS = (
    ("POST", "/api/v1/messages/{pid}/t1/retry", None),
    ("POST", "/api/v1/messages/{pid}/t1/dlq", {}),
    ("POST", "/api/v1/dlq/retry", {"queue": "{queue}"}),
    ("DELETE", "/api/v1/queues/{queue}/clear", None),
)


@pytest.fixture
def auth_client(broker: Broker) -> Any:
    settings = broker.settings.with_changes(jwt_enabled=True, jwt_secret=SECRET)
    return create_app(broker, gate=build_gate(settings)).test_client()


async def test_actions_need_the_admin_role_and_are_logged_with_who(
    api: Api, auth_client: Any, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    await api.push(queue, "p", "m1", tx=["t1"])
    m = await dead_letter_first(api, queue)
    consumer = bearer(hs256(claims(sub="carol", roles=["read", "write"])))
    admin = bearer(hs256(claims(sub="alice", roles=["admin"])))

    def calls() -> list[tuple[str, str, Any]]:
        return [
            (
                method,
                path.format(pid=m["partitionId"], queue=queue),
                None if body is None else {k: v.format(queue=queue) for k, v in body.items()},
            )
            for method, path, body in ACTIONS
        ]

    caplog.set_level(logging.INFO, logger="queen")
    for method, path, body in calls():
        resp = await auth_client.open(path, method=method, json=body, headers=consumer)
        assert resp.status_code == 403, path
        assert await resp.get_json() == {
            "error": "Insufficient permissions",
            "required": ["admin"],
        }
    assert await dlq_total(api, queue) == 1

    resp = await auth_client.post(f"/api/v1/messages/{m['partitionId']}/t1/retry", headers=admin)
    assert resp.status_code == 200
    resp = await auth_client.delete(f"/api/v1/queues/{queue}/clear", headers=admin)
    assert resp.status_code == 200
    audit = [r.getMessage() for r in caplog.records if r.name == "queen.audit"]
    assert f"carol DELETE /api/v1/queues/{queue}/clear -> 403" in audit
    assert f"alice POST /api/v1/messages/{m['partitionId']}/t1/retry -> 200" in audit
    assert f"alice DELETE /api/v1/queues/{queue}/clear -> 200" in audit
    said = [r.getMessage() for r in caplog.records if r.name == "queen.admin.actions"]
    assert any(s.startswith("alice retried message") and "__QUEUE_MODE__" in s for s in said)
    assert any(s.startswith(f"alice cleared {queue}: 2 messages removed") for s in said)


async def test_seek_maintenance_and_deletions_are_logged_with_who(
    api: Api, auth_client: Any, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queen.audit")
    await api.push(queue, "p", "m1", tx=["t1"])
    [m] = await api.messages(queue, batch=1, consumerGroup="g")
    await api.ack(m, group="g")
    consumer = bearer(hs256(claims(sub="carol", roles=["read", "write"])))
    admin = bearer(hs256(claims(sub="alice", roles=["admin"])))
    seek = f"/api/v1/consumer-groups/g/queues/{queue}/seek"
    resp = await auth_client.post(seek, json={"toEnd": True}, headers=consumer)
    assert resp.status_code == 200  # a consumer's operation
    resp = await auth_client.post(
        "/api/v1/system/maintenance", json={"enabled": False}, headers=admin
    )
    assert resp.status_code == 200
    resp = await auth_client.delete(f"/api/v1/messages/{m['partitionId']}/t1", headers=admin)
    assert resp.status_code == 200
    resp = await auth_client.get(f"/api/v1/messages/{m['partitionId']}/t1", headers=admin)
    assert resp.status_code == 404  # a read: not an action, not logged
    audit = [r.getMessage() for r in caplog.records if r.name == "queen.audit"]
    assert audit == [
        f"carol POST {seek} -> 200",
        "alice POST /api/v1/system/maintenance -> 200",
        f"alice DELETE /api/v1/messages/{m['partitionId']}/t1 -> 200",
    ]


async def test_a_retry_waits_for_the_database_and_changes_nothing_meanwhile(
    api: Api, queue: str
) -> None:
    await api.push(queue, "p", "m1", tx=["t1"])
    m = await dead_letter_first(api, queue)
    status, _ = await api.post("/api/v1/system/maintenance", {"enabled": True})
    assert status == 200
    try:
        resp = await api.client.post(f"/api/v1/messages/{m['partitionId']}/t1/retry")
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
        assert "maintenance" in (await resp.get_json())["error"]
        status, _ = await api.post("/api/v1/dlq/retry", {"queue": queue})
        assert status == 503
        assert await dlq_total(api, queue) == 1
    finally:
        status, _ = await api.post("/api/v1/system/maintenance", {"enabled": False})
        assert status == 200
    status, body = await api.post(f"/api/v1/messages/{m['partitionId']}/t1/retry")
    assert (status, body["retried"]) == (200, True)
    assert await consume_all(api, queue) == ["m1"]


async def test_a_retry_racing_pushes_keeps_every_offset_and_order(api: Api, queue: str) -> None:
    await api.push(queue, "p", "m0", tx=["t0"])
    m = await dead_letter_first(api, queue, "ga")
    assert await consume_all(api, queue, "gb") == ["m0"]

    async def pushes(start: int) -> None:
        for n in range(start, start + 20, 2):
            await api.push(queue, "p", f"m{n}", tx=[f"t{n}"])

    async def retry() -> None:
        status, body = await api.post(f"/api/v1/messages/{m['partitionId']}/t0/retry")
        assert (status, body["retried"]) == (200, True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pushes, 1)
        nursery.start_soon(retry)
        nursery.start_soon(pushes, 2)
    got_a = await consume_all(api, queue, "ga")
    got_b = await consume_all(api, queue, "gb")
    pushed = {f"m{n}" for n in range(1, 21)}
    assert sorted(got_a) == sorted(pushed | {"m0"}) and len(got_a) == 21
    assert sorted(got_b) == sorted(pushed) and len(got_b) == 20
    # each producer's pushes keep their order, for both groups
    for got in (got_a, got_b):
        for start in (1, 2):
            mine = [x for x in got if x != "m0" and int(x[1:]) % 2 == start % 2]
            assert mine == [f"m{n}" for n in range(start, start + 20, 2)]

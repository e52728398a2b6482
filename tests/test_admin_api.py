"""The admin API on the real database: queues, partitions, messages, groups, status, metrics,
CORS. Figures are checked against what the test pushed, popped and acknowledged."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from queen.admin.groups import GroupQuery
from queen.admin.messages import message_query
from queen.admin.params import Page
from queen.admin.queues import QueueQuery
from queen.broker import Broker
from queen.http.app import create_app
from queen.settings import Settings


async def push(client: Any, queue: str, partition: str, *txids: str) -> None:
    items = [
        {"queue": queue, "partition": partition, "transactionId": t, "payload": {"tx": t}}
        for t in txids
    ]
    resp = await client.post("/api/v1/push", json={"items": items})
    assert resp.status_code == 201


async def pop(client: Any, queue: str, batch: int, group: str | None = None) -> list[Any]:
    extra = f"&consumerGroup={group}" if group else ""
    resp = await client.get(f"/api/v1/pop/queue/{queue}?batch={batch}&wait=false{extra}")
    return [] if resp.status_code == 204 else (await resp.get_json())["messages"]


async def test_queue_list_and_detail_count_from_offsets(client: Any, queue: str) -> None:
    await push(client, queue, "a", "1", "2", "3")
    await push(client, queue, "b", "4")
    [first] = await pop(client, queue, 1)  # leased: processing
    ack = {
        "transactionId": first["transactionId"],
        "partitionId": first["partitionId"],
        "leaseId": first["leaseId"],
        "status": "completed",
    }
    assert (await client.post("/api/v1/ack", json=ack)).status_code == 200
    listed = await (await client.get(f"/api/v1/resources/queues?search={queue}")).get_json()
    [item] = listed["queues"]
    assert item["name"] == queue and item["partitions"] == 2 and listed["total"] == 1
    assert item["messages"]["total"] == 4
    assert item["messages"]["completed"] == 1
    assert item["messages"]["pending"] + item["messages"]["processing"] == 3

    detail = await (await client.get(f"/api/v1/resources/queues/{queue}")).get_json()
    assert detail["name"] == queue and detail["partitionCount"] == 2
    assert (detail["segments"], detail["messages"], detail["sidecarEntries"]) == (2, 4, 4)
    assert [p["name"] for p in detail["partitions"]] == ["a", "b"]
    assert detail["partitions"][0]["offsets"] == {"low": 0, "next": 3, "cursor": 1}
    assert detail["totals"]["total"] == 4

    status = await (await client.get(f"/api/v1/status/queues/{queue}")).get_json()
    assert status["queue"]["config"]["leaseTime"] == 300
    assert status["totals"]["completed"] == 1
    assert [g["name"] for g in status["consumerGroups"]] == ["__QUEUE_MODE__"]


async def test_lists_are_paginated_and_bad_input_is_a_400(client: Any, queue: str) -> None:
    for n in range(3):
        await push(client, f"{queue}-{n}", "p", "x")
    page = await (await client.get(f"/api/v1/resources/queues?search={queue}&limit=2")).get_json()
    assert len(page["queues"]) == 2 and page["total"] == 3
    rest = await client.get(f"/api/v1/resources/queues?search={queue}&limit=2&offset=2")
    assert [q["name"] for q in (await rest.get_json())["queues"]] == [f"{queue}-2"]
    for bad in ("limit=0", "limit=abc", "offset=-1", "limit=100000"):
        resp = await client.get(f"/api/v1/resources/queues?{bad}")
        assert resp.status_code == 400 and "error" in await resp.get_json()
    assert (await client.get("/api/v1/messages?status=weird")).status_code == 400
    assert (await client.get("/api/v1/messages?from=yesterday")).status_code == 400
    assert (await client.get("/api/v1/messages/notanid/tx")).status_code == 400
    assert (await client.get("/api/v1/resources/queues/nope-" + queue)).status_code == 404
    assert (await client.get("/api/v1/status/queues/nope-" + queue)).status_code == 404
    assert (await client.get("/api/v1/consumer-groups/nope-" + queue)).status_code == 404


async def test_messages_browse_view_and_delete(client: Any, queue: str) -> None:
    await push(client, queue, "p", "m1", "m2", "m3")
    listed = await (await client.get(f"/api/v1/messages?queue={queue}")).get_json()
    assert [m["transactionId"] for m in listed["messages"]] == ["m3", "m2", "m1"]
    assert {m["status"] for m in listed["messages"]} == {"pending"}
    one = await (await client.get(f"/api/v1/messages?queue={queue}&limit=1&offset=1")).get_json()
    assert [m["transactionId"] for m in one["messages"]] == ["m2"]

    pid = listed["messages"][0]["partitionId"]
    viewed = await (await client.get(f"/api/v1/messages/{pid}/m2")).get_json()
    assert viewed["payload"] == {"tx": "m2"} and viewed["offset"] == 1
    assert viewed["status"] == "pending"

    deleted = await client.delete(f"/api/v1/messages/{pid}/m2")
    assert deleted.status_code == 200 and (await deleted.get_json())["success"] is True
    assert (await client.get(f"/api/v1/messages/{pid}/m2")).status_code == 404
    assert (await client.delete(f"/api/v1/messages/{pid}/m2")).status_code == 404
    got = [
        m["data"]["tx"] if "data" in m else m["payload"]["tx"] for m in await pop(client, queue, 10)
    ]
    assert got == ["m1", "m3"]  # the pop steps over the removed message
    left = await (await client.get(f"/api/v1/messages?queue={queue}&status=processing")).get_json()
    assert sorted(m["transactionId"] for m in left["messages"]) == ["m1", "m3"]


async def test_a_pop_after_deleted_messages_still_fills_its_batch(client: Any, queue: str) -> None:
    await push(client, queue, "p", "m1", "m2", "m3", "m4", "m5", "m6")
    listed = await (await client.get(f"/api/v1/messages?queue={queue}")).get_json()
    pid = listed["messages"][0]["partitionId"]
    for txid in ("m2", "m4", "m5"):  # two gaps inside the batch's first reach
        assert (await client.delete(f"/api/v1/messages/{pid}/{txid}")).status_code == 200
    got = [m["transactionId"] for m in await pop(client, queue, 3)]
    assert got == ["m1", "m3", "m6"]  # three messages, not only those of the first 3 offsets
    assert await pop(client, queue, 3) == []


async def test_a_leased_message_is_not_deleted(client: Any, queue: str) -> None:
    await push(client, queue, "p", "only")
    [msg] = await pop(client, queue, 1)
    resp = await client.delete(f"/api/v1/messages/{msg['partitionId']}/only")
    assert resp.status_code == 409
    assert (await client.get(f"/api/v1/messages/{msg['partitionId']}/only")).status_code == 200


async def test_consumer_groups_and_lag(client: Any, queue: str) -> None:
    await push(client, queue, "p", "1", "2", "3")
    assert len(await pop(client, queue, 1, group=f"g-{queue}")) == 1
    groups = await (await client.get(f"/api/v1/consumer-groups?queue={queue}")).get_json()
    [g] = [g for g in groups if g["name"] == f"g-{queue}"]
    assert g["queueName"] == queue and g["totalLag"] == 3 and g["members"] == 1
    assert g["partitionsWithLag"] == 1 and g["leasedPartitions"] == 1
    detail = await (await client.get(f"/api/v1/consumer-groups/g-{queue}")).get_json()
    [part] = detail[queue]["partitions"]
    assert part["offsetLag"] == 3 and part["leaseActive"] is True
    lagging = await (await client.get("/api/v1/consumer-groups/lagging?minLagSeconds=0")).get_json()
    assert any(x["name"] == f"g-{queue}" for x in lagging)
    far = await (await client.get("/api/v1/consumer-groups/lagging?minLagSeconds=3600")).get_json()
    assert not any(x["name"] == f"g-{queue}" for x in far)


async def test_the_lagging_list_is_whole_unless_a_page_is_asked(client: Any, queue: str) -> None:
    """The official clients ask without ``limit`` and expect every lagging partition (the
    original's answer); ``limit`` and ``offset`` page it, oldest first."""
    group = f"g-{queue}"
    for partition in ("a", "b", "c"):
        await push(client, queue, partition, f"{partition}1", f"{partition}2")
        assert len(await pop(client, queue, 1, group=group)) == 1
    url = "/api/v1/consumer-groups/lagging?minLagSeconds=0"
    whole = await (await client.get(url)).get_json()
    ours = [x for x in whole if x["name"] == group]
    assert sorted(x["partition_name"] for x in ours) == ["a", "b", "c"]
    ages = [x["time_lag_seconds"] for x in whole]
    assert ages == sorted(ages, reverse=True)
    assert len(await (await client.get(f"{url}&limit=2")).get_json()) == 2
    [second] = await (await client.get(f"{url}&limit=1&offset=1")).get_json()
    assert second["time_lag_seconds"] <= ages[0]


async def test_the_service_answers_typed_values(client: Any, broker: Broker, queue: str) -> None:
    """What ``broker.admin`` answers an embedding program: values, not the wire's dicts."""
    await push(client, queue, "p", "t1", "t2")
    assert len(await pop(client, queue, 1, group=f"g-{queue}")) == 1
    page = await broker.admin.queues.page(QueueQuery(search=queue))
    [summary] = page.queues
    assert (summary.name, summary.partitions, summary.messages.total) == (queue, 1, 2)
    assert summary.created_at.tzinfo is not None and page.page == Page(100, 0)
    newest = (await broker.admin.messages.page(message_query({"queue": queue}))).messages[0]
    assert (newest.transaction_id, newest.status, newest.offset) == ("t2", "pending", 1)
    detail = await broker.admin.messages.detail(newest.partition_id, "t2")
    assert detail is not None and detail.payload.value == {"tx": "t2"}
    [view] = [g for g in detail.consumer_groups if g.name == f"g-{queue}"]
    assert view.leased is False and view.consumed is False  # its lease holds t1 only
    assert view.lease_expires_at is not None and view.lease_expires_at > datetime.now(UTC)
    standings = await broker.admin.consumer_groups.standings(GroupQuery(queue=queue))
    [group] = [g for g in standings if g.name == f"g-{queue}"]
    assert (group.lag, group.leased, group.partitions) == (2, 1, 1)
    deleted = await broker.admin.messages.delete(newest.partition_id, "t2")
    assert deleted.outcome == "deleted"
    again = await broker.admin.messages.delete(newest.partition_id, "t2")
    assert again.outcome == "missing"


async def test_overview_status_analytics_and_refresh(client: Any, queue: str) -> None:
    await push(client, queue, "p", "1", "2")
    ns = await (await client.get("/api/v1/resources/namespaces")).get_json()
    assert "namespaces" in ns
    overview = await (await client.get("/api/v1/resources/overview")).get_json()
    assert overview["queues"] >= 1 and overview["messages"]["total"] >= 2
    assert overview["maintenance"] == {"push": False, "pop": False}
    for path in (
        "/api/v1/status",
        "/api/v1/status/queues",
        "/api/v1/status/analytics",
        "/api/v1/resources/tasks",
        f"/api/v1/status/queues/{queue}/messages",
        "/api/v1/analytics/system-metrics",
        "/api/v1/analytics/worker-metrics",
        "/api/v1/analytics/queue-lag",
        "/api/v1/analytics/queue-ops",
        "/api/v1/analytics/queue-parked-replicas",
        "/api/v1/analytics/retention",
        "/api/v1/analytics/postgres-stats",
    ):
        resp = await client.get(path)
        assert resp.status_code == 200, path
    pg = await (await client.get("/api/v1/analytics/postgres-stats")).get_json()
    assert any(t["table"] == "segments" for t in pg["tables"])
    refreshed = await client.post("/api/v1/stats/refresh")
    assert (await refreshed.get_json())["success"] is True


async def test_table_rows_follow_writes_before_any_analyze(
    client: Any, db: Any, queue: str
) -> None:
    """The rows shown per table are PostgreSQL's live-row counts, not the planner's
    estimate (which stays where the last ANALYZE left it, -1 before the first one)."""

    async def rows_of(table: str) -> int:
        pg = await (await client.get("/api/v1/analytics/postgres-stats")).get_json()
        (row,) = [t for t in pg["tables"] if t["table"] == table]
        return int(row["rows"])

    before = await rows_of("queues")
    items = [{"queue": f"{queue}-{n}", "payload": n} for n in range(3)]
    # three new queues from SQL; this session's statistics are sent as its call ends
    await db.rows(
        "SELECT pg_stat_force_next_flush(), queen.push_messages_v2(%s::jsonb)",
        json.dumps(items),
    )
    assert await db.value("SELECT count(*) FROM queen.queues WHERE name LIKE %s", queue + "-%") == 3
    assert await rows_of("queues") >= before + 3


async def test_metrics_text_json_and_queue_gauges(client: Any, broker: Broker, queue: str) -> None:
    await push(client, queue, "p", "1", "2")
    text = await (await client.get("/metrics/prometheus")).get_data(as_text=True)
    assert f'queen_queue_depth{{queue="{queue}"}} 2.0\n' in text
    assert f'queen_queue_dlq_depth{{queue="{queue}"}} 0.0\n' in text
    assert "# TYPE queen_queue_oldest_pending_age_seconds gauge" in text
    plain = await client.get("/metrics")
    assert plain.content_type.startswith("text/plain")
    assert "queen_push_items_total" in await plain.get_data(as_text=True)
    as_json = await client.get("/metrics", headers={"Accept": "application/json"})
    body = await as_json.get_json()
    assert body["messages"]["total"] == broker.metrics.push_items_queued
    assert {"uptime", "requests", "database", "memory", "cpu"} <= body.keys()


async def test_cors_allows_configured_origins_and_preflight_needs_no_token(
    settings: Settings,
) -> None:
    from queen.lifecycle import open_broker

    changed = settings.with_changes(
        cors_origins="https://ops.example", jwt_enabled=True, jwt_secret="s" * 32
    )
    async with open_broker(changed) as broker:
        client = create_app(broker).test_client()
        preflight = {
            "Origin": "https://ops.example",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization",
        }
        ok = await client.options("/api/v1/resources/queues", headers=preflight)
        assert ok.status_code == 204
        assert ok.headers["Access-Control-Allow-Origin"] == "https://ops.example"
        assert "Authorization" in ok.headers["Access-Control-Allow-Headers"]
        other = await client.options(
            "/api/v1/resources/queues", headers={**preflight, "Origin": "https://evil.example"}
        )
        assert other.status_code == 403 and "Access-Control-Allow-Origin" not in other.headers
        # The answer itself (here a 401: no token) carries the header for the allowed origin.
        refused = await client.get(
            "/api/v1/resources/queues", headers={"Origin": "https://ops.example"}
        )
        assert refused.status_code == 401
        assert refused.headers["Access-Control-Allow-Origin"] == "https://ops.example"


async def test_without_cors_origins_no_origin_is_allowed(client: Any) -> None:
    resp = await client.get("/health", headers={"Origin": "https://ops.example"})
    assert "Access-Control-Allow-Origin" not in resp.headers
    preflight = await client.options(
        "/health",
        headers={"Origin": "https://ops.example", "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status_code == 403


async def test_message_status_filters_are_exact(client: Any, queue: str) -> None:
    for n in range(4):  # one segment per push
        await push(client, queue, "p", f"s{2 * n}", f"s{2 * n + 1}")
    first = await pop(client, queue, 3)  # s0 s1 s2 leased
    done = {
        "transactionId": "s0",
        "partitionId": first[0]["partitionId"],
        "leaseId": first[0]["leaseId"],
        "status": "completed",
    }
    assert (await client.post("/api/v1/ack", json=done)).status_code == 200

    async def listed(status: str, limit: int = 50) -> list[str]:
        url = f"/api/v1/messages?queue={queue}&status={status}&limit={limit}"
        return [m["transactionId"] for m in (await (await client.get(url)).get_json())["messages"]]

    assert await listed("completed") == ["s0"]
    assert await listed("processing") == ["s2", "s1"]
    assert await listed("pending") == ["s7", "s6", "s5", "s4", "s3"]
    assert await listed("pending", limit=4) == ["s7", "s6", "s5", "s4"]
    assert await listed("dead_letter") == []
    dead = {**done, "transactionId": "s1", "status": "dlq"}
    assert (await client.post("/api/v1/ack", json=dead)).status_code == 200
    assert await listed("dead_letter") == ["s1"]
    assert await listed("processing") == ["s2"]


async def test_messages_across_partitions_are_newest_first_page_by_page(
    client: Any, queue: str
) -> None:
    order = [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4"), ("a", "5"), ("b", "6")]
    for partition, tx in order:  # one segment each, in this time order
        await push(client, queue, partition, tx)
    pages = []
    for offset in range(0, 6, 2):
        url = f"/api/v1/messages?queue={queue}&limit=2&offset={offset}"
        pages += [
            m["transactionId"] for m in (await (await client.get(url)).get_json())["messages"]
        ]
    assert pages == ["6", "5", "4", "3", "2", "1"]


async def test_an_encrypted_message_is_shown_decrypted(settings: Settings, queue: str) -> None:
    from queen.lifecycle import open_broker

    async with open_broker(settings.with_changes(encryption_key="3a" * 32)) as broker:
        client = create_app(broker).test_client()
        body = {"queue": queue, "options": {"encryptionEnabled": True}}
        assert (await client.post("/api/v1/configure", json=body)).status_code == 200
        await push(client, queue, "p", "secret-1")
        [item] = (await (await client.get(f"/api/v1/messages?queue={queue}")).get_json())[
            "messages"
        ]
        shown = await (
            await client.get(f"/api/v1/messages/{item['partitionId']}/secret-1")
        ).get_json()
        assert shown["payload"] == {"tx": "secret-1"} and shown["isEncrypted"] is True


async def test_the_dashboard_dlq_page_shows_each_dead_letter(client: Any, queue: str) -> None:
    await push(client, queue, "p", "dead-1")
    (message,) = await pop(client, queue, 1)
    failed = {**message, "status": "dlq", "error": "unparsable order"}
    assert (await client.post("/api/v1/ack", json=failed)).status_code == 200
    resp = await client.get(f"/dashboard/view/dlq?queue={queue}")
    page = await resp.get_data(as_text=True)
    assert resp.status_code == 200
    assert "unparsable order" in page and "dead-1" in page and queue in page


async def test_the_dashboard_dlq_page_filters_by_failure_time(client: Any, queue: str) -> None:
    await push(client, queue, "p", "dead-t")
    (message,) = await pop(client, queue, 1)
    failed = {**message, "status": "dlq", "error": "late order"}
    assert (await client.post("/api/v1/ack", json=failed)).status_code == 200
    past, future = "2000-01-01T00:00:00Z", "2999-01-01T00:00:00Z"

    async def page(query: str) -> str:
        resp = await client.get(f"/dashboard/view/dlq?queue={queue}&{query}")
        assert resp.status_code == 200
        return str(await resp.get_data(as_text=True))

    since_past = await page(f"from={past}&to={future}")
    assert "dead-t" in since_past
    # the form keeps the range, and "retry all" retries only that range
    assert f'value="{past}"' in since_past and f'value="{future}"' in since_past
    assert f'"from": "{past}"' in since_past.replace("&#34;", '"')
    assert f"that failed from {past} until {future}" in since_past
    assert "dead-t" not in await page(f"from={future}")
    assert "dead-t" not in await page(f"to={past}")
    bad = await client.get(f"/dashboard/view/dlq?queue={queue}&from=yesterday")
    assert bad.status_code == 400
    assert "from must be an ISO-8601 timestamp" in await bad.get_data(as_text=True)


async def test_the_dashboard_shows_traces_by_name_and_on_their_message(
    client: Any, queue: str
) -> None:
    await push(client, queue, "p", "traced-1")
    (message,) = await pop(client, queue, 1)
    trace = {
        "transactionId": "traced-1",
        "partitionId": message["partitionId"],
        "eventType": "shipped",
        "traceNames": [f"order-{queue}"],
        "data": {"step": 3},
    }
    assert (await client.post("/api/v1/traces", json=trace)).status_code == 201
    by_name = await client.get(f"/dashboard/view/traces?name=order-{queue}")
    page = await by_name.get_data(as_text=True)
    assert by_name.status_code == 200
    assert "shipped" in page and "traced-1" in page and queue in page
    viewer = await client.get(f"/dashboard/view/message/{message['partitionId']}/traced-1")
    page = await viewer.get_data(as_text=True)
    assert viewer.status_code == 200 and "shipped" in page and f"order-{queue}" in page


async def test_a_queues_partitions_sort_by_pending_oldest_and_lease(
    client: Any, queue: str
) -> None:
    await push(client, queue, "z-old", "1")  # oldest pending
    await push(client, queue, "b-many", "2", "3", "4")  # most pending
    await push(client, queue, "c-leased", "5")
    await push(client, queue, "d-one", "6")

    async def order(sort: str) -> list[str]:
        resp = await client.get(f"/api/v1/resources/queues/{queue}?sort={sort}")
        assert resp.status_code == 200, await resp.get_data(as_text=True)
        return [p["name"] for p in (await resp.get_json())["partitions"]]

    # a lease on c-leased
    popped = await client.get(f"/api/v1/pop/queue/{queue}/partition/c-leased?batch=1&wait=false")
    assert popped.status_code == 200
    assert await order("name") == ["b-many", "c-leased", "d-one", "z-old"]
    pending = await order("pending")
    assert pending[0] == "b-many" and pending[-1] == "c-leased"  # its one message is leased
    assert (await order("oldest"))[0] == "z-old"
    assert (await order("lease"))[0] == "c-leased"
    bad = await client.get(f"/api/v1/resources/queues/{queue}?sort=size")
    assert bad.status_code == 400
    assert "sort must be one of" in (await bad.get_json())["error"]
    page = await client.get(f"/dashboard/view/queue/{queue}?sort=pending")
    html = await page.get_data(as_text=True)
    assert page.status_code == 200 and "<strong>pending</strong>" in html
    assert html.index(">b-many<") < html.index(">z-old<")


async def test_a_message_is_found_by_its_transaction_id_in_every_partition_holding_it(
    client: Any, queue: str
) -> None:
    await push(client, queue, "p1", "a", "needle", "b")
    await push(client, queue, "p2", "needle")
    await push(client, queue, "p3", "c")
    found = await client.get(f"/api/v1/messages?queue={queue}&transactionId=needle")
    assert found.status_code == 200
    rows = (await found.get_json())["messages"]
    assert [(m["partition"], m["transactionId"]) for m in rows] == [
        ("p1", "needle"),
        ("p2", "needle"),
    ]
    assert rows[0]["offset"] == 1
    none = await (await client.get(f"/api/v1/messages?queue={queue}&transactionId=zz")).get_json()
    assert none["messages"] == []
    lost = await client.get("/api/v1/messages?transactionId=needle")
    assert lost.status_code == 400 and "needs queue" in (await lost.get_json())["error"]
    page = await client.get(f"/dashboard/view/messages?queue={queue}&transactionId=needle")
    html = await page.get_data(as_text=True)
    assert page.status_code == 200 and html.count(">needle</a>") == 2

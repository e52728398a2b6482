"""The admin answers the original broker's dashboard and queenctl read, called as they call
them (the same paths, parameters and Accept headers), on the real database; and the
original's Prometheus names in ``/metrics``."""

from __future__ import annotations

from typing import Any

import pytest

from queen.broker import Broker
from queen.flow import QueueFlow
from tests.conftest import Db

# what axios (the original's dashboard) sends by default
AXIOS_ACCEPT = "application/json, text/plain, */*"
# what Prometheus 2.x/3.x sends when it scrapes
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
)


async def _push(client: Any, queue: str, partition: str, *txids: str) -> list[Any]:
    items = [
        {"queue": queue, "partition": partition, "transactionId": t, "payload": {"t": t}}
        for t in txids
    ]
    resp = await client.post("/api/v1/push", json={"items": items})
    assert resp.status_code == 201
    return list(await resp.get_json())


async def _pop(client: Any, path: str) -> list[Any]:
    resp = await client.get(path)
    return [] if resp.status_code == 204 else (await resp.get_json())["messages"]


async def _ack(client: Any, message: Any, group: str | None = None) -> None:
    body = {
        "transactionId": message["transactionId"],
        "partitionId": message["partitionId"],
        "leaseId": message["leaseId"],
        "status": "completed",
    }
    if group:
        body["consumerGroup"] = group
    resp = await client.post("/api/v1/ack", json=body)
    assert resp.status_code == 200, await resp.get_data(as_text=True)


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def test_metrics_answers_json_to_the_dashboard_and_text_to_prometheus(
    client: Any, queue: str
) -> None:
    await _push(client, queue, "p", "a")
    as_dashboard = await client.get("/metrics", headers={"Accept": AXIOS_ACCEPT})
    assert as_dashboard.content_type.startswith("application/json")
    body = await as_dashboard.get_json()
    assert set(body) >= {"uptime", "requests", "messages", "database", "memory", "cpu"}
    assert set(body["memory"]) >= {"rss", "heapTotal", "heapUsed", "external", "arrayBuffers"}
    assert body["memory"]["rss"] > 0
    assert body["cpu"]["user"] > 0 and isinstance(body["cpu"]["system"], int)
    assert isinstance(body["database"]["idleConnections"], int)
    assert body["database"]["poolSize"] >= body["database"]["idleConnections"]
    scraped = await client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    assert scraped.content_type.startswith("text/plain")
    text_first = await client.get("/metrics", headers={"Accept": "text/plain, application/json"})
    assert text_first.content_type.startswith("application/json")  # equal rank: JSON listed
    ranked = await client.get("/metrics", headers={"Accept": "application/json;q=0.5,text/plain"})
    assert ranked.content_type.startswith("text/plain")
    plain = await client.get("/metrics")
    assert plain.content_type.startswith("text/plain")


async def test_prometheus_serves_the_original_names_with_help_and_type(
    client: Any, broker: Broker, queue: str
) -> None:
    await _push(client, queue, "p", "a", "b")
    [message, _] = await _pop(client, f"/api/v1/pop/queue/{queue}?batch=2&wait=false")
    await _ack(client, message)
    text = await (await client.get("/metrics/prometheus")).get_data(as_text=True)
    samples = _samples(text)
    m = broker.metrics
    assert samples['queen_cluster_push_requests_total{scope="cluster"}'] == m.push_requests
    assert samples['queen_cluster_push_messages_total{scope="cluster"}'] == m.push_items_queued
    assert samples['queen_cluster_pop_requests_total{scope="cluster"}'] == m.pop_requests
    assert samples['queen_cluster_pop_messages_total{scope="cluster"}'] == m.pop_messages
    assert samples['queen_cluster_ack_requests_total{scope="cluster"}'] == m.ack_requests >= 1
    assert samples['queen_cluster_ack_total{result="success",scope="cluster"}'] == (
        m.acks - m.acks_refused
    )
    assert samples['queen_cluster_dlq_total{scope="cluster"}'] == m.acks_dlq
    assert samples['queen_cluster_db_errors_total{scope="cluster"}'] == (
        m.push_transaction_failures
    )
    assert samples['queen_cluster_transactions_total{scope="cluster"}'] == m.transactions
    assert samples["queen_file_buffer_pending"] == 0
    assert samples["queen_file_buffer_db_healthy"] == 1
    assert samples["queen_maintenance_mode_enabled"] == 0
    assert samples["queen_shared_state_enabled"] == 0
    assert samples["queen_uptime_seconds"] >= 0
    assert samples["queen_cpu_user_microseconds_total"] > 0
    assert samples["queen_process_resident_memory_bytes"] > 0
    assert (
        samples["queen_process_virtual_memory_bytes"]
        >= samples["queen_process_resident_memory_bytes"]
    )
    assert samples["queen_db_pool_size"] == broker.settings.db_pool_size
    assert samples["queen_db_pool_idle"] + samples["queen_db_pool_active"] == (
        broker.settings.db_pool_size
    )
    assert samples[f'queen_dlq_depth_by_queue{{queue="{queue}"}}'] == 0
    assert 'queen_dlq_depth{scope="cluster"}' in samples
    # ours are kept beside them
    assert samples["queen_push_requests_total"] == m.push_requests
    helped = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    families = {name.split("{")[0] for name in samples}
    assert families <= helped and families <= typed, families - (helped & typed)


async def test_maintenance_says_how_both_switches_stand(client: Any) -> None:
    before = await (await client.get("/api/v1/system/maintenance")).get_json()
    assert before["maintenanceMode"] is False and before["popMaintenanceMode"] is False
    stats = before["bufferStats"]
    assert stats["failedCount"] == 0 and stats["failedFiles"]["totalMB"] == 0
    assert stats["dbHealthy"] is True and stats["pendingCount"] == before["bufferedMessages"]
    resp = await client.post("/api/v1/system/maintenance/pop", json={"enabled": True})
    assert resp.status_code == 200
    try:
        during = await (await client.get("/api/v1/system/maintenance")).get_json()
        assert during["popMaintenanceMode"] is True and during["maintenanceMode"] is False
    finally:
        await client.post("/api/v1/system/maintenance/pop", json={"enabled": False})


async def test_status_lists_the_queues_holding_messages(client: Any, queue: str) -> None:
    await _push(client, queue, "p1", "a", "b")
    await _push(client, queue, "p2", "c")
    [message] = await _pop(client, f"/api/v1/pop/queue/{queue}/partition/p1?batch=1&wait=false")
    await _ack(client, message)
    window = "from=2020-01-01T00:00:00.000Z&to=2100-01-01T00:00:00.000Z"
    # one page of queues: the session's database holds many, so narrow it to this one's name
    status = await (await client.get(f"/api/v1/status?{window}&search={queue}")).get_json()
    assert isinstance(status["queues"], list)
    [row] = [q for q in status["queues"] if q["name"] == queue]
    assert row["partitions"] == 2 and row["totalConsumed"] == 1
    assert set(row) >= {"id", "name", "namespace", "task", "partitions", "totalConsumed"}
    assert status["totals"]["queues"] >= 1
    assert status["messages"]["requests"]["push"] >= 2
    assert status["messages"]["batchEfficiency"]["push"] > 0
    assert "totalMessages" in status["deadLetterQueue"]
    only = await (await client.get(f"/api/v1/status?queue={queue}")).get_json()
    assert [q["name"] for q in only["queues"]] == [queue]


async def test_overview_says_how_long_popped_messages_waited(client: Any, queue: str) -> None:
    await client.post("/api/v1/stats/refresh")  # a history point before the pops
    await _push(client, queue, "p", "a", "b")
    popped = await _pop(client, f"/api/v1/pop/queue/{queue}?batch=2&wait=false")
    assert len(popped) == 2
    await client.post("/api/v1/stats/refresh")  # and one after
    overview = await (await client.get("/api/v1/resources/overview")).get_json()
    assert 0 < overview["lag"]["time"]["avg"] < 60
    assert "max" in overview["lag"]["time"]
    status = await (await client.get("/api/v1/status")).get_json()
    points = status["throughput"]
    stamps = [p["timestamp"] for p in points]
    assert stamps == sorted(stamps, reverse=True)  # newest first, as the original answers
    # the newest interval, or the one before it if the history's own loop sampled between
    assert any(p["popMessages"] >= 2 and p["avgLagMs"] > 0 for p in points[:2])


async def test_message_rows_say_how_the_groups_stand(client: Any, queue: str) -> None:
    await _push(client, queue, "p", "a")
    [done] = await _pop(
        client, f"/api/v1/pop/queue/{queue}?batch=1&wait=false&consumerGroup=g1-{queue}"
    )
    await _ack(client, done, f"g1-{queue}")
    [_leased] = await _pop(
        client, f"/api/v1/pop/queue/{queue}?batch=1&wait=false&consumerGroup=g2-{queue}"
    )
    page = await (await client.get(f"/api/v1/messages?queue={queue}")).get_json()
    [row] = page["messages"]
    assert row["busStatus"] == {"consumedBy": 1, "totalGroups": 2}
    assert row["queueStatus"] == row["status"] == "pending"  # queue mode never popped it


async def test_lagging_answers_one_row_per_group_and_partition(client: Any, queue: str) -> None:
    group = f"lag-{queue}"
    await _push(client, queue, "p1", "a", "b")
    await _push(client, queue, "p2", "c")
    for partition in ("p1", "p2"):
        popped = await _pop(
            client,
            f"/api/v1/pop/queue/{queue}/partition/{partition}"
            f"?batch=1&wait=false&consumerGroup={group}",
        )
        assert len(popped) == 1
    # exactly the original dashboard's call
    rows = await (await client.get("/api/v1/consumer-groups/lagging?minLagSeconds=0")).get_json()
    mine = sorted(
        (r["partition_name"], r["offset_lag"]) for r in rows if r["consumer_group"] == group
    )
    assert mine == [("p1", 2), ("p2", 1)]
    row = next(r for r in rows if r["consumer_group"] == group)
    assert row["queue_name"] == queue and row["name"] == group
    # queenctl's `lag --min-seconds` columns: name, queue, lagMessages, lagSeconds
    assert row["queue"] == queue and row["lagMessages"] == row["offset_lag"]
    assert row["lagSeconds"] == row["time_lag_seconds"]
    assert isinstance(row["time_lag_seconds"], int) and row["lag_hours"] >= 0
    assert set(row) >= {
        "partition_id",
        "worker_id",
        "oldest_unconsumed_at",
        "last_consumed_at",
    }
    far = await (await client.get("/api/v1/consumer-groups/lagging?minLagSeconds=3600")).get_json()
    assert not any(r["consumer_group"] == group for r in far)


def _at(value: Any, path: str) -> Any:
    """The value at a dotted key path ("a.b.0.c") of a JSON answer."""
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


async def test_queue_operations_reads_per_queue_lag_and_the_worker_series(
    client: Any, queue: str
) -> None:
    await client.post("/api/v1/stats/refresh")  # a history point before the traffic
    await _push(client, queue, "p", "a", "b", "c")
    popped = await _pop(client, f"/api/v1/pop/queue/{queue}?batch=2&wait=false")
    await _ack(client, popped[0])
    await client.post("/api/v1/stats/refresh")
    window = "from=2020-01-01T00:00:00.000Z&to=2100-01-01T00:00:00.000Z"
    # the app iterates the answer itself: [{bucketTime, queueName, avgLagMs, maxLagMs, popCount}]
    lag = await (await client.get(f"/api/v1/analytics/queue-lag?{window}&queue={queue}")).get_json()
    assert isinstance(lag, list)
    [row] = lag  # one minute (the pops were one request)
    assert row["queueName"] == queue and row["popCount"] == 2
    assert isinstance(row["bucketTime"], str) and row["bucketTime"].endswith("Z")
    assert 0 < row["avgLagMs"] <= row["maxLagMs"] < 60_000
    ops = await (await client.get(f"/api/v1/analytics/queue-ops?{window}&queue={queue}")).get_json()
    assert ops["queues"] == [queue] and isinstance(ops["bucketMinutes"], int)
    # the traffic may straddle a minute: sum the queue's minutes
    rows = ops["series"]
    assert {r["queueName"] for r in rows} == {queue}
    assert row["bucketTime"] in {r["bucket"] for r in rows}
    assert sum(r["popMessages"] for r in rows) == 2
    assert sum(r["pushMessages"] for r in rows) == 3
    assert sum(r["ackSuccess"] for r in rows) == 1 and sum(r["ackFailed"] for r in rows) == 0
    assert {"parkedCount", "partitionsCreated", "transactions"} <= set(rows[0])
    empty = await client.get(f"/api/v1/pop/queue/{queue}/partition/none?batch=1&wait=false")
    assert empty.status_code == 204
    ops = await (await client.get(f"/api/v1/analytics/queue-ops?{window}&queue={queue}")).get_json()
    assert sum(r["popEmpty"] for r in ops["series"]) == 1
    parked = await client.get(f"/api/v1/analytics/queue-parked-replicas?{window}")
    assert parked.status_code == 200
    assert await parked.get_json() | {"timeRange": None} == {
        "timeRange": None,
        "bucketMinutes": 1,
        "series": [],
        "replicas": [],
    }
    worker = await (await client.get(f"/api/v1/analytics/worker-metrics?{window}")).get_json()
    assert worker["bucketMinutes"] > 0 and worker["pointCount"] >= 1
    series = worker["timeSeries"]
    stamps = [p["timestamp"] for p in series]
    assert stamps == sorted(stamps, reverse=True)  # newest first; the app reverses it
    keys = {
        "pushPerSecond": float,
        "popPerSecond": float,
        "ackPerSecond": float,
        "avgLagMs": (float, type(None)),
        "maxLagMs": (float, type(None)),
        "avgEventLoopLagMs": int,
        "maxEventLoopLagMs": int,
        "avgJobQueueSize": int,
        "maxJobQueueSize": int,
        "dbErrors": int,
        "ackFailed": int,
        "dlqCount": int,
    }
    for point in series:
        for key, kind in keys.items():
            assert isinstance(point[key], kind), (key, point[key])
    # the refresh after the traffic closed an interval holding it (or the loop sampled between)
    assert sum(p["popMessages"] for p in series[:2]) >= 2
    assert sum(p["ackSuccess"] for p in series[:2]) >= 1
    [me] = worker["workers"]
    assert set(me) >= {"hostname", "workerId", "freeSlots", "dbConnections", "lastSeen"}
    assert worker["summary"]["totalPopMessages"] >= 2
    assert worker["summary"]["totalAckMessages"] >= 1


async def test_retention_answers_a_series_of_what_each_interval_removed(
    client: Any, broker: Broker
) -> None:
    await client.post("/api/v1/stats/refresh")
    # what a retention pass that removed 3 messages and an eviction of 2 record
    broker.metrics.retention_passes += 1
    broker.metrics.retention_messages_removed += 3
    broker.metrics.eviction_messages_removed += 2
    await client.post("/api/v1/stats/refresh")
    body = await (await client.get("/api/v1/analytics/retention")).get_json()
    newest = body["series"][-1]
    assert newest["retentionMsgs"] == 3 and newest["evictionMsgs"] == 2
    assert newest["totalMsgs"] == 5 and newest["completedRetentionMsgs"] == 0
    assert newest["bucket"].endswith("Z") and newest["eventCount"] == 1
    totals = body["totals"]
    assert totals["totalMsgs"] == sum(row["totalMsgs"] for row in body["series"]) >= 5
    assert set(totals) == {
        "retentionMsgs",
        "completedRetentionMsgs",
        "evictionMsgs",
        "totalMsgs",
        "eventCount",
    }
    assert isinstance(body["bucketMinutes"], float | int)
    assert "thisProcess" in body and "allProcesses" in body  # ours, kept beside


async def test_queue_detail_lists_every_partition_unless_a_page_is_asked(
    client: Any, queue: str
) -> None:
    items = [
        {"queue": queue, "partition": f"p{i:03d}", "transactionId": f"t{i}", "payload": {}}
        for i in range(105)
    ]
    assert (await client.post("/api/v1/push", json={"items": items})).status_code == 201
    detail = await (await client.get(f"/api/v1/status/queues/{queue}")).get_json()
    assert len(detail["partitions"]) == 105 == detail["partitionCount"]
    assert detail["totals"]["pending"] == 105
    assert detail["totals"]["messages"]["pending"] == 105  # the original's nesting too
    first = detail["partitions"][0]
    assert first["cursor"]["totalConsumed"] == 0 and "batchesConsumed" in first["cursor"]
    assert first["stats"]["pending"] == 1 and first["messages"]["pending"] == 1
    paged = await (await client.get(f"/api/v1/status/queues/{queue}?limit=10")).get_json()
    assert len(paged["partitions"]) == 10


async def test_status_counts_every_groups_live_leases(client: Any, queue: str, db: Db) -> None:
    # The figures are the database's: leases that earlier tests left must not lapse between
    # the two reads, so they end now (those tests are over).
    await db.rows(
        "UPDATE queen.cursors SET lease_expires_at = now() WHERE lease_expires_at > now()"
    )
    before = (await (await client.get("/api/v1/status")).get_json())["leases"]
    for partition in ("p1", "p2", "p3"):
        await _push(client, queue, partition, f"{partition}-a", f"{partition}-b")
    group = f"leases-{queue}"
    for partition in ("p1", "p2", "p3"):
        popped = await _pop(
            client,
            f"/api/v1/pop/queue/{queue}/partition/{partition}"
            f"?batch=2&wait=false&consumerGroup={group}",
        )
        assert len(popped) == 2
    await _ack(client, popped[1], group)  # the second first: the lease still holds both
    after = (await (await client.get("/api/v1/status")).get_json())["leases"]
    # a group's leases are leases (the queue-mode figure alone said 0)
    assert after["active"] - before["active"] == 3
    assert after["partitionsWithLeases"] - before["partitionsWithLeases"] == 3
    assert after["totalBatchSize"] - before["totalBatchSize"] == 6
    assert after["totalAcked"] - before["totalAcked"] == 1


async def test_group_members_are_partitions_with_a_cursor_and_lag_counts_lagging_ones(
    client: Any, queue: str
) -> None:
    group = f"members-{queue}"
    for partition in ("p1", "p2", "p3"):
        await _push(client, queue, partition, f"{partition}-a")
    await _push(client, queue, "p1", "p1-b")
    for partition in ("p1", "p2", "p3"):
        [message] = await _pop(
            client,
            f"/api/v1/pop/queue/{queue}/partition/{partition}"
            f"?batch=1&wait=false&consumerGroup={group}",
        )
        if partition != "p3":
            await _ack(client, message, group)
    groups = await (await client.get(f"/api/v1/consumer-groups?queue={queue}")).get_json()
    [row] = [g for g in groups if g["name"] == group]
    # three cursors; p1 still has p1-b to deliver and p3 is leased, p2 is done
    assert row["members"] == 3
    assert row["partitionsWithLag"] == 2
    assert row["leasedPartitions"] == 1
    assert isinstance(row["maxTimeLag"], float) and row["topics"] == [queue]


async def test_system_page_reads_one_replica_with_its_metrics_per_interval(
    client: Any, broker: Broker
) -> None:
    await client.post("/api/v1/stats/refresh")
    await client.post("/api/v1/stats/refresh")
    body = await (await client.get("/api/v1/analytics/system-metrics")).get_json()
    assert body["replicaCount"] == 1 and body["pointCount"] >= 1
    assert body["bucketMinutes"] > 0
    [replica] = body["replicas"]
    assert isinstance(replica["hostname"], str) and replica["hostname"]
    last = replica["timeSeries"][-1]
    assert last["timestamp"].endswith("Z")
    m = last["metrics"]
    for path in (
        "cpu.user_us.last",
        "cpu.system_us.last",
        "memory.rss_bytes.last",
        "database.pool_active.last",
        "database.pool_idle.last",
        "database.pool_size.last",
        "threadpool.db.queue_size.last",
        "threadpool.system.queue_size.last",
    ):
        assert isinstance(_at(m, path), int), path
    assert m["memory"]["rss_bytes"]["last"] > 0
    assert m["database"]["pool_size"]["last"] == broker.settings.db_pool_size
    assert 0 <= m["database"]["pool_active"]["last"] <= broker.settings.db_pool_size
    # the status points carry the same pool and CPU figures (the Dashboard's)
    status = await (await client.get("/api/v1/status")).get_json()
    newest = status["throughput"][0]
    assert newest["dbPoolSize"] == broker.settings.db_pool_size
    assert newest["dbPoolActive"] + newest["dbPoolIdle"] == newest["dbPoolSize"]
    assert isinstance(newest["queenCpuUserPct"], float) and newest["queenRssMb"] > 0
    # the Analytics page's worker table: this process, its pool as free slots and connections
    [worker] = status["workers"]
    assert worker["dbConnections"] == broker.settings.db_pool_size
    assert 0 <= worker["freeSlots"] <= worker["dbConnections"]
    assert worker["avgEventLoopLagMs"] == 0 and worker["jobQueueSize"] == 0


async def test_postgres_stats_carry_the_cache_vacuum_and_size_figures_the_system_page_reads(
    client: Any, queue: str
) -> None:
    await _push(client, queue, "p", "a", "b")
    body = await (await client.get("/api/v1/analytics/postgres-stats")).get_json()
    cache = body["databaseCache"]
    assert isinstance(cache["database"], str) and cache["cacheHits"] > 0
    assert 0 < cache["cacheHitRatio"] <= 100
    summary = body["cacheSummary"]
    for part in ("tables", "indexes"):
        assert set(summary[part]) == {"diskReads", "cacheHits", "hitRatio"}
        # (the statistics reach the views a moment after the reads: no counts asserted)
        assert isinstance(summary[part]["cacheHits"], int)
    assert isinstance(body["bufferConfig"]["sharedBuffers"], str)
    assert body["bufferConfig"]["sharedBuffersSize"].endswith("B")  # "128 MB"
    sizes = {t["table"]: t for t in body["tableSizes"]}
    segments = sizes["segments"]
    assert segments["totalSizeBytes"] >= segments["tableSizeBytes"] > 0
    assert isinstance(segments["totalSize"], str) and isinstance(segments["indexSize"], str)
    totals = [t["totalSizeBytes"] for t in body["tableSizes"]]
    assert totals == sorted(totals, reverse=True) and len(totals) <= 20
    for key in ("deadTuples", "hotUpdates", "activeQueries", "autovacuumStatus", "bufferUsage"):
        assert isinstance(body[key], list), key
    for row in body["deadTuples"]:
        assert row["deadTuples"] > 0 and {"liveTuples", "lastAutovacuum"} <= set(row)
    assert {t["table"] for t in body["tableCache"]} >= {"segments", "partitions"}
    assert body["tables"] and body["connections"]["poolSize"] > 0  # ours, kept beside


async def test_status_names_the_windows_dead_letter_partitions_and_commonest_errors(
    client: Any, queue: str
) -> None:
    pushed = await _push(client, queue, "p1", "a", "b", "c")
    await _push(client, queue, "p2", "d")
    error = f"boom-{queue}"
    partition_ids = {}
    page = await (await client.get(f"/api/v1/messages?queue={queue}")).get_json()
    for row in page["messages"]:
        partition_ids[row["transactionId"]] = row["partitionId"]
    assert len(pushed) == 3 and len(partition_ids) == 4
    for txid, said in (("a", error), ("b", error), ("d", f"other-{queue}")):
        resp = await client.post(
            f"/api/v1/messages/{partition_ids[txid]}/{txid}/dlq", json={"errorMessage": said}
        )
        assert resp.status_code == 200, await resp.get_data(as_text=True)
    status = await (await client.get(f"/api/v1/status?queue={queue}")).get_json()
    dlq = status["deadLetterQueue"]
    # narrowed to this queue (the session's database holds other tests' dead letters)
    assert dlq["topErrors"] == [
        {"error": error, "count": 2},
        {"error": f"other-{queue}", "count": 1},
    ]
    assert dlq["affectedPartitions"] == 2
    # the whole service's window: the commonest errors first, five at most
    everything = await (await client.get("/api/v1/status")).get_json()
    counts = [e["count"] for e in everything["deadLetterQueue"]["topErrors"]]
    assert counts == sorted(counts, reverse=True) and 2 <= len(counts) <= 5
    assert everything["deadLetterQueue"]["affectedPartitions"] >= 2


def test_queue_flow_keeps_an_hour_of_minutes_and_at_most_its_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [3600.0 * 100]
    flow = QueueFlow(clock=lambda: now[0])
    flow.pushed("a", 3)
    flow.popped("a", [0.5, 1.5])
    flow.found_nothing("b")
    flow.acked("a", refused=False)
    flow.acked("a", refused=True)
    [(minute, name, f), (_, other, g)] = flow.rows(0, now[0])
    assert (minute, name) == (now[0], "a") and other == "b"
    assert (f.pushes, f.pops, f.lag_sum_s, f.lag_max_s) == (3, 2, 2.0, 1.5)
    assert (f.acks, f.acks_refused, g.empty_pops) == (2, 1, 1)
    now[0] += 60 * 61  # past the hour: the first minute goes
    flow.pushed("a", 1)
    assert [m for m, _, _ in flow.rows(0, now[0])] == [now[0]]
    assert flow.entries == 1
    monkeypatch.setattr("queen.flow.FLOW_MAX_ENTRIES", 3)
    now[0] += 60
    flow.pushed("x", 1)
    flow.pushed("y", 1)  # 3 entries over two minutes: within the bound
    now[0] += 60
    flow.pushed("z", 1)  # a fourth: the oldest minute goes
    assert {m for m, _, _ in flow.rows(0, now[0])} == {now[0] - 60, now[0]}
    assert flow.entries == 3

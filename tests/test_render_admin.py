"""What the admin API's renderers decide on their own, from typed admin results, without a
database. The shapes the original broker answers (every key path, its JSON type, the figures
the data decides) are held to the original's captured answers by
``tests/test_golden_original.py``; what is tested here is ours alone: keys the original lacks,
how a missing figure renders, orders, labels and statuses the renderers choose, the
Prometheus text's escaping."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from queen.admin.figures import MessageCounts
from queen.admin.gauges import QueueGauges
from queen.admin.groups import GroupOnQueue, GroupPartition, GroupStanding
from queen.admin.history import RatePoint, Rates
from queen.admin.messages import MessageDeletion, MessageDetail, MessagePage, StoredMessage
from queen.admin.params import Page, TimeRange
from queen.admin.payloads import Shown
from queen.admin.queues import (
    ConfiguredQueue,
    Depth,
    Grouping,
    Groupings,
    QueueFigures,
    QueuePage,
    QueueStatus,
    QueueSummary,
)
from queen.admin.system import (
    Overview,
    ProcessSeries,
    ProcessState,
    QueueFlowSeries,
    QueueLagPoint,
    RetentionFigures,
    Status,
)
from queen.consume.policy import iso_utc
from queen.http import render_admin as render
from queen.metrics import render_labelled_gauges
from queen.records import QueueOptions
from queen.storage.admin import DeadLetterRecord, GroupView

AT = datetime(2026, 4, 26, 10, 59, 28, 267_891, tzinfo=UTC)
LATER = AT + timedelta(minutes=5)
WINDOW = TimeRange(AT - timedelta(hours=1), AT)
COUNTS = MessageCounts(total=7, pending=4, processing=1, completed=2, failed=3, dead_letter=1)
EMPTY = MessageCounts(0, 0, 0, 0, 0, 0)
SUMMARY = QueueSummary(12, "orders", "shop", "ship", 2, AT, 3, COUNTS, AT, 120.19, None)
QUEUE = ConfiguredQueue(12, "orders", "shop", "ship", AT, QueueOptions())
PROCESS = ProcessState(4242, 1234.6, 3, True, False, None, {})
OVERVIEW = Overview(
    queues=5,
    partitions=7,
    namespaces=2,
    tasks=1,
    consumer_groups=3,
    messages=COUNTS,
    oldest_pending_at=AT,
    oldest_pending_age_s=120.19,
    rates=Rates(9.1, 0.3, 0.2),
    push_maintenance=False,
    pop_maintenance=True,
    process=PROCESS,
    at=LATER,
)
# ten seconds ending at AT, with no pool known
POINT = RatePoint(AT, 10.0, Rates(0.7, 0.3, 0.2), 0.0, 0.1, 7, 2, 3.7, 40_001_234)
POINT_START = iso_utc(AT - timedelta(seconds=10))
COUNTERS = {
    "push_requests": 10,
    "pop_requests": 4,
    "ack_requests": 0,
    "push_items_queued": 25,
    "pop_messages": 6,
    "acks": 0,
    "push_transaction_failures": 1,
    "acks_refused": 2,
    "acks_dlq": 3,
}
STANDING = GroupStanding(
    name="g1",
    queue="orders",
    partitions=2,
    leased=1,
    lag=7,
    max_time_lag_s=120.204,
    oldest_pending_at=AT,
    last_consumed_at=LATER,
    subscription_mode="all",
    subscribed_at=None,
    subscription_created_at=AT,
    lagging=2,
    popped=2,
    popped_lag=7,
    popped_lagging=2,
    acknowledged=True,
)
MESSAGE = StoredMessage(
    partition_id=6,
    queue="orders",
    partition="p2",
    namespace="shop",
    task="ship",
    offset=1,
    message_id="01a2340c-0393-7000-8001-84c803337018",
    transaction_id="b2",
    status="processing",
    trace_id=None,
    producer_sub="alice",
    created_at=AT,
    lease_expires_at=LATER,
)


def _status(counters: dict[str, float] | None = None) -> dict[str, Any]:
    return render.status(Status(WINDOW, [POINT], OVERVIEW, [SUMMARY], 10.0, counters or COUNTERS))


# --- queues ------------------------------------------------------------------------------------


def test_a_page_of_queues_counts_every_match_not_only_the_page() -> None:
    body = render.queue_page(QueuePage([SUMMARY], total=41, page=Page(1, 40)))
    assert len(body["queues"]) == 1
    assert body["total"] == 41
    assert body["pagination"] == {"limit": 1, "offset": 40, "total": 41}


def test_a_queue_without_figures_renders_them_as_null_and_lists_no_partition() -> None:
    body = render.queue_status(QueueStatus(QueueFigures(QUEUE, None, [], Page(100, 0)), []))
    assert body["queue"]["name"] == "orders"
    assert body["totals"] is None and body["messages"] is None
    assert body["oldestPendingAt"] is None
    assert (body["partitions"], body["partitionCount"], body["consumerGroups"]) == ([], 0, [])


def test_namespaces_and_tasks_are_keyed_by_what_groups_them_and_may_be_none() -> None:
    items = [Grouping("shop", queues=2, partitions=5, messages=Depth(9, 4, 1))]
    assert render.groupings(Groupings("namespace", items))["namespaces"][0]["namespace"] == "shop"
    assert render.groupings(Groupings("task", items))["tasks"][0]["task"] == "shop"
    assert render.groupings(Groupings("task", [])) == {"tasks": []}


def test_queue_lag_is_newest_first_and_queue_ops_oldest_first_with_unkept_figures_null() -> None:
    older = QueueLagPoint(AT - timedelta(minutes=1), "orders", 4, 1500.0, 2500.0)
    newer = QueueLagPoint(AT, "orders", 2, 10.5, 11.0)
    flow = QueueFlowSeries(WINDOW, [older, newer])
    assert [row["popCount"] for row in render.queue_lag(flow)] == [2, 4]
    ops = render.queue_ops(flow)
    assert [row["popMessages"] for row in ops["series"]] == [4, 2]
    assert [row["popPerSecond"] for row in ops["series"]] == [0.07, 0.03]  # per minute / 60
    for row in ops["series"]:
        assert all(row[key] is None for key in render.UNKEPT_QUEUE_OPS)
    assert render.parked_replicas(flow)["series"] == []


# --- history -----------------------------------------------------------------------------------


def test_a_history_point_is_labelled_by_the_start_of_its_interval() -> None:
    """As the original's buckets are; its dashboard drops a bucket less than one bucket old,
    so a point labelled by its end would always be dropped."""
    series = ProcessSeries(WINDOW, "hour", 4242, [POINT])
    assert _status()["throughput"][0]["timestamp"] == POINT_START
    assert render.analytics(series)["throughput"][0]["timestamp"] == POINT_START
    assert render.worker_metrics(series)["timeSeries"][0]["timestamp"] == POINT_START
    [replica] = render.system_metrics(series)["replicas"]
    assert replica["timeSeries"][0]["timestamp"] == POINT_START


def test_a_pool_not_known_renders_its_figures_as_null() -> None:
    status = _status()
    assert status["throughput"][0]["dbPoolSize"] is None
    assert status["throughput"][0]["dbPoolIdle"] is None
    [worker] = status["workers"]
    assert worker["freeSlots"] is None and worker["dbConnections"] is None
    [replica] = render.system_metrics(ProcessSeries(WINDOW, "hour", 1, [POINT]))["replicas"]
    database = replica["timeSeries"][0]["metrics"]["database"]
    assert {name: gauge["last"] for name, gauge in database.items()} == dict.fromkeys(
        ("pool_size", "pool_idle", "pool_active")
    )
    known = dataclasses.replace(POINT, pool_size=6, pool_active=2)
    assert (
        render.status(Status(WINDOW, [known], OVERVIEW, [], 10.0, COUNTERS))["workers"][0][
            "freeSlots"
        ]
        == 4
    )


def test_an_empty_history_has_no_newest_point() -> None:
    body = render.worker_metrics(ProcessSeries(WINDOW, "hour", 4242, []))
    assert body["timeSeries"] == [] and body["workers"][0]["lastSeen"] is None
    assert body["workers"][0]["freeSlots"] is None


def test_status_counts_never_go_negative_and_a_ratio_of_no_requests_is_zero() -> None:
    messages = _status(COUNTERS | {"pop_messages": 30, "acks_refused": 5})["messages"]
    assert messages["pending"] == 0  # more popped than stored (redeliveries)
    assert messages["completed"] == 0  # more refused than taken
    assert messages["batchEfficiency"]["ack"] == 0  # no ack request at all
    assert messages["batchEfficiency"]["push"] == 2.5


def test_retention_without_a_window_or_removals_is_an_empty_series() -> None:
    body = render.retention(RetentionFigures({}, {}, 10.0))
    assert body["timeRange"] is None and body["bucketMinutes"] == 1 and body["series"] == []
    assert set(body["totals"].values()) == {0}
    removed = dataclasses.replace(POINT, deltas={"retention_messages_removed": 3})
    idle = dataclasses.replace(POINT, at=AT - timedelta(seconds=10))
    body = render.retention(RetentionFigures({}, {}, 10.0, WINDOW, [idle, removed]))
    assert [row["bucket"] for row in body["series"]] == [POINT_START]  # idle is left out
    assert body["totals"]["totalMsgs"] == 3


def test_the_overview_without_a_spool_renders_it_as_null() -> None:
    body = render.overview(OVERVIEW)
    assert body["process"]["spool"] is None and body["process"]["databaseUp"] is True
    assert body["maintenance"] == {"push": False, "pop": True}


# --- messages ----------------------------------------------------------------------------------


def test_a_page_of_messages_has_no_payloads_and_a_queues_list_is_its_rows() -> None:
    page = MessagePage([MESSAGE], Page(50, 0), WINDOW)
    [row] = render.message_page(page)["messages"]
    assert "payload" not in row
    assert render.queue_messages(page) == [row]


def test_a_message_detail_passes_its_group_and_dlq_times_on_as_the_database_wrote_them() -> None:
    lease = datetime(2026, 12, 2, 0, 3, 52, 385_790, tzinfo=UTC)
    failed = datetime(2026, 12, 1, 23, 58, 52, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    detail = MessageDetail(
        message=MESSAGE,
        payload=Shown({"n": 2}, encrypted=True, error=None),
        consumer_groups=[GroupView("g1", consumed=False, leased=True, lease_expires_at=lease)],
        dead_letters=[
            DeadLetterRecord("g1", "boom: unparsable", 2, failed),
            DeadLetterRecord("g1", "older", 1, failed - timedelta(days=1)),
        ],
        lease_time_s=300,
        retry_limit=3,
        retry_delay_ms=1000,
        ttl_s=3600,
        priority=0,
    )
    body = render.message_detail(detail)
    # microseconds without their trailing zeros, and the offset the database wrote
    assert body["consumerGroups"][0]["leaseExpiresAt"] == "2026-12-02T00:03:52.38579+00:00"
    assert [d["failedAt"] for d in body["deadLetters"]] == [
        "2026-12-01T23:58:52+05:30",
        "2026-11-30T23:58:52+05:30",
    ]
    assert body["leaseExpiresAt"] == "2026-04-26T11:04:28.267891+00:00"
    # the newest dead letter's (the first)
    assert (body["errorMessage"], body["retryCount"]) == ("boom: unparsable", 2)


def test_a_message_without_dead_letters_or_a_readable_payload_renders_them_as_null() -> None:
    plain = MessageDetail(MESSAGE, Shown(None, False, "unreadable"), [], [], 1, 0, 0, 0, 0)
    body = render.message_detail(plain)
    assert (body["errorMessage"], body["retryCount"], body["deadLetters"]) == (None, None, [])
    assert body["payload"] is None and body["payloadError"] == "unreadable"
    unleased = dataclasses.replace(MESSAGE, lease_expires_at=None)
    assert (
        render.message_detail(dataclasses.replace(plain, message=unleased))["leaseExpiresAt"]
        is None
    )


def test_a_deletion_refused_is_a_4xx_that_says_why() -> None:
    """The original answers 200 with ``success: false``; here a leased message is a 409 and
    a missing one a 404, each with an error."""
    body, status = render.message_deleted(MessageDeletion(6, "b2", "deleted"))
    assert (status, body["success"], "error" in body) == (200, True, False)
    body, status = render.message_deleted(MessageDeletion(6, "b2", "leased"))
    assert (status, body["success"]) == (409, False) and "leased" in body["error"]
    body, status = render.message_deleted(MessageDeletion(6, "b2", "missing"))
    assert (status, body["success"], body["error"]) == (404, False, "Message not found")
    assert (body["partitionId"], body["transactionId"]) == ("6", "b2")


# --- consumer groups ---------------------------------------------------------------------------


def test_groups_are_stable_when_caught_up() -> None:
    caught_up = GroupStanding(
        "__QUEUE_MODE__",
        "orders",
        3,
        0,
        0,
        0.0,
        None,
        LATER,
        None,
        None,
        None,
        popped=3,
        acknowledged=True,
    )
    body = render.group_standing(caught_up)
    assert body["state"] == "Stable" and body["maxTimeLag"] == 0.0
    assert body["oldestPendingAt"] is None and body["subscriptionMode"] is None


def test_a_group_state_means_what_the_originals_does() -> None:
    """Lagging: its oldest message to receive is over 5 minutes old (a few messages behind
    is no lag); Stable: it acknowledged on the queue; Dead: it never did (popping alone is
    not enough)."""
    assert render.group_state(STANDING) == "Stable"
    late = dataclasses.replace(STANDING, max_time_lag_s=300.5)
    assert render.group_state(late) == "Lagging"
    popped_only = dataclasses.replace(STANDING, acknowledged=False, max_time_lag_s=12.0)
    assert render.group_state(popped_only) == "Dead"
    never = dataclasses.replace(popped_only, last_consumed_at=None, popped=0)
    assert render.group_state(never) == "Dead"
    assert render.group_standing(never)["members"] == 0
    assert render.group_state(dataclasses.replace(never, max_time_lag_s=301.0)) == "Lagging"


def test_a_groups_partitions_with_lag_are_of_those_it_reads_its_lag_of_every_one() -> None:
    """The original's partitionsWithLag counts the partitions the group reads (popped);
    totalLag stays ours: every partition it will read."""
    wide = dataclasses.replace(STANDING, lag=40, lagging=5, popped_lag=7, popped_lagging=2)
    body = render.group_standing(wide)
    assert body["partitionsWithLag"] == 2 and body["totalLag"] == 40


def test_a_group_detail_puts_its_page_of_partitions_beside_their_count() -> None:
    leased = GroupPartition("p1", 5, 0, 5, 5, 120.204, LATER, AT)
    idle = GroupPartition("p2", 6, 2, 2, 0, 0.0, None, None)
    body = render.group_detail([GroupOnQueue(STANDING, [leased])])["orders"]
    assert [p["partition"] for p in body["partitions"]] == ["p1"]
    assert body["partitionCount"] == 2 and body["state"] == "Stable"
    [shown] = render.group_detail([GroupOnQueue(STANDING, [idle])])["orders"]["partitions"]
    assert shown["leaseActive"] is False and shown["leaseExpiresAt"] is None
    assert shown["lastConsumedAt"] is None
    assert render.group_detail([]) == {}


# --- Prometheus --------------------------------------------------------------------------------


def test_queue_gauges_are_labelled_families_under_one_help_and_type_each() -> None:
    quoted = QueueSummary(13, 'a"b', "", "", 0, AT, 1, EMPTY, None, 0.0, None)
    text = render_labelled_gauges(render.queue_gauges(QueueGauges([SUMMARY, quoted], [STANDING])))
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families)) == 7
    assert 'queen_queue_depth{queue="a\\"b"} 0.0' in text.splitlines()  # the label escaped
    assert 'queen_dlq_depth{scope="cluster"} 1.0' in text.splitlines()  # every queue's
    assert 'queen_consumer_group_lag{consumer_group="g1",queue="orders"} 7.0' in text
    empty = render_labelled_gauges(render.queue_gauges(QueueGauges([], [])))
    assert empty.count("# TYPE") == 7  # every family, even with no queue
    described = render_labelled_gauges(
        render.queue_gauges(QueueGauges([SUMMARY], [])), render.QUEUE_GAUGE_HELP
    )
    assert "# HELP queen_queue_depth Messages of the queue not yet completed" in described

"""Pure rules of the consume side: option parsing, pop parameters, subscriptions, sizing, acks
and transactions, tested without Trio or a database."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from queen.consume.errors import InvalidRequest
from queen.consume.options import parse_options
from queen.consume.policy import iso_of_uuid7, iso_utc, pop_sizing, subscription_of
from queen.consume.requests import (
    NEVER_LEASE,
    ack_batch,
    ack_item,
    checked_ack,
    checked_lease_seconds,
    checked_pop,
    dlq_query,
    enabled_flag,
    lease_seconds,
    pop_request,
    subscription_timestamp,
    transaction_request,
)
from queen.http.render import queue_options
from queen.ids import mint_id, timestamp_of
from queen.records import (
    QUEUE_MODE,
    AckItem,
    QueueOptions,
    Subscription,
    SubscriptionStart,
)

# --- options --------------------------------------------------------------------------------


def test_options_default_to_the_contract_values() -> None:
    wire = queue_options(parse_options({}))
    assert wire == {
        "priority": 0,
        "leaseTime": 300,
        "retryLimit": 3,
        "retryDelay": 1000,
        "maxSize": 0,
        "ttl": 3600,
        "deadLetterQueue": False,
        "dlqAfterMaxRetries": False,
        "delayedProcessing": 0,
        "windowBuffer": 0,
        "retentionSeconds": 0,
        "completedRetentionSeconds": 0,
        "retentionEnabled": False,
        "encryptionEnabled": False,
        "maxWaitTimeSeconds": 0,
        "dedupWindowSeconds": 3600,
    }


def test_options_take_given_values_and_ignore_unknown_keys() -> None:
    options = parse_options(
        {
            "leaseTime": 5,
            "retryLimit": 0,
            "dedupWindowSeconds": 0,
            "windowBuffer": 2.0,
            "deadLetterQueue": True,
            "somethingNew": "x",
            "priority": None,
        }
    )
    assert options == QueueOptions(
        lease_time_s=5, retry_limit=0, dedup_window_s=0, window_buffer_s=2, dead_letter_queue=True
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("nope", "options must be an object"),
        ({"leaseTime": "300"}, "options.leaseTime must be an integer"),
        ({"leaseTime": 0}, "options.leaseTime must be between 1"),
        ({"retryLimit": -1}, "options.retryLimit must be between 0"),
        ({"retryDelay": 1.5}, "options.retryDelay must be an integer"),
        ({"ttl": True}, "options.ttl must be an integer"),
        ({"maxSize": 2**40}, "options.maxSize must be between"),
        ({"deadLetterQueue": 1}, "options.deadLetterQueue must be a boolean"),
        ({"encryptionEnabled": 1}, "options.encryptionEnabled must be a boolean"),
    ],
)
def test_bad_options_are_refused_with_their_name(options: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse_options(options)


# --- subscriptions, sizing, times -----------------------------------------------------------


def test_subscription_parsing_follows_the_contract() -> None:
    assert subscription_of(None, None) == Subscription(SubscriptionStart.ALL)
    assert subscription_of("all", "") == Subscription(SubscriptionStart.ALL)
    for other in ("from_beginning", "FROM_BEGINNING", "latest", "anything"):
        assert subscription_of(other, None) == Subscription(SubscriptionStart.ALL), other
    assert subscription_of("NEW", None) == Subscription(SubscriptionStart.NOW)
    assert subscription_of("new", None) == Subscription(SubscriptionStart.NOW)
    assert subscription_of("new-only", None) == Subscription(SubscriptionStart.NOW)
    assert subscription_of(None, "now") == Subscription(SubscriptionStart.NOW)
    at = subscription_of("new", "2024-01-01T00:00:00Z")  # a timestamp wins over the mode
    assert at == Subscription(SubscriptionStart.AT, datetime(2024, 1, 1, tzinfo=UTC))
    naive = subscription_of(None, "2024-01-01T10:00:00")
    assert naive.at == datetime(2024, 1, 1, 10, tzinfo=UTC)
    with pytest.raises(ValueError):
        subscription_of(None, "yesterday")


def test_pop_sizing_uses_client_values_and_fills_the_rest() -> None:
    common = {
        "default_batch": 1,
        "autopilot_batch": 100,
        "autopilot_partitions": 4,
        "autopilot_spread": 8,
    }
    assert pop_sizing(None, None, one_partition_route=False, autopilot=False, **common) == (
        pop_sizing(1, 1, one_partition_route=False, autopilot=False, **common)
    )
    plain = pop_sizing(None, None, one_partition_route=False, autopilot=False, **common)
    assert (plain.batch, plain.partitions, plain.spread) == (1, 1, 1)
    # the broker's width, on condition that as many partitions as the spread are ready
    auto = pop_sizing(None, None, one_partition_route=False, autopilot=True, **common)
    assert (auto.batch, auto.partitions, auto.spread) == (100, 4, 8)
    # the broker never claims more partitions than the batch has messages
    small = pop_sizing(2, None, one_partition_route=False, autopilot=True, **common)
    assert (small.batch, small.partitions, small.spread) == (2, 2, 8)
    alone = pop_sizing(1, None, one_partition_route=False, autopilot=True, **common)
    assert (alone.partitions, alone.spread) == (1, 1)
    # a count the client set is used as it is, whatever is ready
    pinned = pop_sizing(7, 2, one_partition_route=False, autopilot=True, **common)
    assert (pinned.batch, pinned.partitions, pinned.spread) == (7, 2, 1)
    single = pop_sizing(None, 9, one_partition_route=True, autopilot=True, **common)
    assert (single.partitions, single.spread) == (1, 1)


def test_times_are_iso_utc_with_z_and_the_id_carries_creation_time() -> None:
    assert iso_utc(datetime(2026, 4, 26, 10, 59, 28, 267966, tzinfo=UTC)) == (
        "2026-04-26T10:59:28.267Z"
    )
    message_id = mint_id()
    assert iso_of_uuid7(message_id) == iso_utc(timestamp_of(message_id))
    assert iso_of_uuid7(message_id).endswith("Z")


# --- pop parameters -------------------------------------------------------------------------


def test_pop_parameters_as_the_client_sends_them() -> None:
    request = pop_request(
        {
            "batch": "10",
            "wait": "false",
            "timeout": "30000",
            "consumerGroup": "g",
            "autoAck": "true",
            "subscriptionMode": "new",
            "subscriptionFrom": "2024-01-01T00:00:00Z",
            "partitions": "4",
            "autopilot": "true",
        },
        queue="q",
    )
    assert (request.queue, request.batch, request.partitions) == ("q", 10, 4)
    assert (request.wait, request.timeout_ms, request.auto_ack, request.autopilot) == (
        False,
        30000,
        True,
        True,
    )
    assert request.consumer_group == "g"
    assert request.subscription.start is SubscriptionStart.AT


def test_pop_defaults_are_queue_mode_no_wait_and_broker_sizing() -> None:
    request = pop_request({}, queue="q")
    assert request.consumer_group == QUEUE_MODE
    assert (request.batch, request.partitions, request.wait) == (None, None, False)
    assert request.timeout_ms == 30000
    assert pop_request({"consumerGroup": ""}, queue="q").consumer_group == QUEUE_MODE


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"batch": "0"}, "batch must be between 1 and 50"),
        ({"batch": "51"}, "batch must be between 1 and 50"),
        ({"batch": "ten"}, "batch must be an integer"),
        ({"wait": "maybe"}, "wait must be true or false"),
        ({"timeout": "-1"}, "timeout must be between"),
        ({"partitions": "0"}, "partitions must be between"),
        ({"subscriptionFrom": "soon"}, "subscriptionFrom must be"),
        ({"consumerGroup": "a\nb"}, "consumerGroup must not contain control characters"),
    ],
)
def test_bad_pop_parameters_are_refused(args: dict[str, str], message: str) -> None:
    """By the route's reading (types) or by the rules the consume service applies."""
    with pytest.raises(InvalidRequest, match=message):
        checked_pop(pop_request(args, queue="q"), max_batch=50)


def test_a_filtered_pop_needs_a_namespace_or_a_task() -> None:
    with pytest.raises(InvalidRequest, match="namespace or a task"):
        checked_pop(pop_request({}, queue=None), max_batch=50)
    assert checked_pop(pop_request({"task": "t"}, queue=None), max_batch=50).task == "t"


# --- acks and transactions ------------------------------------------------------------------


def test_ack_items_accept_the_client_shapes() -> None:
    item = ack_item(
        {
            "transactionId": "t",
            "partitionId": "12",
            "status": "success",
            "error": None,
            "consumerGroup": None,
            "leaseId": "0190aaaa-0000-7000-8000-000000000001",
        }
    )
    assert (item.partition_id, item.status, item.consumer_group) == (12, "completed", QUEUE_MODE)
    assert item.lease_id == "0190aaaa-0000-7000-8000-000000000001"
    assert (
        ack_item({"id": "m", "partitionId": "1"}, default_status="completed").transaction_id == "m"
    )
    foreign = ack_item(
        {"transactionId": "t", "partitionId": "p-uuid", "status": "failed", "leaseId": "not-a-uuid"}
    )
    assert foreign.partition_id is None and foreign.lease_id == NEVER_LEASE
    for spelling in ("0190AAAA-0000-7000-8000-000000000001", "{0190aaaa000070008000000000000001}"):
        again = ack_item(
            {"transactionId": "t", "partitionId": "12", "status": "completed", "leaseId": spelling}
        )
        assert again.lease_id == "0190aaaa-0000-7000-8000-000000000001"  # as PostgreSQL writes it
    batch = ack_batch(
        {
            "acknowledgments": [{"transactionId": "t", "partitionId": "3", "status": "retry"}],
            "consumerGroup": "g",
        }
    )
    assert batch[0].consumer_group == "g" and batch[0].status == "retry"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "body must be an object"),
        ({"partitionId": "1", "status": "completed"}, "transactionId is required"),
        ({"transactionId": "t", "status": "completed"}, "partitionId is required"),
        ({"transactionId": "t", "partitionId": "1", "status": "done"}, "status must be one of"),
        (
            {"transactionId": "t", "partitionId": "1", "status": "completed", "error": 5},
            "error must be a string",
        ),
        (
            {"transactionId": "t", "partitionId": 1.5, "status": "completed"},
            "partitionId must be a string",
        ),
    ],
)
def test_bad_acks_are_refused(body: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        ack_item(body)


@pytest.mark.parametrize("text", ["a\x00b", "a\ud800b"])
def test_texts_postgresql_cannot_hold_are_refused_in_acks(text: str) -> None:
    for body, field in (
        ({"transactionId": text, "partitionId": "1"}, "transactionId"),
        ({"transactionId": "t", "partitionId": "1", "error": text}, "error"),
    ):
        with pytest.raises(InvalidRequest, match=f"{field} must not contain NUL"):
            ack_item(body, default_status="failed")
    with pytest.raises(InvalidRequest, match="transactionId must not contain NUL"):
        checked_ack(AckItem(transaction_id=text, partition_id=1, status="completed"))
    with pytest.raises(InvalidRequest, match="error must not contain NUL"):
        checked_ack(AckItem(transaction_id="t", partition_id=1, status="failed", error=text))


def test_ack_batch_needs_an_array() -> None:
    with pytest.raises(InvalidRequest, match="acknowledgments array is required"):
        ack_batch({"consumerGroup": "g"})


def test_transaction_results_are_flat_and_acks_keep_their_own_lease_ids() -> None:
    lease = "0190aaaa-0000-7000-8000-000000000001"
    request = transaction_request(
        {
            "operations": [
                {"type": "ack", "transactionId": "t1", "partitionId": "5"},
                {
                    "type": "push",
                    "items": [
                        {
                            "queue": "q",
                            "payload": 1,
                            "traceId": "6f1d7c2e-1111-4000-8000-000000000001",
                        },
                        {"queue": "q", "payload": 2},
                    ],
                },
                {"type": "ack", "transactionId": "t2", "partitionId": "5", "status": "dlq"},
            ],
            "requiredLeases": [lease],
        }
    )
    assert [a.index for a in request.acks] == [0, 3]
    assert [p.index for p in request.pushes] == [1]
    assert request.size == 4
    # which required lease an ack without its own acts under is the database's to say (it
    # knows which lease holds the partition): tests/test_transaction.py
    assert [a.item.lease_id for a in request.acks] == [None, None]
    assert request.required_leases == [lease]
    assert request.acks[0].item.status == "completed"
    batch = request.pushes[0].prepared.batches[0]
    assert batch.trace_ids == ["6f1d7c2e-1111-4000-8000-000000000001", None]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "operations array is required"),
        ({"operations": []}, "operations array cannot be empty"),
        ({"operations": [{"type": "delete"}]}, r"operations\[0\].type must be"),
        (
            {"operations": [{"type": "push", "items": [{"queue": "q"}]}]},
            r"operations\[0\].items\[0\].payload is required",
        ),
        (
            {
                "operations": [
                    {"type": "push", "items": [{"queue": "q", "payload": 1, "traceId": "abc"}]}
                ]
            },
            "traceId must be a UUID",
        ),
        (
            {"operations": [{"type": "ack", "partitionId": "1"}]},
            r"operations\[0\].transactionId is required",
        ),
        (
            {
                "operations": [{"type": "ack", "transactionId": "t", "partitionId": "1"}],
                "requiredLeases": "L",
            },
            "requiredLeases must be an array",
        ),
        (
            {
                "operations": [{"type": "ack", "transactionId": "t", "partitionId": "1"}],
                "kv": [{"op": "put"}],
            },
            "kv operations are not supported",
        ),
    ],
)
def test_bad_transactions_are_refused(body: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        transaction_request(body)


def test_small_admin_bodies() -> None:
    assert lease_seconds(None) is None
    assert lease_seconds({"seconds": 30}) == 30
    with pytest.raises(InvalidRequest, match="seconds must be an integer"):
        lease_seconds({"seconds": "soon"})
    with pytest.raises(InvalidRequest, match="seconds must be between 1 and 604800"):
        checked_lease_seconds(lease_seconds({"seconds": 0}))
    assert subscription_timestamp({"subscriptionTimestamp": "2024-01-01T00:00:00Z"}).year == 2024
    with pytest.raises(InvalidRequest, match="subscriptionTimestamp is required"):
        subscription_timestamp({})
    assert enabled_flag({"enabled": False}) is False
    with pytest.raises(InvalidRequest, match=r"enabled \(boolean\) is required"):
        enabled_flag({"enabled": "yes"})
    page = dlq_query({"queue": "q", "limit": "5", "offset": "10"})
    assert (page.queue, page.limit, page.offset) == ("q", 5, 10)
    with pytest.raises(InvalidRequest, match="limit must be between"):
        dlq_query({"limit": "0"})

"""The streams routes' validation, without a database."""

from __future__ import annotations

import uuid

import pytest

from queen.consume.errors import InvalidRequest
from queen.consume.requests import NEVER_LEASE
from queen.streams.requests import cycle_request, register_request, state_query

QID = str(uuid.UUID(int=5))


def test_the_last_operation_on_a_key_wins_and_keys_travel_in_order() -> None:
    request = cycle_request(
        {
            "query_id": QID.upper(),
            "partition_id": "12",
            "state_ops": [
                {"type": "upsert", "key": "b", "value": 1},
                {"type": "upsert", "key": "a", "value": {"x": [1]}},
                {"type": "delete", "key": "b"},
                {"type": "upsert", "key": "c"},
                {"type": "upsert", "key": "d", "value": None},
            ],
        }
    )
    assert request.query_id == QID and request.partition_id == 12
    assert request.state_keys == ["a", "b", "c", "d"]
    assert request.state_values == ['{"x":[1]}', None, "{}", "null"]
    assert request.state_ops == 5
    assert request.ack is None and request.push is None and request.release_lease is True
    assert request.consumer_group == "__QUEUE_MODE__"


def test_integers_beyond_64_bits_are_stored_exactly() -> None:
    big = 2**70 + 1
    request = cycle_request(
        {
            "query_id": QID,
            "partition_id": 3,
            "state_ops": [{"type": "upsert", "key": "k", "value": {"n": big}}],
        }
    )
    assert request.state_values == [f'{{"n":{big}}}']


def test_a_lease_that_is_not_a_uuid_can_never_be_live() -> None:
    request = cycle_request(
        {
            "query_id": QID,
            "partition_id": "1",
            "consumer_group": "streams.q",
            "ack": {"transactionId": "t", "leaseId": "not-a-lease", "status": "success"},
        }
    )
    assert request.ack is not None and request.ack.lease_id == NEVER_LEASE
    assert request.consumer_group == "streams.q"


def test_sink_items_follow_the_push_rules_and_keep_their_trace_id() -> None:
    trace = str(uuid.UUID(int=9))
    request = cycle_request(
        {
            "query_id": QID,
            "partition_id": "1",
            "push_items": [
                {"queue": "out", "payload": {"a": 1}, "traceId": trace, "producerSub": "x"},
                {"queue": "out", "partition": "p", "payload": 2, "transactionId": "t2"},
            ],
        }
    )
    assert request.push is not None and request.push.count == 2
    batches = {b.key.partition: b for b in request.push.batches}
    assert batches["Default"].trace_ids == [trace]
    assert batches["p"].transaction_ids == ["t2"]


@pytest.mark.parametrize("pid", ["0", "-1", "1.5", "9223372036854775808", 0, True, None])
def test_partition_ids_are_positive_bigints_as_pops_deliver_them(pid: object) -> None:
    with pytest.raises(InvalidRequest, match="partition_id"):
        cycle_request({"query_id": QID, "partition_id": pid})


def test_register_and_state_query_defaults() -> None:
    reg = register_request({"name": "q", "source_queue": "src", "config_hash": "h"})
    assert (reg.sink_queue, reg.reset) == (None, False)
    query = state_query({"query_id": QID, "partition_id": "4", "keys": ["a", "a", "b"]})
    assert query.keys == ["a", "b"] and query.key_prefix is None
    assert query.ripe_at_or_before is None
    with pytest.raises(InvalidRequest, match="source_queue"):
        register_request({"name": "q", "source_queue": "bad\x01name", "config_hash": "h"})


@pytest.mark.parametrize("text", ["a\x00b", "a\ud800b"])
def test_keys_and_values_postgresql_cannot_hold_are_refused(text: str) -> None:
    for ops in (
        [{"type": "upsert", "key": text, "value": 1}],
        [{"type": "upsert", "key": "k", "value": {"nested": [text]}}],
        [{"type": "upsert", "key": "k", "value": {text: 1}}],
    ):
        with pytest.raises(InvalidRequest, match="NUL or unpaired surrogates"):
            cycle_request({"query_id": QID, "partition_id": "1", "state_ops": ops})


@pytest.mark.parametrize("text", ["a\x00b", "a\ud800b"])
def test_an_acked_transaction_id_postgresql_cannot_hold_is_refused(text: str) -> None:
    with pytest.raises(InvalidRequest, match=r"ack\.transactionId cannot contain NUL"):
        cycle_request({"query_id": QID, "partition_id": "1", "ack": {"transactionId": text}})

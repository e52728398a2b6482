"""Push body validation and grouping (pure), plus the pure policies and id minting."""

from __future__ import annotations

import tracemalloc
import uuid

import pytest

from queen import intake
from queen.actors.policy import coalesce_count
from queen.ids import mint_ids, timestamp_of
from queen.intake import prepare_push
from queen.model import DEFAULT_PARTITION, InvalidPush, PartitionKey, first_wins


def test_groups_by_queue_and_partition_in_body_order() -> None:
    items = [
        {"queue": "a", "partition": "1", "payload": 0},
        {"queue": "b", "partition": "1", "payload": 1},
        {"queue": "a", "partition": "1", "payload": 2},
        {"queue": "a", "payload": 3},
    ]
    prepared = prepare_push(items)
    assert prepared.count == 4
    keys = [b.key for b in prepared.batches]
    assert keys == [PartitionKey("a", "1"), PartitionKey("b", "1"), PartitionKey("a", "Default")]
    assert prepared.batches[0].indexes == [0, 2]
    assert prepared.batches[0].payloads == [b"0", b"2"]


def test_missing_transaction_id_becomes_the_message_id() -> None:
    prepared = prepare_push(
        [{"queue": "q", "payload": 1}, {"queue": "q", "payload": 2, "transactionId": ""}]
    )
    batch = prepared.batches[0]
    assert batch.transaction_ids == batch.message_ids


def test_payload_null_is_a_payload() -> None:
    prepared = prepare_push([{"queue": "q", "payload": None}])
    assert prepared.batches[0].payloads == [b"null"]


def test_partition_defaults_to_default() -> None:
    assert (
        prepare_push([{"queue": "q", "payload": 1}]).batches[0].key.partition == DEFAULT_PARTITION
    )
    assert DEFAULT_PARTITION == "Default"


def test_trace_id_dropped_unless_asked_for() -> None:
    trace = str(uuid.uuid4())
    items = [{"queue": "q", "payload": 1, "traceId": trace}]
    assert prepare_push(items).batches[0].trace_ids is None
    assert prepare_push(items, keep_trace_ids=True).batches[0].trace_ids == [trace]
    with pytest.raises(InvalidPush, match="traceId must be a UUID"):
        prepare_push([{"queue": "q", "payload": 1, "traceId": "nope"}], keep_trace_ids=True)


def test_producer_sub_in_the_body_is_never_read() -> None:
    prepared = prepare_push([{"queue": "q", "payload": 1, "producerSub": "forged"}])
    assert not hasattr(prepared.batches[0], "producer_sub")


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (None, "items array is required"),
        ({"queue": "q"}, "items array is required"),
        ("x", "items array is required"),
        ([1], r"items\[0\] must be an object"),
        ([None], r"items\[0\] must be an object"),
        ([["q"]], r"items\[0\] must be an object"),
        ([{"payload": 1}], r"items\[0\].queue is required"),
        ([{"queue": "q"}], r"items\[0\].payload is required"),
        ([{"queue": 5, "payload": 1}], "queue must be a string"),
        ([{"queue": "", "payload": 1}], "queue must not be empty"),
        ([{"queue": "q", "partition": 7, "payload": 1}], "partition must be a string"),
        ([{"queue": "q", "partition": "", "payload": 1}], "partition must not be empty"),
        ([{"queue": "q\x00", "payload": 1}], "control characters"),
        ([{"queue": "q" * 256, "payload": 1}], "longer than 255"),
        ([{"queue": "q", "payload": 1, "transactionId": 5}], "transactionId must be a string"),
        ([{"queue": "q", "payload": 1, "transactionId": ["a"]}], "transactionId must be a str"),
        ([{"queue": "q", "payload": 1, "transactionId": "a\x1fb"}], "control characters"),
        ([{"queue": "q", "payload": 1, "transactionId": "t" * 1025}], "longer than 1024"),
        ([{"queue": "q", "payload": 1}, {"queue": "q"}], r"items\[1\].payload is required"),
        ([{"queue": "q", "payload": {1: 2}}], "not JSON-serialisable"),
    ],
)
def test_invalid_items_are_refused(items: object, message: str) -> None:
    with pytest.raises(InvalidPush, match=message):
        prepare_push(items)


def _shape(prepared: object) -> list[tuple]:
    """A prepared push without its freshly minted ids (a missing transactionId shows as None)."""
    out = []
    for b in prepared.batches:  # type: ignore[attr-defined]
        txs = [None if t == m else t for t, m in zip(b.transaction_ids, b.message_ids, strict=True)]
        out.append((b.key, b.indexes, txs, b.payloads, len(set(b.message_ids))))
    return out


@pytest.mark.parametrize(
    "items",
    [
        [{"queue": "q", "payload": i, "transactionId": f"t{i}"} for i in range(5)],
        [
            {"queue": "q", "partition": f"p{i % 3}", "payload": {"n": i}, "transactionId": f"t{i}"}
            for i in range(10)
        ],
        [
            {"queue": "a", "partition": "x", "payload": None},
            {"queue": "b", "partition": "x", "payload": [1], "transactionId": ""},
            {"queue": "a", "payload": "s", "transactionId": "dup"},
            {"queue": "a", "partition": "x", "payload": 2, "transactionId": "dup"},
            {"queue": "a", "partition": "x", "payload": 10**30},  # re-encoded exactly
        ],
        [{"queue": "q", "payload": 1, "producerSub": "ignored", "extra": True}],
        [{"queue": "q", "partition": "p", "payload": {"a": [1]}, "transactionId": "t"}],
        [{"queue": "q", "payload": None, "transactionId": ""}],
        [{"queue": "q", "partition": None, "payload": 10**30}],
        [],
    ],
)
def test_column_path_matches_the_item_loop(items: list) -> None:
    # keep_trace_ids takes the item-by-item loop; with no traceId the result must be the same
    fast, loop = prepare_push(items), prepare_push(items, keep_trace_ids=True)
    assert fast.count == loop.count == len(items)
    assert _shape(fast) == _shape(loop)
    for batch in fast.batches:
        assert len(batch.message_ids) == len(batch.indexes)


def test_first_wins_policy() -> None:
    assert first_wins(["a", "b", "a", "a", "c", "b"]) == [0, 1, 0, 0, 4, 1]
    assert first_wins([]) == []


def test_coalesce_count_policy() -> None:
    assert coalesce_count([], 10) == 0
    assert coalesce_count([50], 10) == 1  # an oversized request is still written whole
    assert coalesce_count([3, 3, 3, 3], 10) == 3
    assert coalesce_count([3, 8, 1], 10) == 1
    assert coalesce_count([1] * 20, 10) == 10


def test_message_ids_are_uuid7_and_increasing() -> None:
    ids = mint_ids(1000) + mint_ids(5)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for text in ids[:3]:
        parsed = uuid.UUID(text)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
    assert abs(timestamp_of(ids[0]).timestamp() - timestamp_of(ids[-1]).timestamp()) < 5


def test_random_bits_are_never_handed_out_twice() -> None:
    # ids minted one by one take their random bits from a pool read for 4,096 ids at once:
    # across refills no two ids share them, and the ids still increase
    singles = [mint_ids(1)[0] for _ in range(10_000)] + mint_ids(3) + [mint_ids(1)[0]]
    assert singles == sorted(singles)
    assert len({text[-12:] for text in singles}) == len(singles)


@pytest.mark.parametrize("keep_trace_ids", [False, True])
def test_prepared_payloads_hold_only_their_own_bytes(keep_trace_ids: bool) -> None:
    # orjson's result keeps the buffer it was written in (4 KiB for these payloads); a prepared
    # push is held until its write commits, so its payloads must be exact-size copies.
    items = [{"queue": "q", "payload": {"n": i}} for i in range(2000)]
    tracemalloc.start()
    try:
        prepared = prepare_push(items, keep_trace_ids=keep_trace_ids)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert prepared.count == 2000
    assert held < 2000 * 1024, f"{held / 2000:.0f} bytes per item"


@pytest.mark.parametrize("size", [1, 3])
def test_names_found_valid_are_remembered_within_a_bound_and_bad_ones_never(
    monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    monkeypatch.setattr(intake, "KNOWN_NAMES_MAX", 4)
    monkeypatch.setattr(intake, "_known_names", set())
    for n in range(10):
        items = [{"queue": "q", "partition": f"p{n}-{k}", "payload": k} for k in range(size)]
        assert [b.key.partition for b in prepare_push(items).batches] == [
            f"p{n}-{k}" for k in range(size)
        ]
        assert len(intake._known_names) <= 4
    for bad in ("bad\x00", "", "x" * 256):
        items = [{"queue": "q", "partition": bad, "payload": k} for k in range(size)]
        with pytest.raises(InvalidPush):
            prepare_push(items)
        assert bad not in intake._known_names
    # a name remembered as valid is still taken, and its queue's twin still refused
    prepare_push([{"queue": "q", "partition": "ok", "payload": 1}] * size)
    assert "ok" in intake._known_names
    with pytest.raises(InvalidPush):
        prepare_push([{"queue": "q\x00", "partition": "ok", "payload": 1}] * size)

"""The spool record format: round trips, torn tails, damage in the middle."""

from __future__ import annotations

import struct

from queen.model import PartitionKey
from queen.spool.format import HEADER, MAGIC, Skipped, SpoolRecord, encode, read_records


def record(i: int, n: int = 3, sub: str | None = None) -> SpoolRecord:
    return SpoolRecord(
        key=PartitionKey("q", f"p{i % 2}"),
        created_ms=1_700_000_000_000 + i,
        message_ids=[f"m{i}-{j}" for j in range(n)],
        transaction_ids=[f"t{i}-{j}" for j in range(n)],
        payloads=[b'{"n":%d,"text":"line\\nbreak \\u0000"}' % j for j in range(n)],
        producer_subs=None if sub is None else [sub] * n,
    )


def records_of(data: bytes) -> list[SpoolRecord]:
    return [item[2] for item in read_records(data) if not isinstance(item, Skipped)]


def skipped_of(data: bytes) -> list[Skipped]:
    return [item for item in read_records(data) if isinstance(item, Skipped)]


def test_round_trip_keeps_every_field() -> None:
    originals = [record(i, sub="svc-a" if i == 1 else None) for i in range(3)]
    data = b"".join(encode(r) for r in originals)
    assert records_of(data) == originals
    assert skipped_of(data) == []


def test_offsets_and_ends_chain() -> None:
    data = b"".join(encode(record(i)) for i in range(3))
    items = list(read_records(data))
    ends = [item[1] for item in items if not isinstance(item, Skipped)]
    starts = [item[0] for item in items if not isinstance(item, Skipped)]
    assert starts == [0, *ends[:-1]] and ends[-1] == len(data)
    assert [r.message_ids[0] for _, _, r in read_records(data, ends[0])] == ["m1-0", "m2-0"]


def test_torn_tail_costs_only_the_torn_record() -> None:
    whole = b"".join(encode(record(i)) for i in range(3))
    last = encode(record(3))
    for cut in (1, HEADER.size - 1, HEADER.size + 5, len(last) - 1):
        data = whole + last[:cut]
        assert [r.message_ids[0] for r in records_of(data)] == ["m0-0", "m1-0", "m2-0"]
        (skip,) = skipped_of(data)
        assert skip.offset == len(whole) and skip.length == cut


def test_damage_in_the_middle_is_skipped_and_reading_resumes() -> None:
    parts = [encode(record(i)) for i in range(4)]
    damaged = bytearray(parts[1])
    damaged[HEADER.size + 3] ^= 0xFF  # flip a body byte: checksum mismatch
    data = parts[0] + bytes(damaged) + parts[2] + parts[3]
    assert [r.message_ids[0] for r in records_of(data)] == ["m0-0", "m2-0", "m3-0"]
    (skip,) = skipped_of(data)
    assert skip.reason == "checksum mismatch"
    assert skip.offset == len(parts[0]) and skip.length == len(parts[1])


def test_garbage_and_false_magic_are_not_records() -> None:
    fake = MAGIC + struct.pack("<II", 5, 0) + b"hello"  # right shape, wrong checksum
    data = b"\x00junk" + fake + encode(record(7)) + b"tail"
    assert [r.message_ids[0] for r in records_of(data)] == ["m7-0"]
    assert len(skipped_of(data)) == 2
    assert records_of(b"") == []


def test_replay_order_merges_files_by_stamp_and_stops_each_partition_at_its_barrier() -> None:
    from queen.spool.plan import FileRead, Item, replay_order

    def rec(partition: str, stamp: int) -> SpoolRecord:
        return SpoolRecord(
            PartitionKey("q", partition), 0, [f"m{stamp}"], [f"t{stamp}"], [b"1"], stamp=stamp
        )

    a = FileRead(
        "spool-a.log", 0, [Item(0, 1, rec("p", 10), False), Item(1, 2, rec("p", 30), False)]
    )
    b = FileRead(
        "spool-b.log",
        0,
        [
            Item(0, 1, rec("p", 20), False),
            Item(1, 2, rec("r", 25), True),  # committed already
            Item(2, 3, rec("p", 40), False),
            Item(3, 4, None, True),  # an unreadable range
            Item(4, 5, rec("r", 50), False),
        ],
    )
    entries, held = replay_order({"a": a, "b": b}, {PartitionKey("q", "p"): 35}, None)
    assert [item.record.stamp for _, item in entries if item.record] == [10, 20, 30, 50]
    assert held == 1  # p's frame stamped 40 waits for the barrier at 35
    entries, held = replay_order({"a": a, "b": b}, {}, 30)
    assert [item.record.stamp for _, item in entries if item.record] == [10, 20]
    assert held == 3

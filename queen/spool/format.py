"""The spool's on-disk record format (pure: bytes in, bytes out).

A spool file is a sequence of records. One record holds the frames of one write of one
partition, everything needed to store them later::

    offset  size  field
    0       4     magic  b"QSR1"
    4       4     body length, unsigned little-endian
    8       4     CRC-32 of the body, unsigned little-endian
    12      n     body: one JSON object (see below)

The body is a JSON head, a newline, then the payloads (the JSON text each message is stored
with) back to back. The head is ``{"q": queue, "p": partition, "c": created (Unix ms),
"m": [message ids], "t": [transaction ids], "s": [producer subs] | null,
"r": [trace ids] | null, "l": [payload lengths in bytes]}``. A JSON head never holds a raw
newline, so the first newline ends it; payloads are sliced out by length, never re-parsed.

Records are self-delimiting and checksummed. A reader that meets a record it cannot trust (a
short header, a length past the end of the file, a wrong CRC, a body that is not a record)
scans forward to the next magic that starts a valid record, so a torn tail after a crash costs
only the torn record, and damage in the middle costs only the damaged records. Every skipped
range is reported.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from queen.model import PartitionKey

MAGIC = b"QSR1"
HEADER = struct.Struct("<4sII")
MAX_BODY_BYTES = 1 << 30


@dataclass(slots=True)
class SpoolRecord:
    """The frames of one partition write, as the spool keeps them."""

    key: PartitionKey
    created_ms: int
    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    producer_subs: list[str | None] | None = None
    trace_ids: list[str | None] | None = None
    stamp: int = 0  # order across processes: Unix ns, given when written

    def __len__(self) -> int:
        return len(self.message_ids)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A range of a file that held no trustworthy record."""

    offset: int
    length: int
    reason: str


def encode(record: SpoolRecord) -> bytes:
    head = orjson.dumps(
        {
            "q": record.key.queue,
            "p": record.key.partition,
            "c": record.created_ms,
            "o": record.stamp,
            "m": record.message_ids,
            "t": record.transaction_ids,
            "s": record.producer_subs,
            "r": record.trace_ids,
            "l": [len(p) for p in record.payloads],
        }
    )
    body = b"".join((head, b"\n", *record.payloads))
    return HEADER.pack(MAGIC, len(body), zlib.crc32(body)) + body


def _decode_body(body: bytes) -> SpoolRecord:
    cut = body.index(b"\n")
    obj: Any = orjson.loads(body[:cut])
    message_ids = obj["m"]
    n = len(message_ids)
    transaction_ids = obj["t"]
    lengths = obj["l"]
    subs = obj.get("s")
    traces = obj.get("r")
    created_ms = int(obj["c"])
    stamp = obj.get("o")
    if len(transaction_ids) != n or len(lengths) != n:
        raise ValueError("columns of different lengths")
    payloads: list[bytes] = []
    pos = cut + 1
    for length in lengths:
        payloads.append(body[pos : pos + length])
        pos += length
    if pos != len(body):
        raise ValueError("payload lengths do not add up")
    if (subs is not None and len(subs) != n) or (traces is not None and len(traces) != n):
        raise ValueError("columns of different lengths")
    return SpoolRecord(
        key=PartitionKey(str(obj["q"]), str(obj["p"])),
        created_ms=created_ms,
        message_ids=[str(m) for m in message_ids],
        transaction_ids=[str(t) for t in transaction_ids],
        payloads=payloads,
        producer_subs=subs,
        trace_ids=traces,
        stamp=created_ms * 1_000_000 if stamp is None else int(stamp),
    )


def _try_record(data: bytes, pos: int) -> tuple[SpoolRecord, int] | str:
    """Decode the record at ``pos``: (record, end) or the reason it is not trustworthy."""
    if len(data) - pos < HEADER.size:
        return "truncated header"
    magic, length, crc = HEADER.unpack_from(data, pos)
    if magic != MAGIC:
        return "bad magic"
    start = pos + HEADER.size
    end = start + length
    if length > MAX_BODY_BYTES or end > len(data):
        return "truncated body"
    body = data[start:end]
    if zlib.crc32(body) != crc:
        return "checksum mismatch"
    try:
        return _decode_body(body), end
    except (ValueError, KeyError, TypeError):
        return "undecodable body"


def read_records(data: bytes, start: int = 0) -> Iterator[tuple[int, int, SpoolRecord] | Skipped]:
    """Yield ``(offset, end, record)`` for every trustworthy record of ``data`` from ``start``,
    and a :class:`Skipped` for every range that held none."""
    pos = start
    while pos < len(data):
        outcome = _try_record(data, pos)
        if not isinstance(outcome, str):
            record, end = outcome
            yield pos, end, record
            pos = end
            continue
        resume = data.find(MAGIC, pos + 1)
        while resume != -1 and isinstance(_try_record(data, resume), str):
            resume = data.find(MAGIC, resume + 1)
        stop = len(data) if resume == -1 else resume
        yield Skipped(pos, stop - pos, outcome)
        pos = stop

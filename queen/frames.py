"""Frames as parallel columns, shared by push requests, spool records and segment writes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class FrameColumns(Protocol):
    """Parallel per-frame columns: a push request, a spool record, a segment."""

    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    producer_subs: list[str | None] | None
    trace_ids: list[str | None] | None

    def __len__(self) -> int: ...


@dataclass(slots=True)
class Frames:
    """The columns of several :class:`FrameColumns` put end to end."""

    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    producer_subs: list[str | None] | None
    trace_ids: list[str | None] | None


def concat(parts: Sequence[FrameColumns]) -> Frames:
    """Concatenate frames in order; an optional column stays None unless some part has it."""
    if len(parts) == 1:
        only = parts[0]
        return Frames(
            only.message_ids,
            only.transaction_ids,
            only.payloads,
            only.producer_subs,
            only.trace_ids,
        )
    message_ids: list[str] = []
    transaction_ids: list[str] = []
    payloads: list[bytes] = []
    for part in parts:
        message_ids += part.message_ids
        transaction_ids += part.transaction_ids
        payloads += part.payloads
    if not [p for p in parts if p.producer_subs is not None or p.trace_ids is not None]:
        return Frames(message_ids, transaction_ids, payloads, None, None)  # the common case
    return Frames(
        message_ids,
        transaction_ids,
        payloads,
        _optional([p.producer_subs for p in parts], parts),
        _optional([p.trace_ids for p in parts], parts),
    )


def _optional(
    columns: list[list[str | None] | None], parts: Sequence[FrameColumns]
) -> list[str | None] | None:
    if columns.count(None) == len(columns):
        return None
    out: list[str | None] = []
    for part, column in zip(parts, columns, strict=True):
        out += column if column is not None else [None] * len(part)
    return out

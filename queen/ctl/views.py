"""Rows and tables more than one command shows: a queue as queenctl's ``status`` row and the
table of them, the partitions of a queue, a page of messages."""

from __future__ import annotations

from typing import Any

from queen.ctl.options import Ctl
from queen.ctl.output import seconds


def without_leased(counts: Any) -> dict[str, Any]:
    """The message counts of one queue's answer (``totals``) or of one of its partitions, whose
    ``pending`` counts the messages inside a live lease too (as the original's do), with
    ``pending`` as the list of queues counts it: without them. So every table shows one
    figure for one fact. The scalar counts only (the answer repeats them under
    ``messages``)."""
    if not isinstance(counts, dict):
        return {}
    out = {k: v for k, v in counts.items() if not isinstance(v, dict)}
    pending, processing = out.get("pending"), out.get("processing")
    if isinstance(pending, int) and isinstance(processing, int):
        out["pending"] = max(0, pending - processing)
    return out


def queue_row(q: dict[str, Any]) -> dict[str, Any]:
    """One queue as queenctl's ``status`` prints it, from a queue of ``GET
    /api/v1/resources/queues`` (or the answer of ``.../queues/{queue}``, whose pending is
    counted as the list's: :func:`without_leased`)."""
    listed = q.get("messages")
    counts: dict[str, Any] = listed if isinstance(listed, dict) else without_leased(q.get("totals"))
    partitions = q.get("partitionCount", q.get("partitions"))
    if q.get("oldestPendingAt"):
        lag_s = q.get("oldestPendingAgeSeconds")
    else:  # one queue's answer: the oldest pending message of the partitions it lists
        listed = q.get("partitions")
        ages = [
            p.get("oldestPendingAgeSeconds") or 0
            for p in (listed if isinstance(listed, list) else [])
            if isinstance(p, dict) and p.get("oldestPendingAt")
        ]
        lag_s = max(ages, default=0)
    return {
        "queue": q.get("name") or q.get("queue"),
        "namespace": q.get("namespace") or None,
        "task": q.get("task") or None,
        "pending": counts.get("pending"),
        "processing": counts.get("processing"),
        "completed": counts.get("completed"),
        "failed": counts.get("failed"),
        "dlq": counts.get("deadLetter"),
        "partitions": partitions if isinstance(partitions, int) else len(partitions or []),
        "lagSeconds": lag_s,
    }


QUEUE_COLUMNS = (
    "queue",
    "namespace",
    "task",
    "pending",
    "processing",
    "completed",
    "failed",
    "dlq",
    "partitions",
)
"""The columns of a queue table, each headed by its key in :func:`queue_row`; ``lag``
(``lagSeconds``, as a duration) may follow."""


def queue_table(ctl: Ctl, rows: list[dict[str, Any]], *, lag: bool) -> None:
    """Queue rows (:func:`queue_row`) as a table; ``lag``: with the lag column, the age of
    each queue's oldest pending message."""
    ctl.out.table(
        [*QUEUE_COLUMNS, *(["lag"] if lag else [])],
        (
            [
                *(r[k] for k in QUEUE_COLUMNS),
                *([seconds(r["lagSeconds"]) if r["lagSeconds"] else "-"] if lag else []),
            ]
            for r in rows
        ),
        empty="no queues",
    )


def partition_table(ctl: Ctl, partitions: list[dict[str, Any]]) -> None:
    ctl.out.table(
        [
            "partition",
            "id",
            "total",
            "pending",
            "processing",
            "completed",
            "dead letter",
            "offsets low/next",
            "oldest pending",
            "lease until",
        ],
        (
            [
                p.get("name"),
                p.get("id"),
                *(
                    without_leased(p.get("messages")).get(k)
                    for k in ("total", "pending", "processing", "completed", "deadLetter")
                ),
                f"{(p.get('offsets') or {}).get('low')}/{(p.get('offsets') or {}).get('next')}",
                seconds(p.get("oldestPendingAgeSeconds")) if p.get("oldestPendingAt") else "-",
                p.get("leaseExpiresAt"),
            ]
            for p in partitions
        ),
        empty="no partitions",
    )


def message_table(ctl: Ctl, found: list[dict[str, Any]]) -> None:
    ctl.out.table(
        [
            "created",
            "queue",
            "partition",
            "partition id",
            "transaction id",
            "status",
            "offset",
            "lease until",
        ],
        (
            [
                m.get("createdAt"),
                m.get("queue"),
                m.get("partition"),
                m.get("partitionId"),
                m.get("transactionId"),
                m.get("status"),
                m.get("offset"),
                m.get("leaseExpiresAt"),
            ]
            for m in found
        ),
        empty="no messages",
    )

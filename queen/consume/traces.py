"""Validation of processing traces (``POST /api/v1/traces``) and of their read queries.

Pure functions, no I/O, shared by the HTTP routes and the embedding API. A trace names its
message the way an ack does, by ``partitionId`` and ``transactionId``; ``data`` is any JSON
value and is stored as JSON text, like a payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from queen.consume.errors import InvalidRequest
from queen.consume.requests import count, group_of, partition_id
from queen.intake import MAX_TRANSACTION_ID_CHARS, encode_payload
from queen.names import CONTROL, name_problem
from queen.records import DEFAULT_EVENT_TYPE, TraceRecord

MAX_TRACE_NAMES = 100
MAX_PAGE = 10_000


def trace_record(body: Any) -> TraceRecord:
    """``{"transactionId", "partitionId", "data", "consumerGroup"?, "eventType"?,
    "traceNames"?}``: ``transactionId``, ``partitionId`` and ``data`` are required (``data``
    may be null); ``consumerGroup`` defaults to queue mode, ``eventType`` to ``info``;
    ``traceNames`` is null, one name or an array of names."""
    if type(body) is not dict:
        raise InvalidRequest("body must be a JSON object")
    transaction_id = body.get("transactionId")
    if transaction_id is None or transaction_id == "":
        raise InvalidRequest("transactionId and partitionId are required")
    if type(transaction_id) is not str:
        raise InvalidRequest("transactionId must be a string")
    if len(transaction_id) > MAX_TRANSACTION_ID_CHARS:
        raise InvalidRequest(f"transactionId is longer than {MAX_TRANSACTION_ID_CHARS} characters")
    if CONTROL.search(transaction_id):
        raise InvalidRequest("transactionId must not contain control characters")
    if body.get("partitionId") in (None, ""):
        raise InvalidRequest("transactionId and partitionId are required")
    pid = partition_id(body.get("partitionId"))
    if "data" not in body:
        raise InvalidRequest("data is required")
    try:
        data = encode_payload(body["data"]).decode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"data cannot be stored: {exc}") from None
    event = body.get("eventType")
    if event is None or event == "":
        event = DEFAULT_EVENT_TYPE
    else:
        _check_name(event, "eventType")
    return TraceRecord(
        transaction_id=transaction_id,
        partition_id=pid,
        data=data,
        consumer_group=group_of(body.get("consumerGroup")),
        event_type=event,
        names=trace_names(body.get("traceNames")),
    )


def trace_names(value: Any) -> tuple[str, ...]:
    """``traceNames``: null (none), a name, or an array of names (duplicates kept once)."""
    if value is None:
        return ()
    names = [value] if type(value) is str else value
    if type(names) is not list:
        raise InvalidRequest("traceNames must be null, a string or an array of strings")
    if len(names) > MAX_TRACE_NAMES:
        raise InvalidRequest(f"traceNames holds more than {MAX_TRACE_NAMES} names")
    for name in names:
        _check_name(name, "traceNames")
    return tuple(dict.fromkeys(names))


def trace_name(value: Any) -> str:
    """The name of ``GET /api/v1/traces/by-name/{name}``."""
    _check_name(value, "trace name")
    return value  # type: ignore[no-any-return]


def page(args: Mapping[str, Any], default_limit: int) -> tuple[int, int]:
    """``limit`` (1 to 10,000) and ``offset`` of a trace listing."""
    limit = count(args.get("limit"), "limit", 1, MAX_PAGE)
    offset = count(args.get("offset"), "offset", 0, (1 << 31) - 1)
    return (default_limit if limit is None else limit), (offset or 0)


def _check_name(value: Any, what: str) -> None:
    problem = name_problem(value)
    if problem is not None:
        raise InvalidRequest(f"{what} {problem}")

"""Validation of the streams routes' bodies: query registration, cycles and state reads.

Pure functions, no I/O; a body that breaks a rule raises :class:`InvalidRequest` (HTTP 400)
before anything is read or written. Bodies use the official Streams SDK's snake_case names.
"""

from __future__ import annotations

import json
import math
import uuid
from decimal import Decimal
from typing import Any

import orjson

from queen.consume.errors import InvalidRequest
from queen.consume.requests import NEVER_LEASE, group_of, name
from queen.intake import PreparedPush, prepare_push
from queen.model import InvalidPush
from queen.names import UNSTORABLE
from queen.records import CycleAck, CycleRequest, RegisterRequest, StateQuery

_MAX_BIGINT = (1 << 63) - 1
MAX_TEXT = 1024
"""Longest query name, config hash or state key accepted."""


def _object(body: Any) -> dict[str, Any]:
    if type(body) is not dict:
        raise InvalidRequest("request body must be a JSON object")
    return body


def _text(value: Any, what: str, *, required: bool = True) -> str | None:
    if value is None or value == "":
        if required:
            raise InvalidRequest(f"{what} is required")
        return None
    if type(value) is not str:
        raise InvalidRequest(f"{what} must be a string")
    if len(value) > MAX_TEXT:
        raise InvalidRequest(f"{what} is longer than {MAX_TEXT} characters")
    if UNSTORABLE.search(value):
        raise InvalidRequest(f"{what} cannot contain NUL or unpaired surrogates")
    return value


def _flag(value: Any, what: str, default: bool) -> bool:
    if value is None:
        return default
    if type(value) is not bool:
        raise InvalidRequest(f"{what} must be true or false")
    return value


def _query_id(value: Any) -> str:
    text = _text(value, "query_id")
    assert text is not None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise InvalidRequest("query_id must be a UUID, as registration answers") from None


def _partition_id(value: Any) -> int:
    """The source partition's id as pops deliver it (``partitionId``, a decimal string)."""
    if value is None or value == "":
        raise InvalidRequest("partition_id is required")
    if type(value) is int:
        number = value
    elif type(value) is str and value.isascii() and value.isdigit() and len(value) <= 19:
        number = int(value)
    else:
        raise InvalidRequest("partition_id must be a partition id as pops deliver it")
    if not 0 < number <= _MAX_BIGINT:
        raise InvalidRequest("partition_id must be a partition id as pops deliver it")
    return number


def register_request(body: Any) -> RegisterRequest:
    """``POST /streams/v1/queries``."""
    raw = _object(body)
    query_name = _text(raw.get("name"), "name")
    source = name(raw.get("source_queue"), "source_queue")
    sink = name(raw.get("sink_queue"), "sink_queue", required=False)
    config_hash = _text(raw.get("config_hash"), "config_hash")
    assert query_name is not None and source is not None and config_hash is not None
    return RegisterRequest(
        name=query_name,
        source_queue=source,
        sink_queue=sink,
        config_hash=config_hash,
        reset=_flag(raw.get("reset"), "reset", False),
    )


def _json_text(value: Any, where: str) -> str:
    """``value`` as JSON text PostgreSQL's ``jsonb`` accepts."""
    if _unstorable(value):
        raise InvalidRequest(f"{where}value cannot contain NUL or unpaired surrogates")
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # an integer beyond 64 bits: the standard library keeps it exact
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _unstorable(value: Any) -> bool:
    if type(value) is str:
        return UNSTORABLE.search(value) is not None
    if type(value) is list:
        return any(_unstorable(v) for v in value)
    if type(value) is dict:
        return any(UNSTORABLE.search(k) or _unstorable(v) for k, v in value.items())
    return False


def _state_ops(raw: Any) -> tuple[list[str], list[str | None], int]:
    if raw is None:
        return [], [], 0
    if type(raw) is not list:
        raise InvalidRequest("state_ops must be an array")
    final: dict[str, str | None] = {}
    for i, op in enumerate(raw):
        where = f"state_ops[{i}]."
        if type(op) is not dict:
            raise InvalidRequest(f"state_ops[{i}] must be an object")
        key = _text(op.get("key"), f"{where}key")
        assert key is not None
        kind = op.get("type")
        if kind == "upsert":
            final[key] = _json_text(op.get("value", {}), where)
        elif kind == "delete":
            final[key] = None
        else:
            raise InvalidRequest(f"{where}type must be 'upsert' or 'delete'")
    keys = sorted(final)
    return keys, [final[k] for k in keys], len(raw)


def _lease(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if type(value) is not str:
        raise InvalidRequest("ack.leaseId must be a string")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return NEVER_LEASE  # can never be the live lease: the cycle is refused as stale


def _ack(raw: Any) -> CycleAck | None:
    if raw is None:
        return None
    if type(raw) is not dict:
        raise InvalidRequest("ack must be an object or null")
    transaction_id = raw.get("transactionId")
    if type(transaction_id) is not str or not transaction_id:
        raise InvalidRequest("ack.transactionId is required")
    if UNSTORABLE.search(transaction_id):
        raise InvalidRequest("ack.transactionId cannot contain NUL or unpaired surrogates")
    status = raw.get("status", "completed")
    if status is None:
        status = "completed"
    if type(status) is not str or status.lower() not in ("completed", "success", "failed", "dlq"):
        raise InvalidRequest("ack.status must be one of completed, success, failed, dlq")
    dlq = status.lower() in ("failed", "dlq")
    error = raw.get("error")
    if error is not None and type(error) is not str:
        raise InvalidRequest("ack.error must be a string or null")
    if error is not None and UNSTORABLE.search(error):
        raise InvalidRequest("ack.error cannot contain NUL or unpaired surrogates")
    count = raw.get("count")
    if count is not None and (type(count) is not int or count < 0):
        raise InvalidRequest("ack.count must be a non-negative integer")
    return CycleAck(
        transaction_id=transaction_id,
        lease_id=_lease(raw.get("leaseId")),
        dlq=dlq,
        error=(error or "Streaming cycle reported failure") if dlq else None,
    )


def cycle_request(body: Any) -> CycleRequest:
    """``POST /streams/v1/cycle``. Sink push items follow the push route's rules (their
    ``traceId`` is kept, as in a transaction; ``producerSub`` is never read)."""
    raw = _object(body)
    query_id = _query_id(raw.get("query_id"))
    partition_id = _partition_id(raw.get("partition_id"))
    keys, values, count = _state_ops(raw.get("state_ops"))
    items = raw.get("push_items")
    push: PreparedPush | None = None
    if items is not None:
        if type(items) is not list:
            raise InvalidRequest("push_items must be an array")
        if items:
            try:
                push = prepare_push(items, keep_trace_ids=True)
            except InvalidPush as exc:
                raise InvalidRequest(f"push_items: {exc}") from None
    return CycleRequest(
        query_id=query_id,
        partition_id=partition_id,
        consumer_group=group_of(raw.get("consumer_group")),
        state_keys=keys,
        state_values=values,
        state_ops=count,
        ack=_ack(raw.get("ack")),
        release_lease=_flag(raw.get("release_lease"), "release_lease", True),
        push=push,
    )


def state_query(body: Any) -> StateQuery:
    """``POST /streams/v1/state/get``: no ``keys`` (or an empty list) means every key."""
    raw = _object(body)
    keys_raw = raw.get("keys")
    if keys_raw is None:
        keys_raw = []
    if type(keys_raw) is not list:
        raise InvalidRequest("keys must be an array of strings")
    keys: list[str] = []
    for i, key in enumerate(keys_raw):
        text = _text(key, f"keys[{i}]")
        assert text is not None
        keys.append(text)
    ripe = raw.get("ripe_at_or_before")
    if ripe is not None and (type(ripe) not in (int, float) or math.isnan(ripe)):
        raise InvalidRequest("ripe_at_or_before must be a number (epoch milliseconds)")
    return StateQuery(
        query_id=_query_id(raw.get("query_id")),
        partition_id=_partition_id(raw.get("partition_id")),
        keys=list(dict.fromkeys(keys)),
        key_prefix=_text(raw.get("key_prefix"), "key_prefix", required=False),
        ripe_at_or_before=None if ripe is None else Decimal(repr(ripe)),
    )

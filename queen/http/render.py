"""The JSON bodies of the broker's typed answers (push, the consume side, streams, /health):
typed results in, wire dicts out.

The only place that knows the camelCase shapes of these answers (the official clients read
them); the admin API's are :mod:`queen.http.render_admin`'s. Timestamps are ISO-8601 UTC with
milliseconds; ids of partitions and queues are strings.
"""

from __future__ import annotations

from typing import Any

import orjson

from queen.consume.policy import iso_of_uuid7, iso_utc
from queen.consume.results import (
    ROLLED_BACK,
    AckResult,
    DlqMessage,
    DlqPage,
    GroupDeleted,
    GroupDeletedOnQueue,
    LeaseExtension,
    PopMaintenance,
    PopResult,
    QueueConfigured,
    QueueDeleted,
    SeekResult,
    SubscriptionMoved,
    TraceNamePage,
    TracePage,
    TraceRecorded,
    TransactionResult,
    TxAckResult,
    TxPushResult,
)
from queen.encryption import EncryptionStatus
from queen.intake import decode_json
from queen.operations import Health
from queen.push import PushAnswer
from queen.records import OPTION_FIELDS, Delivered, QueueOptions, StateEntry, StoredTrace
from queen.spool import SpoolState
from queen.streams.results import CycleResult, QueryRegistered
from queen.streams.service import QueryConflict
from queen.supervision import LoopStatus


def push_answer(answer: PushAnswer) -> list[dict[str, Any]]:
    """``POST /api/v1/push``: one result per item, in body order (the original's keys, in
    snake and camel case)."""
    results: list[dict[str, Any] | None] = [None] * answer.count
    for batch, outcome in answer.parts:
        queue, partition = batch.key.queue, batch.key.partition
        status = outcome.status.value
        duplicates = outcome.duplicates
        for pos, (index, own_id, transaction_id) in enumerate(
            zip(batch.indexes, batch.message_ids, batch.transaction_ids, strict=True)
        ):
            message_id, item_status = own_id, status
            if duplicates and pos in duplicates:
                message_id, item_status = duplicates[pos], "duplicate"
            results[index] = {
                "index": index,
                "message_id": message_id,
                "messageId": message_id,
                "transaction_id": transaction_id,
                "transactionId": transaction_id,
                "queueName": queue,
                "partition": partition,
                "status": item_status,
            }
    return results  # type: ignore[return-value]


def pop(result: PopResult) -> dict[str, Any]:
    """A non-empty pop (an empty one is 204 without a body). Payloads pass through as stored
    JSON, not decoded and encoded again."""
    first = result.delivered[0] if result.delivered else None
    body: dict[str, Any] = {
        "success": True,
        "queue": first.queue if first else None,
        "partition": first.partition if first else None,
        "partitionId": str(first.partition_id) if first else None,
        "leaseId": result.lease_id,
        "leaseExpiresAt": iso_utc(result.lease_expires_at) if result.lease_expires_at else None,
        "consumerGroup": result.consumer_group,
        "partitionsClaimed": result.partitions_claimed,
        "messages": [_message(result, d) for d in result.delivered],
    }
    if result.sizing is not None:
        body["autopilot"] = {
            "partitions": result.sizing.partitions,
            "batch": result.sizing.batch,
            "waitMs": 0,
        }
    return body


def _message(result: PopResult, d: Delivered) -> dict[str, Any]:
    """One delivered message; its payload passes through as stored JSON."""
    return {
        "id": d.message_id,
        "transactionId": d.transaction_id,
        "partitionId": str(d.partition_id),
        "leaseId": result.lease_id,
        "data": orjson.Fragment(d.payload),
        "createdAt": iso_of_uuid7(d.message_id),
        "producerSub": d.producer_sub,
        "traceId": d.trace_id,
        "partition": d.partition,
        "queue": d.queue,
        "consumerGroup": result.consumer_group,
        "retryCount": d.retry_count,
        "offset": d.offset,
    }


def queue_options(options: QueueOptions) -> dict[str, Any]:
    """The ``options`` object of the configure answer, under the keys configure reads."""
    return {key: getattr(options, name) for key, name, _ in OPTION_FIELDS}


def configured(c: QueueConfigured) -> dict[str, Any]:
    body: dict[str, Any] = {
        "configured": True,
        "queueId": str(c.queue_id),
        "partitionId": str(c.partition_id),
        "queue": c.queue,
        "namespace": c.namespace,
        "task": c.task,
        "options": queue_options(c.options),
    }
    if c.warning is not None:
        body["warning"] = c.warning
    return body


def queue_deleted(d: QueueDeleted) -> dict[str, Any]:
    return {"deleted": True, "queue": d.queue, "existed": d.existed}


def ack(a: AckResult) -> dict[str, Any]:
    return {
        "index": a.index,
        "transactionId": a.transaction_id,
        "success": a.success,
        "error": a.error,
        "queueName": a.queue,
        "partitionName": a.partition,
        "leaseReleased": a.lease_released,
        "dlq": a.dlq,
    }


def acks(results: list[AckResult]) -> list[dict[str, Any]]:
    return [ack(a) for a in results]


def lease_extension(e: LeaseExtension) -> dict[str, Any]:
    expiry = iso_utc(e.expires_at) if e.expires_at is not None else None
    return {
        "index": 0,
        "leaseId": e.lease_id,
        "success": e.success,
        "error": e.error,
        "renewed": e.renewed,
        "expiresAt": expiry,
        "newExpiresAt": expiry,
        "lease_expires_at": expiry,
    }


def transaction(t: TransactionResult) -> dict[str, Any]:
    body: dict[str, Any] = {"transactionId": t.transaction_id, "success": t.success}
    if not t.success:
        body["error"] = t.error
    body["results"] = [_operation(r, rolled_back=not t.success) for r in t.results]
    return body


def _operation(r: TxAckResult | TxPushResult, *, rolled_back: bool) -> dict[str, Any]:
    entry: dict[str, Any]
    if isinstance(r, TxPushResult):
        entry = {
            "index": r.index,
            "type": "push",
            "success": True,
            "status": "duplicate" if r.duplicate else "queued",
            "transactionId": r.transaction_id,
            "messageId": r.message_id,
            "message_id": r.message_id,
            "partitionId": str(r.partition_id) if r.partition_id else None,
            "queueName": r.queue,
            "partition": r.partition,
            "error": None,
        }
    elif r.verdict is None:  # not judged: the transaction failed before the acks
        entry = {
            "index": r.index,
            "type": "ack",
            "transactionId": r.transaction_id,
            "success": True,
            "dlq": False,
        }
    else:
        entry = {"index": r.index, "type": "ack"} | ack(r.verdict)
    if rolled_back and entry["success"]:
        entry["success"] = False
        entry["error"] = ROLLED_BACK
    return entry


def dlq_page(page: DlqPage) -> dict[str, Any]:
    return {
        "messages": [_dead_letter(m) for m in page.messages],
        "total": page.total,
        "pagination": {"limit": page.limit, "offset": page.offset},
    }


def _dead_letter(m: DlqMessage) -> dict[str, Any]:
    e = m.entry
    body: dict[str, Any] = {
        "id": e.message_id,
        "transactionId": e.transaction_id,
        "partitionId": str(e.partition_id),
        "queue": e.queue,
        "partition": e.partition,
        "consumerGroup": e.consumer_group,
        "errorMessage": e.error_message,
        "retryCount": e.retry_count,
        "data": m.data,
        "producerSub": e.producer_sub,
        "traceId": e.trace_id,
        "createdAt": iso_of_uuid7(e.message_id),
        "failedAt": iso_utc(e.failed_at),
        "offset": e.offset,
    }
    if m.decryption_error is not None:
        body["decryptionError"] = m.decryption_error
    return body


def group_deleted(g: GroupDeleted) -> dict[str, Any]:
    return {
        "success": True,
        "consumerGroup": g.consumer_group,
        "deletedPartitions": g.deleted_partitions,
        "metadataDeleted": g.metadata_deleted,
    }


def group_deleted_on_queue(g: GroupDeletedOnQueue) -> dict[str, Any]:
    return {
        "success": True,
        "consumerGroup": g.consumer_group,
        "queueName": g.queue,
        "deletedPartitions": g.deleted_partitions,
        "metadataDeleted": g.metadata_deleted,
    }


def seek(s: SeekResult) -> dict[str, Any]:
    body: dict[str, Any] = {
        "success": True,
        "consumerGroup": s.consumer_group,
        "queueName": s.queue,
        "seekToEnd": s.to_end,
        "targetTimestamp": iso_utc(s.at) if s.at is not None else None,
    }
    if s.partition is None:
        body["partitionsUpdated"] = s.updated
    else:
        body["partitionName"] = s.partition
        body["updated"] = s.updated > 0
        body["cursorMovedTo"] = iso_utc(s.moved_to) if s.moved_to else None
    return body


def subscription_moved(m: SubscriptionMoved) -> dict[str, Any]:
    return {
        "success": True,
        "consumerGroup": m.consumer_group,
        "newTimestamp": iso_utc(m.at),
        "rowsUpdated": m.rows,
    }


def pop_maintenance(m: PopMaintenance) -> dict[str, Any]:
    message = (
        "Pop maintenance mode ENABLED. All POP operations will return empty arrays."
        if m.enabled
        else "Pop maintenance mode DISABLED. Normal operation resumed."
    )
    return {"popMaintenanceMode": m.enabled, "message": message}


def trace_recorded(t: TraceRecorded) -> dict[str, Any]:
    return {"success": True, "traceId": str(t.trace_id)}


def trace_page(page: TracePage) -> dict[str, Any]:
    body: dict[str, Any] = {"traces": [_trace(t) for t in page.traces]}
    if page.total is not None:
        body["total"] = page.total
        body["pagination"] = {"limit": page.limit, "offset": page.offset}
    return body


def _trace(t: StoredTrace) -> dict[str, Any]:
    body: dict[str, Any] = {"id": str(t.id)}
    if t.transaction_id is not None:
        body["transaction_id"] = t.transaction_id
        body["partition_id"] = str(t.partition_id)
        body["queue_name"] = t.queue
        body["partition_name"] = t.partition
    body.update(
        event_type=t.event_type,
        data=decode_json(t.data.encode()),
        consumer_group=t.consumer_group,
        worker_id=t.worker_id,
        created_at=iso_utc(t.created_at),
        trace_names=t.names,
    )
    return body


def trace_names(page: TraceNamePage) -> dict[str, Any]:
    return {
        "trace_names": [
            {
                "trace_name": n.name,
                "trace_count": n.trace_count,
                "message_count": n.message_count,
                "last_seen": iso_utc(n.last_seen),
            }
            for n in page.names
        ],
        "total": page.total,
        "pagination": {"limit": page.limit, "offset": page.offset},
    }


# --- streaming queries -------------------------------------------------------------------------


def query_registered(r: QueryRegistered) -> dict[str, Any]:
    return {
        "success": True,
        "query_id": r.query_id,
        "name": r.name,
        "config_hash": r.config_hash,
        "fresh": r.fresh,
        "reset": r.reset,
    }


def query_conflict(c: QueryConflict) -> dict[str, Any]:
    return {"success": False, "query_id": c.query_id, "name": c.name, "error": str(c)}


def cycle(c: CycleResult) -> dict[str, Any]:
    """A cycle's answer, in the Streams SDK's snake_case (``queueName`` as the original)."""
    body: dict[str, Any] = {
        "success": c.success,
        "query_id": c.query_id,
        "partition_id": str(c.partition_id),
        "queueName": c.queue,
        "state_ops_applied": c.state_ops_applied,
        "push_results": [
            {
                "index": p.index,
                "transaction_id": p.transaction_id,
                "status": "duplicate" if p.duplicate else "queued",
                "message_id": p.message_id,
                "partition_id": str(p.partition_id) if p.partition_id else None,
                "queueName": p.queue,
                "partition": p.partition,
            }
            for p in c.pushed
        ],
        "ack_result": None,
    }
    if c.acked is not None:
        body["ack_result"] = {
            "success": True,
            "count": c.acked.count,
            "lease_released": c.acked.lease_released,
            "dlq": c.acked.dlq,
        }
    if c.error is not None:
        body["error"] = c.error
    return body


def state_rows(rows: list[StateEntry]) -> dict[str, Any]:
    return {
        "success": True,
        "rows": [
            {
                "key": row.key,
                "value": orjson.Fragment(row.value),
                "updated_at": row.updated_at.isoformat(),
            }
            for row in rows
        ],
    }


def spool_state(s: SpoolState) -> dict[str, Any]:
    """The spool, as ``/health``, the maintenance routes and the overview show it."""
    return {
        "directory": str(s.directory),
        "pendingItems": s.pending_items,
        "files": s.files,
        "pendingBytes": s.pending_bytes,
        "oldestAgeSeconds": s.oldest_age_s,
        "replayRate": s.replay_rate,
        "healthy": s.healthy,
        "problem": s.problem,
        "quarantined": {"ranges": s.quarantined_ranges, "bytes": s.quarantined_bytes},
    }


def loop_status(s: LoopStatus) -> dict[str, Any]:
    """One background loop in ``/health``."""
    body: dict[str, Any] = {"state": s.state, "errors": s.errors}
    if s.failing_since is not None:
        body["failingSince"] = s.failing_since.isoformat()
    if s.last_error is not None:
        body["lastError"] = s.last_error
    return body


def encryption_status(s: EncryptionStatus) -> dict[str, Any]:
    """The ``encryption`` object of ``/health``."""
    body: dict[str, Any] = {
        "keySet": s.key_set,
        "keyId": s.key_id,
        "encryptedQueues": s.encrypted_queues,
    }
    if s.plaintext_queues is not None:
        body["warning"] = (
            "queues ask for encryption but QUEEN_ENCRYPTION_KEY is not set: their "
            "payloads are stored in plaintext"
        )
        body["plaintextQueues"] = list(s.plaintext_queues)
    return body


def maintenance(
    enabled: bool, spool: SpoolState | None, *, pop_enabled: bool, database_up: bool
) -> dict[str, Any]:
    """``/api/v1/system/maintenance``: both switches and the spool behind the push switch, in
    the original's shape (``bufferStats``: its keys, then the spool as ``/health`` shows it;
    the original's failed files are our quarantined ranges)."""
    ranges = spool.quarantined_ranges if spool else 0
    size = spool.quarantined_bytes if spool else 0
    stats: dict[str, Any] = {
        "pendingCount": spool.pending_items if spool else 0,
        "failedCount": ranges,
        "dbHealthy": database_up,
        "failedFiles": {
            "count": ranges,
            "totalBytes": size,
            "totalMB": round(size / (1024 * 1024), 3),
            "failoverCount": 0,
            "qos0Count": 0,
        },
    }
    return {
        "maintenanceMode": enabled,
        "popMaintenanceMode": pop_enabled,
        "bufferedMessages": spool.pending_items if spool else 0,
        "bufferHealthy": spool.healthy if spool else False,
        "bufferStats": stats | (spool_state(spool) if spool else {}),
    }


def maintenance_switched(enabled: bool) -> dict[str, Any]:
    return {
        "message": (
            "Maintenance mode ENABLED. All pushes go to the spool."
            if enabled
            else "Maintenance mode DISABLED. The spool is being replayed into the database."
        )
    }


def health(h: Health) -> dict[str, Any]:
    body: dict[str, Any] = {
        "status": h.status,
        "database": "connected" if h.healthy else "disconnected",
        "server": "queen-trio",
        "version": h.version,
        "activePartitions": h.active_partitions,
        "maintenanceMode": h.maintenance_mode,
        "encryption": encryption_status(h.encryption),
        "loops": {name: loop_status(s) for name, s in h.loops.items()},
    }
    if h.spool is not None:
        body["spool"] = spool_state(h.spool)
    return body

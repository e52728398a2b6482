"""The HTTP bodies of typed results (the consume side, /health): keys, their order and the
rolled-back rule, as the official clients read them (no database; the HTTP tests check the
values end to end)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import orjson

from queen.broker import Health
from queen.consume.results import (
    ROLLED_BACK,
    AckResult,
    LeaseExtension,
    SeekResult,
    TransactionResult,
    TxAckResult,
    TxPushResult,
)
from queen.encryption import EncryptionStatus
from queen.http import render
from queen.spool import SpoolState
from queen.supervision import LoopStatus

ACK = AckResult(1, "t-1", True, None, "q", "p", True, False)
PUSH = TxPushResult(2, "t-2", "m-2", False, 7, "out", "Default")

FAILING_SINCE = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_failed_transaction_reports_every_would_be_success_as_rolled_back() -> None:
    result = TransactionResult(
        "tx",
        False,
        "ACK operation failed: Invalid or expired lease",
        [TxAckResult(0, "t-0", None), TxAckResult(1, "t-1", ACK), PUSH],
    )
    body = render.transaction(result)
    assert list(body) == ["transactionId", "success", "error", "results"]
    unjudged, judged, pushed = body["results"]
    assert unjudged == {
        "index": 0,
        "type": "ack",
        "transactionId": "t-0",
        "success": False,
        "dlq": False,
        "error": ROLLED_BACK,
    }
    assert list(unjudged) == ["index", "type", "transactionId", "success", "dlq", "error"]
    assert list(judged) == [
        "index",
        "type",
        "transactionId",
        "success",
        "error",
        "queueName",
        "partitionName",
        "leaseReleased",
        "dlq",
    ]
    assert judged["success"] is False and judged["error"] == ROLLED_BACK
    assert pushed["success"] is False and pushed["error"] == ROLLED_BACK
    assert pushed["status"] == "queued" and pushed["partitionId"] == "7"


def test_a_committed_transaction_has_no_error_key() -> None:
    body = render.transaction(TransactionResult("tx", True, None, [TxAckResult(1, "t-1", ACK)]))
    assert list(body) == ["transactionId", "success", "results"]
    assert body["results"][0]["success"] is True and body["results"][0]["error"] is None


def test_lease_extension_names_its_expiry_three_ways() -> None:
    at = datetime(2026, 4, 26, 10, 59, 28, 267_000, tzinfo=UTC)
    body = render.lease_extension(LeaseExtension("l", "renewed", 2, at))
    assert body["success"] is True and body["error"] is None
    assert body["expiresAt"] == body["newExpiresAt"] == body["lease_expires_at"]
    assert body["expiresAt"] == "2026-04-26T10:59:28.267Z"
    missing = render.lease_extension(LeaseExtension("l", "missing", 0, None))
    assert missing["success"] is False and missing["error"] == "Lease not found"


def test_a_partition_seek_reports_its_partition_and_where_the_cursor_went() -> None:
    queue_wide = render.seek(SeekResult("g", "q", True, None, None, 3, None))
    assert queue_wide["partitionsUpdated"] == 3 and "partitionName" not in queue_wide
    one = render.seek(SeekResult("g", "q", False, None, "p", 0, None))
    assert (one["partitionName"], one["updated"], one["cursorMovedTo"]) == ("p", False, None)
    assert orjson.loads(orjson.dumps(one)) == one


def test_health_says_database_and_adds_the_spool_only_when_there_is_one() -> None:
    report = Health(
        healthy=False,
        status="unhealthy",
        version="1.0",
        active_partitions=2,
        maintenance_mode=False,
        encryption=EncryptionStatus(key_set=False, key_id=None, encrypted_queues=0),
        loops={"replay": LoopStatus("failing", 2, FAILING_SINCE, "OSError: boom")},
        spool=None,
    )
    body = render.health(report)
    assert list(body) == [
        "status",
        "database",
        "server",
        "version",
        "activePartitions",
        "maintenanceMode",
        "encryption",
        "loops",
    ]
    assert body["database"] == "disconnected" and body["status"] == "unhealthy"
    assert body["encryption"] == {"keySet": False, "keyId": None, "encryptedQueues": 0}
    assert body["loops"] == {
        "replay": {
            "state": "failing",
            "errors": 2,
            "failingSince": "2026-01-02T03:04:05+00:00",
            "lastError": "OSError: boom",
        }
    }
    spool = SpoolState(Path("/var/spool/queen"), 7, 2, 4096, 1.5, 0.0, True, 1, 300)
    with_spool = render.health(dataclasses.replace(report, spool=spool))
    assert with_spool["spool"] == {
        "directory": "/var/spool/queen",
        "pendingItems": 7,
        "files": 2,
        "pendingBytes": 4096,
        "oldestAgeSeconds": 1.5,
        "replayRate": 0.0,
        "healthy": True,
        "problem": None,
        "quarantined": {"ranges": 1, "bytes": 300},
    }
    assert orjson.loads(orjson.dumps(with_spool)) == with_spool


def test_health_names_the_queues_stored_in_plaintext_for_want_of_a_key() -> None:
    keyless = EncryptionStatus(False, None, 2, ("a", "b"))
    body = render.encryption_status(keyless)
    assert body["plaintextQueues"] == ["a", "b"] and "QUEEN_ENCRYPTION_KEY" in body["warning"]
    ok = render.loop_status(LoopStatus("ok", 3))
    assert ok == {"state": "ok", "errors": 3}

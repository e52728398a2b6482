"""Encrypted queues: payloads encrypted at rest (PostgreSQL and spool), plaintext on every read.

The cipher is tested alone; everything else goes through HTTP against a real PostgreSQL, with
brokers opened one after the other on the same database to change the key.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest

from queen import open_broker
from queen.broker import Broker
from queen.cipher import PREFIX, PayloadCipher, PayloadUnreadable, open_payload, parse_key
from queen.cli import main as cli_main
from queen.encryption import QueueEncryption
from queen.http.app import create_app
from queen.intake import PartitionBatch, encode_payload
from queen.model import PartitionKey
from queen.settings import Settings
from tests.conftest import Db
from tests.consuming import Api

KEY_A = "11" * 32
KEY_B = "2f" * 32
SECRET = {"card": "4111-1111-1111-1111", "note": "très secret"}
SECRET_TEXT = "4111-1111-1111-1111"


# --- the cipher alone --------------------------------------------------------------------------


def test_an_envelope_is_json_and_opens_to_the_payload() -> None:
    cipher = PayloadCipher(parse_key(KEY_A))
    mid = str(uuid.uuid4())
    plain = encode_payload(SECRET)
    sealed = cipher.seal(plain, mid)
    assert sealed.decode().startswith(PREFIX)
    assert SECRET_TEXT.encode() not in sealed
    assert isinstance(json.loads(sealed), str)  # valid JSON wherever a payload is read as JSON
    assert open_payload(cipher, sealed.decode(), mid) == plain.decode()


def test_no_plaintext_payload_looks_like_an_envelope() -> None:
    # The marker starts with an escape the encoder never writes, even for look-alike strings.
    for value in ["/qenc1:11111111:AAAA", "\\/qenc1:x", PREFIX, {"a": "/qenc1:"}]:
        text = encode_payload(value).decode()
        assert not text.startswith(PREFIX)
        assert open_payload(None, text, str(uuid.uuid4())) == text


def test_nonces_never_repeat_within_a_cipher() -> None:
    cipher = PayloadCipher(parse_key(KEY_A))
    mids = [str(uuid.uuid4()) for _ in range(200)]
    sealed = cipher.seal_many([b"1"] * 200, mids) + cipher.seal_many([b"1"] * 200, mids)
    nonces = {s.split(b":")[2][:16] for s in sealed}  # base64 of the 12-byte nonce
    assert len(nonces) == 400


def test_a_wrong_key_a_missing_key_and_a_moved_envelope_are_clear_errors() -> None:
    a, b = PayloadCipher(parse_key(KEY_A)), PayloadCipher(parse_key(KEY_B))
    mid = str(uuid.uuid4())
    sealed = a.seal(b'{"x":1}', mid).decode()
    with pytest.raises(PayloadUnreadable, match=f"encrypted with key {a.key_id}.*key {b.key_id}"):
        open_payload(b, sealed, mid)
    with pytest.raises(PayloadUnreadable, match="QUEEN_ENCRYPTION_KEY is not set"):
        open_payload(None, sealed, mid)
    with pytest.raises(PayloadUnreadable, match="does not authenticate"):
        open_payload(a, sealed, str(uuid.uuid4()))  # bound to its own message
    tampered = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    with pytest.raises(PayloadUnreadable, match="does not authenticate"):
        open_payload(a, tampered, mid)


@pytest.mark.parametrize("bad", ["abc", "zz" * 32, "11" * 31, "11" * 33])
def test_a_bad_key_is_refused_naming_the_variable(bad: str) -> None:
    with pytest.raises(ValueError, match="QUEEN_ENCRYPTION_KEY"):
        Settings(encryption_key=bad)


def test_queen_serve_exits_2_on_a_bad_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUEEN_ENCRYPTION_KEY", "not-hex")
    assert cli_main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "QUEEN_ENCRYPTION_KEY" in err and "not-hex" not in err


def test_the_key_never_shows_in_the_settings_repr() -> None:
    assert KEY_A not in repr(Settings(encryption_key=KEY_A))


async def test_until_the_queue_list_is_read_every_queue_is_sealed() -> None:
    # The database was unreachable at start-up: pushes spooled then must not be plaintext.
    async def load() -> set[str]:
        return {"secret-q"}

    encryption = QueueEncryption(PayloadCipher(parse_key(KEY_A)), load, refresh_s=1.0)
    assert encryption.seals("secret-q") and encryption.seals("other")
    await encryption.load()
    assert encryption.seals("secret-q") and not encryption.seals("other")

    batch = PartitionBatch(PartitionKey("other", "p"), [0], [str(uuid.uuid4())], ["t"], [b"1"])
    original = batch.payloads
    encryption.seal("other", [batch])
    assert batch.payloads is original
    encryption.seal("secret-q", [batch])
    assert batch.payloads is not original and original == [b"1"]
    assert encryption.open(batch.payloads[0].decode(), batch.message_ids[0]) == "1"

    keyless = QueueEncryption(None, load, refresh_s=1.0)
    await keyless.load()
    assert not keyless.seals("secret-q")
    assert keyless.status().plaintext_queues == ("secret-q",)


# --- through HTTP ------------------------------------------------------------------------------


@asynccontextmanager
async def http(settings: Settings, key: str | None) -> AsyncIterator[tuple[Api, Broker]]:
    async with open_broker(settings.with_changes(encryption_key=key)) as broker:
        yield Api(create_app(broker).test_client()), broker


def spool_bytes(directory: str) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(Path(directory).glob("spool-*.log")))


async def stored_payloads(db: Db, queue: str) -> list[str]:
    rows = await db.rows(
        """SELECT u.p FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id, unnest(s.payloads) AS u (p)
           WHERE q.name = %s ORDER BY s.partition_id, s.first_offset""",
        queue,
    )
    return [r[0] for r in rows]


async def test_an_encrypted_queue_stores_ciphertext_and_pops_plaintext(
    settings: Settings, db: Db, queue: str
) -> None:
    plain_queue = f"{queue}-plain"
    async with http(settings, KEY_A) as (api, _):
        answer = await api.configure(queue, encryptionEnabled=True)
        assert answer["options"]["encryptionEnabled"] is True and "warning" not in answer
        await api.push(queue, "p", SECRET, [1, 2], None)
        await api.push(plain_queue, "p", SECRET)

        stored = await stored_payloads(db, queue)
        assert len(stored) == 3
        assert all(s.startswith(PREFIX) and SECRET_TEXT not in s for s in stored)
        assert await db.value(
            "SELECT payloads[1]::jsonb IS NOT NULL FROM queen.segments s "
            "JOIN queen.partitions p ON p.id = s.partition_id "
            "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s",
            queue,
        )
        assert await stored_payloads(db, plain_queue) == [orjson.dumps(SECRET).decode()]

        messages = await api.messages(queue, batch=10)
        assert [m["data"] for m in messages] == [SECRET, [1, 2], None]
        assert [m["data"] for m in await api.messages(plain_queue)] == [SECRET]


async def test_a_transaction_pushes_ciphertext_and_the_dlq_reads_plaintext(
    settings: Settings, db: Db, queue: str
) -> None:
    out = f"{queue}-out"
    async with http(settings, KEY_A) as (api, _):
        await api.configure(queue, encryptionEnabled=True, retryLimit=0, retryDelay=0)
        await api.configure(out, encryptionEnabled=True)
        await api.push(queue, "p", {"step": 1})
        [message] = await api.messages(queue)
        assert message["data"] == {"step": 1}
        status, body = await api.post(
            "/api/v1/transaction",
            {
                "operations": [
                    {
                        "type": "ack",
                        "transactionId": message["transactionId"],
                        "partitionId": message["partitionId"],
                        "status": "completed",
                    },
                    {"type": "push", "items": [{"queue": out, "payload": SECRET}]},
                ],
                "requiredLeases": [message["leaseId"]],
            },
        )
        assert status == 200 and body["success"] is True, body
        [stored] = await stored_payloads(db, out)
        assert stored.startswith(PREFIX) and SECRET_TEXT not in stored
        [moved] = await api.messages(out)
        assert moved["data"] == SECRET

        # A nack past the retry limit (0) copies the stored, encrypted payload to the DLQ.
        await api.push(queue, "p", SECRET)
        [poison] = await api.messages(queue)
        assert poison["data"] == SECRET
        await api.ack(poison, "failed", error="boom")
        [(dlq_stored,)] = await db.rows(
            "SELECT d.payload FROM queen.dlq d WHERE d.message_id = %s::uuid", poison["id"]
        )
        assert dlq_stored.startswith(PREFIX) and SECRET_TEXT not in dlq_stored
        status, page = await api.get(f"/api/v1/dlq?queue={queue}")
        assert status == 200
        assert [m["data"] for m in page["messages"]] == [SECRET]
        assert "decryptionError" not in page["messages"][0]


async def test_the_spool_holds_ciphertext_and_replays_it(
    settings: Settings, db: Db, queue: str
) -> None:
    async with http(settings, KEY_A) as (api, broker):
        await api.configure(queue, encryptionEnabled=True)
        await broker.set_maintenance(True)  # every push is spooled
        [result] = await api.push(queue, "p", SECRET)
        assert result["status"] == "buffered"
        spooled = spool_bytes(settings.file_buffer_dir)
        assert b"qenc1:" in spooled and SECRET_TEXT.encode() not in spooled
        await broker.set_maintenance(False)
        await broker.wait_spool_empty()
        [stored] = await stored_payloads(db, queue)
        assert stored.startswith(PREFIX)
        [message] = await api.messages(queue)
        assert message["data"] == SECRET and message["id"] == result["message_id"]


async def test_a_wrong_key_is_a_clear_503_and_other_partitions_are_still_delivered(
    settings: Settings, db: Db, queue: str
) -> None:
    async with http(settings, KEY_A) as (api, _):
        await api.configure(queue, encryptionEnabled=True)
        await api.push(queue, "old", {"n": 1}, {"n": 2})
    async with http(settings, KEY_B) as (api, broker):
        await api.push(queue, "new", {"n": 3})
        # One pop over both partitions: the readable one is delivered, the other withheld.
        got = await api.messages(queue, batch=10, partitions=2)
        assert [m["data"] for m in got] == [{"n": 3}]
        assert broker.metrics.pop_undecryptable == 2
        status, body = await api.pop(queue, "old", batch=10)
        assert status == 503
        assert body["code"] == "decryption_failed"
        assert "QUEEN_ENCRYPTION_KEY" in body["error"] and "'old'" in body["error"]
        # Withheld, not leased and not lost: the lease was released at once.
        assert (
            await db.value(
                "SELECT count(*) FROM queen.cursors c JOIN queen.partitions p ON p.id = "
                "c.partition_id JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s "
                "AND c.lease_id IS NOT NULL AND c.lease_expires_at > now() AND p.name = 'old'",
                queue,
            )
            == 0
        )
    async with http(settings, None) as (api, _):
        status, body = await api.pop(queue, "old")
        assert status == 503 and "QUEEN_ENCRYPTION_KEY is not set" in body["error"]
    async with http(settings, KEY_A) as (api, _):
        got = await api.messages(queue, "old", batch=10)
        assert [m["data"] for m in got] == [{"n": 1}, {"n": 2}]


async def test_an_auto_ack_pop_keeps_what_it_cannot_decrypt_in_the_dlq(
    settings: Settings, queue: str
) -> None:
    async with http(settings, KEY_A) as (api, _):
        await api.configure(queue, encryptionEnabled=True)
        await api.push(queue, "p", {"n": 1})
        await api.configure(queue, encryptionEnabled=False)
        await api.push(queue, "p", {"n": 2})
    async with http(settings, KEY_B) as (api, _):
        got = await api.messages(queue, batch=10, autoAck="true")
        assert [m["data"] for m in got] == [{"n": 2}]
        status, page = await api.get(f"/api/v1/dlq?queue={queue}")
        assert status == 200
        [entry] = page["messages"]
        assert entry["data"] is None and "encrypted with key" in entry["decryptionError"]
        assert "not delivered" in entry["errorMessage"]
    async with http(settings, KEY_A) as (api, _):
        status, page = await api.get(f"/api/v1/dlq?queue={queue}")
        assert status == 200
        assert [m["data"] for m in page["messages"]] == [{"n": 1}]
        assert await api.messages(queue, batch=10, autoAck="true") == []


async def test_a_configure_in_another_process_reaches_this_one_at_its_refresh(
    settings: Settings, db: Db, queue: str
) -> None:
    slow = settings.with_changes(system_state_cache_ms=600_000)  # no refresh during the test
    async with http(slow, KEY_A) as (api, broker), http(slow, KEY_A) as (other, _):
        await api.push(queue, "p", "before")
        await other.configure(queue, encryptionEnabled=True)
        assert not broker.encryption.seals(queue)  # not refreshed yet
        await broker.encryption.load()  # what the refresh loop does every few seconds
        await api.push(queue, "p", "after")
        stored = await stored_payloads(db, queue)
        assert [s.startswith(PREFIX) for s in stored] == [False, True]
        assert [m["data"] for m in await api.messages(queue, batch=5)] == ["before", "after"]


async def test_without_a_key_the_queue_works_in_plaintext_and_health_says_so(
    settings: Settings, db: Db, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with http(settings, None) as (api, _):
        answer = await api.configure(queue, encryptionEnabled=True)
        assert "QUEEN_ENCRYPTION_KEY is not set" in answer["warning"]
        await api.push(queue, "p", SECRET)
        assert await stored_payloads(db, queue) == [orjson.dumps(SECRET).decode()]
        assert [m["data"] for m in await api.messages(queue)] == [SECRET]
        status, health = await api.get("/health")
        assert status == 200
        encryption = health["encryption"]
        assert encryption["keySet"] is False and queue in encryption["plaintextQueues"]
        assert "QUEEN_ENCRYPTION_KEY is not set" in encryption["warning"]
    caplog.clear()
    with caplog.at_level("INFO", logger="queen.encryption"):
        async with http(settings, None):
            pass
    assert any(
        "ask for encryption" in r.getMessage()
        and "QUEEN_ENCRYPTION_KEY is not set" in r.getMessage()
        for r in caplog.records
    )


async def test_switching_encryption_off_and_on_keeps_mixed_history_readable(
    settings: Settings, db: Db, queue: str
) -> None:
    async with http(settings, KEY_A) as (api, _):
        await api.configure(queue, encryptionEnabled=True)
        await api.push(queue, "p", "sealed-1")
        await api.configure(queue, encryptionEnabled=False)
        await api.push(queue, "p", "plain-2")
        await api.configure(queue, encryptionEnabled=True)
        await api.push(queue, "p", "sealed-3")
        stored = await stored_payloads(db, queue)
        assert [s.startswith(PREFIX) for s in stored] == [True, False, True]
        got = await api.messages(queue, batch=10)
        assert [m["data"] for m in got] == ["sealed-1", "plain-2", "sealed-3"]


async def test_health_and_the_log_name_the_key_but_never_show_it(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="queen.encryption"):
        async with http(settings, KEY_A):
            pass
    key_id = PayloadCipher(parse_key(KEY_A)).key_id
    assert any(f"AES-256-GCM with key {key_id}" in r.getMessage() for r in caplog.records)
    assert all(KEY_A not in r.getMessage() for r in caplog.records)
    async with http(settings, KEY_A) as (api, _):
        status, health = await api.get("/health")
        assert status == 200
        assert health["encryption"]["keySet"] is True
        assert health["encryption"]["keyId"] == PayloadCipher(parse_key(KEY_A)).key_id
        assert KEY_A not in json.dumps(health)


async def test_traces_of_an_encrypted_queue_are_stored_sealed_and_read_in_plaintext(
    settings: Settings, db: Db, queue: str
) -> None:
    plain_queue = f"{queue}-plain"
    name = f"audit-{queue}"
    async with http(settings, KEY_A) as (api, _):
        await api.configure(queue, encryptionEnabled=True)
        await api.push(queue, "p", {"n": 1}, tx=["tx-1"])
        await api.push(plain_queue, "p", {"n": 2}, tx=["tx-2"])
        [sealed_msg] = await api.messages(queue)
        [plain_msg] = await api.messages(plain_queue)
        for msg, tx in ((sealed_msg, "tx-1"), (plain_msg, "tx-2")):
            body = {"partitionId": msg["partitionId"], "transactionId": tx, "data": SECRET}
            status, _ = await api.post("/api/v1/traces", {**body, "traceNames": [name]})
            assert status == 201

        stored = {
            r[0]: r[1]
            for r in await db.rows(
                "SELECT t.transaction_id, t.data FROM queen.traces t "
                "JOIN queen.partitions p ON p.id = t.partition_id "
                "JOIN queen.queues q ON q.id = p.queue_id WHERE q.name IN (%s, %s)",
                queue,
                plain_queue,
            )
        }
        assert stored["tx-1"].startswith(PREFIX) and SECRET_TEXT not in stored["tx-1"]
        assert orjson.loads(stored["tx-2"]) == SECRET  # a plain queue's traces stay plain

        status, body = await api.get(f"/api/v1/traces/{sealed_msg['partitionId']}/tx-1")
        assert status == 200 and [t["data"] for t in body["traces"]] == [SECRET]
        status, body = await api.get(f"/api/v1/traces/by-name/{name}")
        assert status == 200 and [t["data"] for t in body["traces"]] == [SECRET, SECRET]

        # An envelope moved onto another message's trace does not open.
        await db.rows(
            "UPDATE queen.traces SET data = %s WHERE transaction_id = 'tx-2' AND partition_id = %s",
            stored["tx-1"],
            int(plain_msg["partitionId"]),
        )
        status, body = await api.get(f"/api/v1/traces/{plain_msg['partitionId']}/tx-2")
        assert status == 503 and body["code"] == "decryption_failed"
    async with http(settings, None) as (api, _):
        status, body = await api.get(f"/api/v1/traces/{sealed_msg['partitionId']}/tx-1")
        assert status == 503 and "QUEEN_ENCRYPTION_KEY is not set" in body["error"]

"""An original-shaped Queen database for the import tests, written from the original's facts:
the tables and columns ``queen import`` reads, filled the way the original's push, pop, ack
and dead-letter paths leave them.

- A message row per message; a push of several items stores them with one ``created_at`` (the
  transaction's time) and UUIDv7 ids minted by the server (48-bit milliseconds, then a
  sequence), so a partition's order is ``(created_at, id)``.
- ``partition_consumers``: one row per (partition, group); ``(last_consumed_created_at,
  last_consumed_id)`` is the last message done (NULL: none yet); a pop writes the lease
  (``worker_id``, ``lease_expires_at``, ``batch_size``) without moving the cursor; an ack
  moves the cursor to the acked message; a message dead-lettered moves it too and leaves a
  ``dead_letter_queue`` row pointing at the message; a failed batch counts
  ``batch_retry_count``.
- A group subscribed ``new`` has a ``consumer_groups_metadata`` row (queue-wide,
  ``partition_name = ''``) with its subscription time, and rows with no cursor yet for the
  partitions that existed.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

QUEUE_MODE = "__QUEUE_MODE__"

DDL = """
CREATE SCHEMA queen;
CREATE TABLE queen.queues (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name varchar(255) UNIQUE NOT NULL,
    namespace varchar(255),
    task varchar(255),
    priority integer DEFAULT 0,
    lease_time integer DEFAULT 300,
    retry_limit integer DEFAULT 3,
    retry_delay integer DEFAULT 1000,
    ttl integer DEFAULT 3600,
    dead_letter_queue boolean DEFAULT false,
    dlq_after_max_retries boolean DEFAULT false,
    delayed_processing integer DEFAULT 0,
    window_buffer integer DEFAULT 0,
    retention_seconds integer DEFAULT 0,
    completed_retention_seconds integer DEFAULT 0,
    retention_enabled boolean DEFAULT false,
    encryption_enabled boolean DEFAULT false,
    max_wait_time_seconds integer DEFAULT 0,
    max_queue_size integer DEFAULT 0,
    created_at timestamptz DEFAULT now()
);
CREATE TABLE queen.partitions (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    queue_id uuid REFERENCES queen.queues (id) ON DELETE CASCADE,
    name varchar(255) NOT NULL DEFAULT 'Default',
    created_at timestamptz DEFAULT now(),
    UNIQUE (queue_id, name)
);
CREATE TABLE queen.messages (
    id uuid PRIMARY KEY,
    transaction_id varchar(255) NOT NULL,
    trace_id uuid,
    partition_id uuid REFERENCES queen.partitions (id) ON DELETE CASCADE,
    payload jsonb NOT NULL,
    created_at timestamptz DEFAULT now(),
    is_encrypted boolean DEFAULT false,
    producer_sub text
);
CREATE UNIQUE INDEX ON queen.messages (partition_id, transaction_id);
CREATE INDEX ON queen.messages (partition_id, created_at, id);
CREATE TABLE queen.partition_consumers (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    partition_id uuid REFERENCES queen.partitions (id) ON DELETE CASCADE,
    consumer_group varchar(255) DEFAULT '__QUEUE_MODE__',
    last_consumed_id uuid DEFAULT '00000000-0000-0000-0000-000000000000',
    last_consumed_created_at timestamptz,
    lease_expires_at timestamptz,
    lease_acquired_at timestamptz,
    batch_size integer DEFAULT 0,
    acked_count integer DEFAULT 0,
    worker_id varchar(255),
    batch_retry_count integer DEFAULT 0,
    UNIQUE (partition_id, consumer_group)
);
CREATE TABLE queen.consumer_groups_metadata (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    consumer_group text NOT NULL,
    queue_name text NOT NULL DEFAULT '',
    partition_name text NOT NULL DEFAULT '',
    namespace text NOT NULL DEFAULT '',
    task text NOT NULL DEFAULT '',
    subscription_mode text NOT NULL,
    subscription_timestamp timestamptz NOT NULL,
    UNIQUE (consumer_group, queue_name, partition_name, namespace, task)
);
CREATE TABLE queen.dead_letter_queue (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    message_id uuid REFERENCES queen.messages (id) ON DELETE CASCADE,
    partition_id uuid REFERENCES queen.partitions (id) ON DELETE CASCADE,
    consumer_group varchar(255),
    error_message text,
    retry_count integer DEFAULT 0,
    original_created_at timestamptz,
    failed_at timestamptz DEFAULT now()
);
"""


def seal_as_original(text: str, key: bytes) -> str:
    """The original's envelope: AES-256-GCM, a random 12-byte iv, no associated data, the
    ciphertext, iv and tag in base64 in a JSON object."""
    iv = os.urandom(12)
    sealed = AESGCM(key).encrypt(iv, text.encode(), None)
    return json.dumps(
        {
            "encrypted": base64.b64encode(sealed[:-16]).decode(),
            "iv": base64.b64encode(iv).decode(),
            "authTag": base64.b64encode(sealed[-16:]).decode(),
        }
    )


def uuid7(ms: int, seq: int) -> str:
    """A UUIDv7 as the original server mints them: milliseconds, version, a sequence."""
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | ((seq & 0xFFF) << 64) | (0b10 << 62) | rand
    return str(uuid.UUID(int=value))


class OriginalDb:
    """Fills an original-shaped database. Times advance by ``step`` per push from ``start``
    (in the past, so every push has its own creation time)."""

    def __init__(self, url: str, start: datetime | None = None) -> None:
        self.url = url
        self.now = start or datetime.now(UTC) - timedelta(minutes=30)
        self.seq = 0

    def _conn(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)

    def create_schema(self) -> None:
        with self._conn() as conn:
            conn.execute(DDL)

    def queue(self, name: str, **options: Any) -> str:
        cols = ["name", *options]
        marks = ", ".join(["%s"] * len(cols))
        with self._conn() as conn:
            row = conn.execute(
                f"INSERT INTO queen.queues ({', '.join(cols)}) VALUES ({marks}) RETURNING id",
                (name, *options.values()),
            ).fetchone()
        assert row is not None
        return str(row[0])

    def partition(self, queue: str, name: str) -> str:
        with self._conn() as conn:
            row = conn.execute(
                """INSERT INTO queen.partitions (queue_id, name)
                   SELECT id, %s FROM queen.queues WHERE name = %s
                   ON CONFLICT (queue_id, name) DO UPDATE SET name = EXCLUDED.name
                   RETURNING id""",
                (name, queue),
            ).fetchone()
        assert row is not None
        return str(row[0])

    def push(
        self,
        queue: str,
        partition: str,
        payloads: list[Any],
        *,
        producer_sub: str | None = None,
        traced: bool = False,
        key: bytes | None = None,
        transaction_ids: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """One push: the items share one creation time; returns the stored messages. With
        ``key`` (a queue with encryption on) payloads are stored sealed, as the original
        seals them."""
        pid = self.partition(queue, partition)
        self.now += timedelta(seconds=1)
        ms = int(self.now.timestamp() * 1000)
        stored = []
        for n, payload in enumerate(payloads):
            self.seq += 1
            stored.append(
                {
                    "id": uuid7(ms, self.seq),
                    "transaction_id": transaction_ids[n]
                    if transaction_ids
                    else f"tx-{uuid.uuid4().hex}",
                    "trace_id": str(uuid.uuid4()) if traced else None,
                    "payload": payload,
                    "producer_sub": producer_sub,
                    "created_at": self.now,
                    "partition_id": pid,
                }
            )
        with self._conn() as conn, conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO queen.messages (id, transaction_id, trace_id, partition_id,
                                               payload, created_at, producer_sub,
                                               is_encrypted)
                   VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s, %s)""",
                [
                    (
                        m["id"],
                        m["transaction_id"],
                        m["trace_id"],
                        pid,
                        seal_as_original(json.dumps(m["payload"]), key)
                        if key
                        else json.dumps(m["payload"]),
                        m["created_at"],
                        producer_sub,
                        key is not None,
                    )
                    for m in stored
                ],
            )
        return stored

    def ordered(self, queue: str, partition: str) -> list[str]:
        """Message ids of one partition in the original's order."""
        with self._conn() as conn:
            rows = conn.execute(
                """SELECT m.id::text FROM queen.messages m
                   JOIN queen.partitions p ON p.id = m.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                   WHERE q.name = %s AND p.name = %s ORDER BY m.created_at, m.id""",
                (queue, partition),
            ).fetchall()
        return [r[0] for r in rows]

    def _row(self, queue: str, partition: str, group: str) -> None:
        pid = self.partition(queue, partition)
        with self._conn() as conn:
            conn.execute(
                """INSERT INTO queen.partition_consumers (partition_id, consumer_group)
                   VALUES (%s, %s) ON CONFLICT DO NOTHING""",
                (pid, group),
            )

    def ack_through(self, queue: str, partition: str, group: str, count: int) -> None:
        """The group has acked the first ``count`` messages (the cursor names the last)."""
        self._row(queue, partition, group)
        if count == 0:
            return
        last = self.ordered(queue, partition)[count - 1]
        with self._conn() as conn:
            conn.execute(
                """UPDATE queen.partition_consumers pc
                   SET last_consumed_id = m.id, last_consumed_created_at = m.created_at,
                       lease_expires_at = NULL, worker_id = NULL, batch_size = 0,
                       acked_count = 0, batch_retry_count = 0
                   FROM queen.messages m
                   WHERE m.id = %s AND pc.partition_id = m.partition_id
                     AND pc.consumer_group = %s""",
                (last, group),
            )

    def lease(self, queue: str, partition: str, group: str, size: int, retries: int = 0) -> None:
        """A pop took a lease on the next ``size`` messages and has not acked them."""
        self._row(queue, partition, group)
        pid = self.partition(queue, partition)
        with self._conn() as conn:
            conn.execute(
                """UPDATE queen.partition_consumers
                   SET worker_id = %s, lease_acquired_at = now(),
                       lease_expires_at = now() + interval '10 minutes', batch_size = %s,
                       acked_count = 0, batch_retry_count = %s
                   WHERE partition_id = %s AND consumer_group = %s""",
                (str(uuid.uuid4()), size, retries, pid, group),
            )

    def dead_letter(self, queue: str, partition: str, group: str, index: int, error: str) -> str:
        """Message ``index`` failed past the retry limit: a DLQ row, and the cursor moves
        past it (the messages before it were acked)."""
        message = self.ordered(queue, partition)[index]
        pid = self.partition(queue, partition)
        self.ack_through(queue, partition, group, index + 1)
        with self._conn() as conn:
            conn.execute(
                """INSERT INTO queen.dead_letter_queue (message_id, partition_id, consumer_group,
                                                        error_message, retry_count,
                                                        original_created_at)
                   SELECT id, %s, %s, %s, 2, created_at FROM queen.messages WHERE id = %s""",
                (pid, group, error, message),
            )
        return message

    def subscribe_new(self, queue: str, group: str) -> datetime:
        """The group's first pop, with subscriptionMode new, found nothing: its subscription
        time is now (after every message pushed so far); rows with no cursor for the
        partitions that exist."""
        self.now += timedelta(milliseconds=500)
        with self._conn() as conn:
            conn.execute(
                """INSERT INTO queen.consumer_groups_metadata (consumer_group, queue_name,
                                                               subscription_mode,
                                                               subscription_timestamp)
                   VALUES (%s, %s, 'new', %s)""",
                (group, queue, self.now),
            )
            conn.execute(
                """INSERT INTO queen.partition_consumers (partition_id, consumer_group)
                   SELECT p.id, %s FROM queen.partitions p
                   JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s""",
                (group, queue),
            )
        return self.now

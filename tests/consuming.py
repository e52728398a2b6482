"""Helpers for the consume-side tests: HTTP calls in the client's exact shapes, SQL that
moves time for leases and message ages (no test waits for a clock), and partitions made idle."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import psycopg

from queen.broker import Broker
from tests.conftest import Db

JSON = {"content-type": "application/json"}


class Api:
    """The routes, called as the official client calls them, through Quart's test client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def post(self, path: str, body: Any = None) -> tuple[int, Any]:
        data = b"" if body is None else orjson.dumps(body)
        resp = await self.client.post(path, data=data, headers=JSON if data else {})
        return resp.status_code, await _json(resp)

    async def get(self, path: str) -> tuple[int, Any]:
        resp = await self.client.get(path)
        return resp.status_code, await _json(resp)

    async def delete(self, path: str) -> tuple[int, Any]:
        resp = await self.client.delete(path)
        return resp.status_code, await _json(resp)

    async def configure(self, queue: str, **options: Any) -> dict[str, Any]:
        status, body = await self.post(
            "/api/v1/configure",
            {"queue": queue, "namespace": None, "task": None, "options": options},
        )
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    async def push(
        self, queue: str, partition: str, *payloads: Any, tx: list[str] | None = None
    ) -> list[dict[str, Any]]:
        items = []
        for i, payload in enumerate(payloads):
            item = {"queue": queue, "partition": partition, "payload": payload}
            if tx is not None:
                item["transactionId"] = tx[i]
            items.append(item)
        status, body = await self.post("/api/v1/push", {"items": items})
        assert status == 201, body
        return body  # type: ignore[no-any-return]

    async def pop(
        self, queue: str | None, partition: str | None = None, **params: Any
    ) -> tuple[int, Any]:
        if queue is None:
            path = "/api/v1/pop"
        else:
            path = f"/api/v1/pop/queue/{quote(queue)}"
            if partition is not None:
                path += f"/partition/{quote(partition)}"
        params.setdefault("wait", "false")
        query = urlencode({k: _text(v) for k, v in params.items() if v is not None})
        return await self.get(f"{path}?{query}")

    async def messages(self, queue: str, partition: str | None = None, **params: Any) -> list[Any]:
        """The messages of one pop ([] on 204)."""
        status, body = await self.pop(queue, partition, **params)
        assert status in (200, 204), body
        return [] if status == 204 else body["messages"]  # type: ignore[no-any-return]

    async def ack(
        self,
        message: dict[str, Any],
        status: str = "completed",
        *,
        group: str | None = None,
        error: str | None = None,
        lease: str | None = "from-message",
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "transactionId": message["transactionId"],
            "partitionId": message["partitionId"],
            "status": status,
            "error": error,
            "consumerGroup": group,
        }
        lease_id = message.get("leaseId") if lease == "from-message" else lease
        if lease_id:
            body["leaseId"] = lease_id
        code, answer = await self.post("/api/v1/ack", body)
        assert code == 200, answer
        assert isinstance(answer, list) and len(answer) == 1
        return answer[0]  # type: ignore[no-any-return]

    async def ack_batch(
        self,
        messages: list[dict[str, Any]],
        status: str = "completed",
        *,
        group: str | None = None,
        error: str | None = None,
    ) -> list[dict[str, Any]]:
        acks = [
            {
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "status": status,
                "error": error,
                "leaseId": m["leaseId"],
            }
            for m in messages
        ]
        code, answer = await self.post(
            "/api/v1/ack/batch", {"acknowledgments": acks, "consumerGroup": group}
        )
        assert code == 200, answer
        return answer  # type: ignore[no-any-return]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def _json(resp: Any) -> Any:
    raw = await resp.get_data()
    return orjson.loads(raw) if raw else None


def data_of(messages: list[dict[str, Any]]) -> list[Any]:
    return [m["data"] for m in messages]


async def expire_leases(db: Db, queue: str) -> int:
    """Make every lease on ``queue`` expired, as if its lease time had passed."""
    rows = await db.rows(
        """UPDATE queen.cursors c SET lease_expires_at = now() - interval '1 second'
           FROM queen.queues q
           WHERE q.id = c.queue_id AND q.name = %s AND c.lease_id IS NOT NULL
           RETURNING 1""",
        queue,
    )
    return len(rows)


async def age_messages(
    db: Db, queue: str, seconds: float, *, first_offset_below: int | None = None
) -> None:
    """Make the stored messages of ``queue`` older by ``seconds`` (only the segments starting
    below ``first_offset_below``, when given)."""
    await db.rows(
        """UPDATE queen.segments s SET created_at = s.created_at - make_interval(secs => %s)
           FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
           WHERE p.id = s.partition_id AND q.name = %s
             AND (%s::bigint IS NULL OR s.first_offset < %s::bigint)""",
        seconds,
        queue,
        first_offset_below,
        first_offset_below,
    )


async def end_retry_delays(db: Db, queue: str) -> None:
    await db.rows(
        """UPDATE queen.cursors c SET not_before = NULL
           FROM queen.queues q WHERE q.id = c.queue_id AND q.name = %s""",
        queue,
    )


async def idle_partitions(broker: Broker, queue: str, group: str, count: int) -> None:
    """``count`` partitions ``idle-<i>`` of ``queue``, each with one message (``i``) that
    ``group`` consumed."""
    await broker.push(
        [{"queue": queue, "partition": f"idle-{i}", "payload": i} for i in range(count)]
    )
    taken = 0
    while taken < count:
        result = await broker.pop(
            queue, consumer_group=group, batch=1000, partitions=1000, auto_ack=True
        )
        assert result, "the idle partitions were not all consumed"
        taken += len(result.messages)


def pop_blocks_read(
    url: str, queue: str, group: str, hint: list[str] | None, batch: int = 10
) -> int:
    """The shared buffers a waiting pop of ``batch`` by ``group`` on ``queue`` reads (its whole
    statement, every query inside queen.pop included), reading ``hint`` or the whole queue;
    rolled back, so nothing changes. The least of four, once the session's plans and catalog
    caches are made."""
    read = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET jit = off")
        for _ in range(4):
            conn.execute("BEGIN")
            row = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM queen.pop("
                "%s, NULL, '', '', %s, %s, 1, false, 'all', NULL, gen_random_uuid(), true,"
                " 1048576, %s, 1)",
                (queue, group, batch, hint),
            ).fetchone()
            conn.execute("ROLLBACK")
            assert row is not None
            plan: Any = row[0][0]["Plan"]
            read.append(int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"]))
    return min(read)


def explain_nested(conn: psycopg.Connection[Any], *settings: str) -> list[dict[str, Any]]:
    """Switch on auto_explain in ``conn``'s session for every statement, those run inside
    functions included, with ``settings`` besides; the list returned fills with each plan
    logged (auto_explain's JSON entry: its query text and plan) as the session runs them."""
    logged: list[dict[str, Any]] = []

    def note(diagnostic: psycopg.errors.Diagnostic) -> None:
        text = diagnostic.message_primary or ""
        if "{" in text:
            logged.append(json.loads(text[text.index("{") :]))

    conn.add_notice_handler(note)
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_format = json",
        "SET jit = off",
        *settings,
    ):
        conn.execute(setting)
    return logged

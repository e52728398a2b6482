"""POST /api/v1/configure and DELETE /api/v1/resources/queues/{q}, on the real database."""

from __future__ import annotations

from typing import Any

import pytest

from queen.broker import Broker
from queen.consume.errors import InvalidRequest
from tests.conftest import Db
from tests.consuming import Api

CLIENT_DEFAULTS = {
    "leaseTime": 300,
    "retryLimit": 3,
    "priority": 0,
    "delayedProcessing": 0,
    "windowBuffer": 0,
    "maxSize": 0,
    "retentionSeconds": 0,
    "completedRetentionSeconds": 0,
    "encryptionEnabled": False,
}


async def test_configure_answers_with_every_option(api: Api, queue: str, db: Db) -> None:
    status, body = await api.post(
        "/api/v1/configure",
        {"queue": queue, "namespace": None, "task": None, "options": CLIENT_DEFAULTS},
    )
    assert status == 200
    assert body["configured"] is True
    assert (body["queue"], body["namespace"], body["task"]) == (queue, "", "")
    assert body["options"]["leaseTime"] == 300 and body["options"]["ttl"] == 3600
    assert body["options"]["dedupWindowSeconds"] == 3600
    row = await db.rows(
        """SELECT q.id::text, p.id::text, p.name, q.namespace, q.task
           FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
           WHERE q.name = %s""",
        queue,
    )
    assert row == [(body["queueId"], body["partitionId"], "Default", "", "")]


async def test_configure_is_an_upsert_and_missing_keys_return_to_defaults(
    api: Api, queue: str, db: Db
) -> None:
    first = await api.post(
        "/api/v1/configure",
        {
            "queue": queue,
            "namespace": "ns",
            "task": "tk",
            "options": {
                "leaseTime": 7,
                "retryLimit": 9,
                "dedupWindowSeconds": 60,
                "priority": 5,
                "windowBuffer": 3,
                "deadLetterQueue": True,
            },
        },
    )
    assert first[0] == 200
    row = await db.rows(
        """SELECT lease_time_s, retry_limit, dedup_window_seconds, priority, window_buffer_s,
                  dead_letter_queue, namespace, task
           FROM queen.queues WHERE name = %s""",
        queue,
    )
    assert row == [(7, 9, 60, 5, 3, True, "ns", "tk")]
    second = await api.configure(queue, leaseTime=8)
    assert second["queueId"] == first[1]["queueId"]
    assert second["partitionId"] == first[1]["partitionId"]
    row = await db.rows(
        """SELECT lease_time_s, retry_limit, dedup_window_seconds, priority, window_buffer_s,
                  dead_letter_queue, namespace, task
           FROM queen.queues WHERE name = %s""",
        queue,
    )
    assert row == [(8, 3, 3600, 0, 0, False, "", "")]


async def test_every_option_given_to_configure_is_stored(api: Api, queue: str, db: Db) -> None:
    """Each option reaches its column: none of them left at its default."""
    given = {
        "leaseTime": 11,
        "retryLimit": 12,
        "retryDelay": 13,
        "maxSize": 14,
        "ttl": 15,
        "deadLetterQueue": True,
        "dlqAfterMaxRetries": True,
        "priority": 16,
        "delayedProcessing": 17,
        "windowBuffer": 18,
        "retentionSeconds": 19,
        "completedRetentionSeconds": 20,
        "retentionEnabled": True,
        "maxWaitTimeSeconds": 21,
        "encryptionEnabled": True,
        "dedupWindowSeconds": 22,
    }
    status, body = await api.post("/api/v1/configure", {"queue": queue, "options": given})
    assert status == 200 and body["options"] == given
    row = await db.rows(
        """SELECT lease_time_s, retry_limit, retry_delay_ms, max_size, ttl_s, dead_letter_queue,
                  dlq_after_max_retries, priority, delayed_processing_s, window_buffer_s,
                  retention_s, completed_retention_s, retention_enabled, max_wait_time_s,
                  encryption_enabled, dedup_window_seconds
           FROM queen.queues WHERE name = %s""",
        queue,
    )
    assert row == [tuple(given.values())]


async def test_dedup_window_zero_turns_dedup_off(api: Api, queue: str) -> None:
    await api.configure(queue, dedupWindowSeconds=0)
    first = await api.push(queue, "p", 1, tx=["same"])
    second = await api.push(queue, "p", 2, tx=["same"])
    assert first[0]["status"] == second[0]["status"] == "queued"
    await api.configure(queue)  # the default window again; dedup-off pushes left no history
    third = await api.push(queue, "p", 3, tx=["same"])
    fourth = await api.push(queue, "p", 4, tx=["same"])
    assert (third[0]["status"], fourth[0]["status"]) == ("queued", "duplicate")


async def test_queue_options_apply_to_queues_made_by_a_push(api: Api, queue: str, db: Db) -> None:
    await api.push(queue, "p", 1)
    assert await db.rows(
        "SELECT lease_time_s, retry_limit, retry_delay_ms FROM queen.queues WHERE name = %s", queue
    ) == [(300, 3, 1000)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"options": {}}, "queue is required"),
        ({"queue": 5}, "queue is required"),
        ({"queue": ""}, "queue is required"),
        ({"queue": "q", "namespace": 3}, "namespace must be a string"),
        ({"queue": "q", "options": {"leaseTime": "long"}}, "options.leaseTime must be an integer"),
        ({"queue": "q", "options": {"retentionEnabled": "yes"}}, "must be a boolean"),
        ({"queue": "q", "options": {"encryptionEnabled": "on"}}, "must be a boolean"),
        ({"queue": "q", "options": []}, "options must be an object"),
    ],
)
async def test_bad_configure_is_a_400_and_changes_nothing(
    api: Api, db: Db, body: dict[str, Any], message: str
) -> None:
    before = await db.value("SELECT count(*) FROM queen.queues")
    status, answer = await api.post("/api/v1/configure", body)
    assert status == 400
    assert message in answer["error"]
    assert await db.value("SELECT count(*) FROM queen.queues") == before


async def test_malformed_configure_body_is_a_400(client: Any) -> None:
    resp = await client.post(
        "/api/v1/configure", data=b"{nope", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert "malformed JSON" in (await resp.get_json())["error"]


async def test_delete_queue_cascades_to_consumer_state(api: Api, queue: str, db: Db) -> None:
    await api.configure(queue, retryLimit=0)
    await api.push(queue, "p", 1, 2)
    [first, _] = await api.messages(queue, batch=2)
    assert (await api.ack(first, "failed", error="x"))["dlq"] is True
    queue_id = await db.value("SELECT id FROM queen.queues WHERE name = %s", queue)
    assert await db.value("SELECT count(*) FROM queen.cursors WHERE queue_id = %s", queue_id) == 1
    assert await db.value("SELECT count(*) FROM queen.dlq WHERE queue_id = %s", queue_id) == 1

    status, body = await api.delete(f"/api/v1/resources/queues/{queue}")
    assert (status, body) == (200, {"deleted": True, "queue": queue, "existed": True})
    for table in ("cursors", "dlq", "consumer_groups", "failures"):
        count = await db.value(f"SELECT count(*) FROM queen.{table} WHERE queue_id = %s", queue_id)
        assert count == 0, table
    assert await db.count_frames(queue) == 0
    again = await api.delete(f"/api/v1/resources/queues/{queue}")
    assert again[1]["existed"] is False


async def test_sql_cleanup_by_name_also_removes_consumer_state(
    api: Api, queue: str, db: Db
) -> None:
    await api.push(queue, "p", 1)
    await api.messages(queue, consumerGroup="g")
    queue_id = await db.value("SELECT id FROM queen.queues WHERE name = %s", queue)
    await db.rows("DELETE FROM queen.queues WHERE name LIKE %s", queue)
    assert await db.value("SELECT count(*) FROM queen.cursors WHERE queue_id = %s", queue_id) == 0
    assert (
        await db.value("SELECT count(*) FROM queen.consumer_groups WHERE queue_id = %s", queue_id)
        == 0
    )


async def test_embedding_api_configures_and_deletes(broker: Broker, queue: str) -> None:
    answer = await broker.configure(queue, {"leaseTime": 12}, namespace="ns")
    assert answer.options.lease_time_s == 12 and answer.namespace == "ns"
    with pytest.raises(InvalidRequest, match=r"options\.retryLimit"):
        await broker.configure(queue, {"retryLimit": -1})
    assert (await broker.delete_queue(queue)).existed is True


async def test_delete_queue_with_a_bad_name_is_a_400(api: Api) -> None:
    status, answer = await api.delete("/api/v1/resources/queues/bad%01name")
    assert status == 400 and "control characters" in answer["error"]


async def test_the_embedding_api_takes_typed_options_under_the_same_rules(
    broker: Broker, queue: str
) -> None:
    from queen.records import QueueOptions

    answer = await broker.configure(queue, QueueOptions(lease_time_s=45, retry_limit=1))
    assert (answer.options.lease_time_s, answer.options.retry_limit) == (45, 1)
    with pytest.raises(InvalidRequest, match=r"options\.leaseTime must be between 1"):
        await broker.configure(queue, QueueOptions(lease_time_s=0))

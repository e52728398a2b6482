"""The official Python client, queen-mq 2.6.0, unchanged, against a real broker socket.

Each test starts ``queen.server.serve`` on a free port and runs one flow of
``tests/client_flows.py`` in the client's own virtualenv (built on demand, see
``tests/client_env.py``), then checks what the client observed and what the database holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from queen import open_broker
from queen.cipher import PREFIX
from queen.server import serve
from queen.settings import Settings
from tests.client_env import ensure_client_python
from tests.conftest import Db
from tests.consuming import age_messages

FLOWS = Path(__file__).with_name("client_flows.py")


@pytest.fixture(scope="session")
def client_python() -> Path:
    return ensure_client_python()


async def run_flow(
    client_python: Path,
    settings: Settings,
    flow: str,
    queue: str,
    tmp_path: Path,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    settings = settings.with_changes(host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
        env.update(extra_env or {})
        with trio.fail_after(90):
            done = await trio.run_process(
                [str(client_python), "-I", str(FLOWS), flow, f"http://127.0.0.1:{port}", queue],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=tmp_path,
                env=env,
            )
        nursery.cancel_scope.cancel()
    out = done.stdout.decode()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{out}\n{done.stderr.decode()}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


@pytest.fixture
def flow(client_python: Path, settings: Settings, queue: str, tmp_path: Path) -> Any:
    async def run(name: str) -> dict[str, Any]:
        return await run_flow(client_python, settings, name, queue, tmp_path)

    return run


async def test_create_push_pop_ack_nack_dlq_and_delete(flow: Any, queue: str) -> None:
    r = await flow("basics")
    assert r["created"] == {"configured": True, "queue": queue, "namespace": f"ns-{queue}"}
    assert r["created_options"] == {
        "leaseTime": 30,
        "retryLimit": 1,
        "retryDelay": 0,
        "priority": 0,
    }
    assert r["push_statuses"] == ["queued", "queued", "queued", "duplicate"]
    assert r["first_pop"] == [{"n": 1}, {"n": 2}]
    assert r["first_fields"] == {
        "transactionId": "tx-1",
        "traceId": None,
        "producerSub": None,
        "queue": queue,
        "partition": "Default",
        "retryCount": 0,
    }
    assert r["created_at_z"] and r["lease_shared"]
    assert r["ack_single"] is True and r["ack_batch"] is True and r["nack"] is True
    assert r["redelivered"] == [{"n": 3}, 1]
    assert r["after_dlq"] == []
    assert r["dlq_total"] == 1
    assert r["dlq"] == [[{"n": 3}, "second failure", 1]]
    assert r["namespace_pop"] == ["by namespace"]
    assert r["deleted"] is True and r["pop_after_delete"] == []


async def test_consume_with_autopilot_and_with_a_batch(flow: Any, queue: str, db: Db) -> None:
    r = await flow("consume_batches")
    for name in ("auto", "five"):
        assert r[name]["count"] == 30, name
        assert r[name]["in_order"] is True
        assert r[name]["partitions"] == [0, 1, 2]
        assert r[name]["shapes"] == ["list"]
        assert r[name]["left"] == 0
    pending = await db.value(
        """SELECT count(*) FROM queen.cursors c JOIN queen.queues q ON q.id = c.queue_id
           WHERE q.name LIKE %s AND (c.lease_id IS NOT NULL OR c.next_offset < 10)""",
        f"{queue}-%",
    )
    assert pending == 0


async def test_each_with_a_nack_redelivers_and_poison_goes_to_the_dlq(flow: Any) -> None:
    r = await flow("consume_each_nack")
    assert r["calls"] == [[0, 0], [1, 0], [2, 0], [2, 1], [3, 0], [4, 0]]
    assert r["left"] == []
    assert r["poison_handled"] == ["bad", "bad", "good"]
    assert r["dlq"] == [["bad", "cannot handle it"]]


async def test_consumer_groups_fan_out_and_subscribe(flow: Any) -> None:
    r = await flow("groups")
    assert r["g1"] == r["g2"] == ["old-1", "old-2"]
    assert r["g1_again"] == []
    assert r["new_before"] == [] and r["new_after"] == ["fresh"]
    assert r["g1_sees_fresh"] == ["fresh"]
    assert r["timestamp_update"] == [True, 1]
    assert r["replayed"] == ["old-1", "old-2", "fresh"]
    assert r["group_deleted"] == [True, 1]


async def test_subscription_modes_pop_sizes_seek_group_delete_and_traces(
    flow: Any, queue: str, db: Db
) -> None:
    r = await flow("consume_admin")
    assert r["from_beginning_pop"] == ["m0", "m1", "m2"]
    assert r["from_beginning_consume"] == ["m0", "m1", "m2"]
    assert r["autopilot_off_pop"] == ["m0"]  # batch=1 sent: one message
    assert r["autopilot_pop"] == ["m1", "m2"]  # the broker chose the batch
    assert r["seek_back"] == [True, False, 1]
    assert r["after_seek_back"] == ["m0", "m1", "m2"]
    assert r["seek_end"] == [True, True, 1]
    assert r["after_seek_end"] == []
    assert r["stale_ack"] is False  # seek released the lease
    assert r["deleted_on_queue"] == {
        "success": True,
        "consumerGroup": f"seek-{queue}",
        "queueName": queue,
        "deletedPartitions": 1,
    }
    assert r["reread_after_delete"] == ["m0", "m1", "m2"]
    kept = await db.value(
        "SELECT count(*) FROM queen.cursors c JOIN queen.queues q ON q.id = c.queue_id "
        "WHERE q.name = %s AND c.consumer_group = %s",
        f"{queue}-other",
        f"seek-{queue}",
    )
    assert kept == 1
    assert r["trace_answers"] == [True, True]
    assert r["message_traces"] == [
        ["info", {"step": 1}, "tracer", [f"order-{queue}"]],
        ["done", {"n": 2}, "tracer", sorted([f"cust-{queue}", f"order-{queue}"])],
    ]
    assert r["by_name"] == [1, [f"traced-{queue}"]]
    assert r["names"] == sorted([f"cust-{queue}", f"order-{queue}"])


async def test_lease_renewal_keeps_a_slow_handler_in_charge(flow: Any) -> None:
    r = await flow("renewal")
    assert r["renew"] == [True, 1, True]
    assert r["ack_direct"] is True
    assert r["other_consumer_saw"] == []
    assert r["left_after_ack"] == []


async def test_transaction_acks_and_pushes_atomically(flow: Any, queue: str, db: Db) -> None:
    r = await flow("transaction")
    assert r["success"] is True and r["types"] == ["ack", "push"]
    assert r["moved"] == [{"done": "in-1"}, True]
    assert r["traces"] == [[{"done": "in-1"}, True], ["plain", None]]
    assert r["stale_commit"] == "ACK operation failed: Invalid or expired lease"
    assert r["never"] == []
    assert (
        await db.value("SELECT count(*) FROM queen.queues WHERE name = %s", f"{queue}-never") == 0
    )


async def test_long_poll_wakes_on_push_and_times_out(flow: Any) -> None:
    r = await flow("long_poll")
    assert r["got"] == ["arrived"]
    assert r["waited_s"] < 10
    assert r["empty"] == [] and 0.4 < r["empty_waited_s"] < 5


async def test_with_a_bearer_token_producer_sub_is_the_tokens_sub(
    client_python: Path, settings: Settings, queue: str, tmp_path: Path
) -> None:
    import jwt

    secret = "a-test-secret-that-is-long-enough-for-hs256"
    token = jwt.encode({"sub": "svc-client", "roles": ["read-write"]}, secret, algorithm="HS256")
    result = await run_flow(
        client_python,
        settings.with_changes(jwt_enabled=True, jwt_secret=secret),
        "authenticated",
        queue,
        tmp_path,
        extra_env={"FLOW_BEARER_TOKEN": token},
    )
    assert result == {"statuses": ["queued"], "subs": ["svc-client"], "data": [{"n": 1}]}


async def test_an_encrypted_queue_reads_back_plaintext_everywhere(
    client_python: Path, settings: Settings, queue: str, tmp_path: Path, db: Db
) -> None:
    keyed = settings.with_changes(encryption_key="3a" * 32)
    r = await run_flow(client_python, keyed, "encrypted", queue, tmp_path)
    assert r["created"] is True
    assert r["popped"] == [{"secret": "s-1"}, {"secret": "s-2"}]
    assert r["moved"] == {"secret": "moved"}
    assert r["dlq"] == [{"secret": "s-2"}]
    stored = await db.rows(
        """SELECT u.p FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id, unnest(s.payloads) AS u (p)
           WHERE q.name IN (%s, %s)""",
        queue,
        f"{queue}-out",
    )
    stored += await db.rows(
        "SELECT payload FROM queen.dlq WHERE queue_id IN "
        "(SELECT id FROM queen.queues WHERE name = %s)",
        queue,
    )
    assert len(stored) == 4
    assert all(p.startswith(PREFIX) and "secret" not in p for (p,) in stored)


async def test_retention_enabled_and_max_wait_time_with_the_client(
    client_python: Path, settings: Settings, queue: str, tmp_path: Path, db: Db
) -> None:
    r = await run_flow(client_python, settings, "retention_setup", queue, tmp_path)
    assert r == {"keep": {"retentionEnabled": False, "retentionSeconds": 3}, "wait": 10}
    for name in (f"{queue}-keep", f"{queue}-wait"):
        await age_messages(db, name, 60)
    async with open_broker(settings) as broker:  # the periodic pass, run once now
        outcome = await broker.run_retention_pass()
    assert outcome.evicted_messages >= 2
    r = await run_flow(client_python, settings, "retention_check", queue, tmp_path)
    assert r == {"keep": [{"n": 1}, {"n": 2}], "wait": []}


async def test_admin_api_answers_every_read_of_the_clients_admin(flow: Any, queue: str) -> None:
    r = await flow("admin")
    assert r["listed"] == [[queue, 1, 3]]
    assert r["queue"] == [queue, ["Default"], 3]
    assert f"ns-{queue}" in r["namespaces"]
    assert r["messages"] == ["a2", "a1", "a0"]
    assert r["message"] == {"n": 1} and r["deleted"] is True
    assert r["queue_stats"] == [queue] and r["queue_detail"] == queue
    # a0 leased and a2 count; a1 was deleted, and lag counts stored messages only
    assert r["group_lag"] == [2] and r["group_partitions"] == [2] and r["lagging"] is True
    for key in ("tasks", "overview_queues", "status", "analytics", "refresh"):
        assert r[key] is True, key
    assert r["system_metrics"] and r["worker_metrics"]

"""``queen import``: an original-shaped database (tests/original_db.py) imported by the real
command in a child process, then read back through this broker's HTTP API."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from queen import open_broker
from queen.cipher import PayloadCipher
from queen.http.app import create_app
from queen.migrate.payloads import OriginalPayloadUnreadable, open_original, stored_payload
from queen.migrate.progress import PlainProgress, RichProgress, progress_for
from queen.migrate.run import KILL_AFTER_BATCHES_ENV
from queen.settings import Settings
from tests.conftest import scratch_database
from tests.consuming import Api
from tests.original_db import QUEUE_MODE, OriginalDb, seal_as_original

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def new_database(pg_url: str) -> Iterator[Any]:
    """Make new databases (``new_database(prefix)``: its conninfo), dropped afterwards."""
    with contextlib.ExitStack() as made:
        yield lambda prefix: made.enter_context(scratch_database(pg_url, prefix))


async def run_import(
    source: str, target: str, *args: str, env: dict[str, str] | None = None
) -> trio.CompletedProcess[bytes]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PG_", "QUEEN_"))}
    environ.update({"DATABASE_URL": target, "PYTHONPATH": str(ROOT)}, **(env or {}))
    return await trio.run_process(
        [sys.executable, "-m", "queen.cli", "import", "--from", source, *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=environ,
        cwd=str(ROOT),
    )


def rows(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture
def broker_api(tmp_path: Path) -> Any:
    """``async with broker_api(url) as api``: a broker on that database and its API (as the
    official client calls it)."""

    @asynccontextmanager
    async def open_on(url: str) -> AsyncIterator[Api]:
        settings = Settings(database_url=url, file_buffer_dir=str(tmp_path / "spool"))
        async with open_broker(settings) as broker:
            yield Api(create_app(broker).test_client())

    return open_on


def fill(src: str) -> tuple[OriginalDb, dict[str, Any]]:
    """Two queues with options, several partitions and pushes; queue mode and two groups
    part-consumed, a live lease, a group subscribed `new`, dead letters."""
    o = OriginalDb(src)
    o.create_schema()
    o.queue(
        "orders",
        namespace="shop",
        task="fulfil",
        priority=7,
        lease_time=120,
        retry_limit=2,
        retry_delay=500,
        ttl=7200,
        dead_letter_queue=True,
        dlq_after_max_retries=True,
        delayed_processing=0,
        window_buffer=0,
        retention_seconds=86400,
        completed_retention_seconds=3600,
        retention_enabled=True,
        max_wait_time_seconds=60,
        max_queue_size=0,
    )
    o.queue("audit")
    for push in range(6):
        for p in ("p0", "p1", "p2"):
            o.push(
                "orders",
                p,
                [{"p": p, "n": push * 5 + i} for i in range(5)],
                producer_sub="svc-a",
                traced=True,
            )
        o.push("audit", "Default", [{"a": push * 3 + i} for i in range(3)])
    late_at = o.subscribe_new("orders", "late")
    for p in ("p0", "p1", "p2"):
        o.push("orders", p, [{"p": p, "n": 30 + i} for i in range(4)])
    # Queue mode: p0 acked 12; p1 acked 7, then a pop leased 3 more (not acked); p2 untouched.
    o.ack_through("orders", "p0", QUEUE_MODE, 12)
    o.ack_through("orders", "p1", QUEUE_MODE, 7)
    o.lease("orders", "p1", QUEUE_MODE, 3, retries=1)
    # billing: p0 done entirely; p1: 3 acked, the 4th dead-lettered; p2 never consumed.
    o.ack_through("orders", "p0", "billing", 34)
    dead = o.dead_letter("orders", "p1", "billing", 3, "card declined")
    # audit: queue mode acked 5, and message 5 dead-lettered there.
    dead_audit = o.dead_letter("audit", "Default", QUEUE_MODE, 5, "bad record")
    return o, {"late_at": late_at, "dead": dead, "dead_audit": dead_audit}


async def pop_all(api: Api, queue: str, partition: str, group: str | None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"batch": 1000}
    if group is not None:
        params["consumerGroup"] = group
    return await api.messages(queue, partition, **params)


async def test_import_resumes_every_group_where_it_was(new_database: Any, broker_api: Any) -> None:
    src, dst = new_database("orig"), new_database("ours")
    o, facts = fill(src)
    done = await run_import(src, dst, "--batch-size", "7")
    assert done.returncode == 0, done.stderr.decode()
    report = done.stdout.decode()
    assert "imported 120 messages of 2 queues" in report
    progress = done.stderr.decode().splitlines()
    assert "queen import: importing 120 messages" in progress
    assert "queen import: orders/p2: 34 messages (120/120)" in progress

    async with broker_api(dst) as api:
        order = {p: o.ordered("orders", p) for p in ("p0", "p1", "p2")}
        # Queue mode: where it stood, the leased messages delivered again.
        got = await pop_all(api, "orders", "p0", None)
        assert [m["id"] for m in got] == order["p0"][12:]
        got = await pop_all(api, "orders", "p1", None)
        assert [m["id"] for m in got] == order["p1"][7:]
        got = await pop_all(api, "orders", "p2", None)
        assert [m["id"] for m in got] == order["p2"]
        # billing: nothing left on p0; p1 after the dead letter; p2 from the beginning.
        assert await pop_all(api, "orders", "p0", "billing") == []
        got = await pop_all(api, "orders", "p1", "billing")
        assert [m["id"] for m in got] == order["p1"][4:]
        got = await pop_all(api, "orders", "p2", "billing")
        assert [m["id"] for m in got] == order["p2"]
        # late (subscribed new): only what was pushed after its subscription, on every partition.
        for p in ("p0", "p1", "p2"):
            got = await pop_all(api, "orders", p, "late")
            assert [m["id"] for m in got] == order[p][30:], p
        # A group the original never saw starts as its own subscription says.
        got = await pop_all(api, "orders", "p2", "newcomer")
        assert len(got) == 34

        # The messages themselves: ids, transaction ids, payloads, producers, traces, times.
        source = {
            r[0]: r[1:]
            for r in rows(
                src,
                """SELECT id::text, transaction_id, payload::text, producer_sub, trace_id::text,
                          created_at FROM queen.messages""",
            )
        }
        got = await pop_all(api, "orders", "p2", "audit-check")
        for m in got:
            tx, payload, sub, trace, created = source[m["id"]]
            assert m["transactionId"] == tx
            assert m["data"] == json.loads(payload)
            assert m["producerSub"] == sub
            assert m["traceId"] == trace
            assert m["createdAt"][:19] == created.strftime("%Y-%m-%dT%H:%M:%S")

        # Options.
        (opts,) = rows(
            dst,
            """SELECT namespace, task, priority, lease_time_s, retry_limit, retry_delay_ms, ttl_s,
                      dead_letter_queue, dlq_after_max_retries, retention_s,
                      completed_retention_s, retention_enabled, max_wait_time_s,
                      encryption_enabled, dedup_window_seconds
               FROM queen.queues WHERE name = 'orders'""",
        )
        assert opts == (
            "shop",
            "fulfil",
            7,
            120,
            2,
            500,
            7200,
            True,
            True,
            86400,
            3600,
            True,
            60,
            False,
            3600,
        )
        # The failed batch's retry count is kept at the queue-mode cursor of p1.
        assert rows(
            dst,
            """SELECT f.attempts, f.msg_offset FROM queen.failures f
               JOIN queen.partitions p ON p.id = f.partition_id WHERE p.name = 'p1'""",
        ) == [(1, 7)]

        # The dead letters, with their messages.
        status, body = await api.get("/api/v1/dlq?queue=orders")
        assert status == 200, body
        (letter,) = body["messages"]
        assert letter["id"] == facts["dead"]
        assert letter["consumerGroup"] == "billing"
        assert letter["errorMessage"] == "card declined"
        status, body = await api.get("/api/v1/dlq?queue=audit")
        assert [m["id"] for m in body["messages"]] == [facts["dead_audit"]]
        got = await pop_all(api, "audit", "Default", None)
        assert [m["id"] for m in got] == o.ordered("audit", "Default")[6:]

        # Dedup: a producer retrying an original send gets `duplicate`.
        tx = source[order["p2"][0]][0]
        status, body = await api.post(
            "/api/v1/push",
            {"items": [{"queue": "orders", "partition": "p2", "payload": 1, "transactionId": tx}]},
        )
        assert status == 201 and body[0]["status"] == "duplicate", body
        assert body[0]["message_id"] == order["p2"][0]


async def test_a_second_run_imports_nothing_twice(new_database: Any, broker_api: Any) -> None:
    src, dst = new_database("orig"), new_database("ours")
    o, _ = fill(src)
    first = await run_import(src, dst)
    assert first.returncode == 0, first.stderr.decode()
    counted = """SELECT (SELECT sum(last_offset - first_offset + 1) FROM queen.segments),
                        (SELECT count(*) FROM queen.dlq), (SELECT count(*) FROM queen.cursors),
                        (SELECT count(*) FROM queen.queues),
                        (SELECT count(*) FROM queen.partitions)"""
    before = rows(dst, counted)
    again = await run_import(src, dst)
    assert again.returncode == 0, again.stderr.decode()
    assert "imported 0 messages" in again.stdout.decode()
    assert "0 cursors written" in again.stdout.decode()
    assert rows(dst, counted) == before

    # New messages on the original since: a third run brings those alone, after the others,
    # and moves cursors the broker has not touched; a cursor this broker moved stays.
    async with broker_api(dst) as api:
        got = await pop_all(api, "orders", "p2", "billing")
        assert got
        acked = await api.ack_batch(got[:2], group="billing")
        assert all(a["success"] for a in acked), acked
        o.push("orders", "p0", [{"late": 1}, {"late": 2}])
        o.ack_through("orders", "p0", QUEUE_MODE, 13)
        third = await run_import(src, dst)
        assert third.returncode == 0, third.stderr.decode()
        assert "imported 2 messages" in third.stdout.decode()
        got = await pop_all(api, "orders", "p0", None)
        assert [m["id"] for m in got] == o.ordered("orders", "p0")[13:]
        (billing_p2,) = rows(
            dst,
            """SELECT c.next_offset FROM queen.cursors c JOIN queen.partitions p
               ON p.id = c.partition_id WHERE p.name = 'p2' AND c.consumer_group = 'billing'""",
        )
        assert billing_p2 == (2,)


async def test_a_catch_up_import_skips_partitions_served_here_and_imports_the_rest(
    new_database: Any, broker_api: Any
) -> None:
    """After the switch, producers pushed to p1 here. The original meanwhile got more on p0
    and p1 (and a new partition p3, which was pushed here too): the dry run and the import
    bring p0's alone, say why p1 and p3 are left, and exit 0; p1 keeps exactly what it had."""
    src, dst = new_database("orig"), new_database("ours")
    o, _ = fill(src)
    first = await run_import(src, dst)
    assert first.returncode == 0, first.stderr.decode()
    async with broker_api(dst) as api:
        for partition in ("p1", "p3"):
            status, body = await api.post(
                "/api/v1/push",
                {"items": [{"queue": "orders", "partition": partition, "payload": {"here": 1}}]},
            )
            assert status == 201 and body[0]["status"] == "queued", body
    p1_here = rows(
        dst,
        """SELECT p.next_offset FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
           WHERE q.name = 'orders' AND p.name = 'p1'""",
    )
    o.push("orders", "p0", [{"late": 1}, {"late": 2}])
    o.push("orders", "p1", [{"late": 3}])
    o.push("orders", "p3", [{"late": 4}])

    dry = await run_import(src, dst, "--dry-run")
    assert dry.returncode == 0, dry.stderr.decode()
    out = dry.stdout.decode()
    assert "orders/p1: skipped, 1 messages not imported" in out, out
    assert "orders/p3: skipped, 1 messages not imported" in out, out

    caught_up = await run_import(src, dst)
    assert caught_up.returncode == 0, caught_up.stderr.decode()
    out = caught_up.stdout.decode()
    assert "imported 2 messages" in out, out
    assert "orders/p1: skipped" in out and "orders/p3: skipped" in out, out
    assert (
        rows(
            dst,
            """SELECT p.next_offset FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
           WHERE q.name = 'orders' AND p.name = 'p1'""",
        )
        == p1_here
    )
    async with broker_api(dst) as api:
        got = await pop_all(api, "orders", "p0", None)
        assert [m["id"] for m in got] == o.ordered("orders", "p0")[12:]


async def test_killed_mid_import_resumes_with_every_message_once_in_order(
    new_database: Any, broker_api: Any
) -> None:
    src, dst = new_database("orig"), new_database("ours")
    o, _ = fill(src)
    killed = await run_import(src, dst, "--batch-size", "5", env={KILL_AFTER_BATCHES_ENV: "6"})
    assert killed.returncode == -signal.SIGKILL
    (stored,) = rows(
        dst, "SELECT coalesce(sum(last_offset - first_offset + 1), 0) FROM queen.segments"
    )
    # audit (18 messages: batches of 5, 5, 5, 3), then two whole batches of orders/p0.
    assert stored == (28,)
    assert rows(dst, "SELECT count(*) FROM queen.cursors") == [(0,)]  # positions come last

    done = await run_import(src, dst, "--batch-size", "5")
    assert done.returncode == 0, done.stderr.decode()
    for queue, parts in (("orders", ("p0", "p1", "p2")), ("audit", ("Default",))):
        for p in parts:
            ids = [
                r[0]
                for r in rows(
                    dst,
                    """SELECT u.mid::text FROM queen.segments s
                       JOIN queen.partitions p ON p.id = s.partition_id
                       JOIN queen.queues q ON q.id = p.queue_id
                       CROSS JOIN LATERAL unnest(s.message_ids) WITH ORDINALITY AS u (mid, i)
                       WHERE q.name = %s AND p.name = %s ORDER BY s.first_offset, u.i""",
                    queue,
                    p,
                )
            ]
            assert ids == o.ordered(queue, p), (queue, p)
    async with broker_api(dst) as api:
        got = await pop_all(api, "orders", "p1", None)
        assert [m["id"] for m in got] == o.ordered("orders", "p1")[7:]


def test_ctrl_c_stops_an_import_at_once_and_the_next_run_continues(new_database: Any) -> None:
    """Ctrl-C (SIGINT to the foreground process group) in the middle of the copy: the import
    stops after the batch being written, says so without a traceback, exits 130, and keeps
    what it wrote; the next run imports the rest, every message once and in order."""
    src, dst = new_database("orig"), new_database("ours")
    o = OriginalDb(src)
    o.create_schema()
    o.queue("big")
    total = 3000
    for push in range(total // 500):
        o.push("big", "Default", [{"n": push * 500 + i} for i in range(500)])
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PG_", "QUEEN_"))}
    environ.update({"DATABASE_URL": dst, "PYTHONPATH": str(ROOT)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "queen.cli", "import", "--from", src, "--batch-size", "1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
        cwd=str(ROOT),
        start_new_session=True,  # its own group, as a shell gives a foreground job
    )
    stored_sql = "SELECT coalesce(sum(last_offset - first_offset + 1), 0) FROM queen.segments"
    try:
        deadline = time.monotonic() + 60
        started = False
        while not started and time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(psycopg.Error):  # no schema yet
                started = rows(dst, stored_sql)[0][0] >= 10
            time.sleep(0.02)
        assert started, "the copy did not start"
        os.killpg(proc.pid, signal.SIGINT)
        pressed = time.monotonic()
        out, err = proc.communicate(timeout=30)
        stopped_s = time.monotonic() - pressed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "run it again to continue where it stopped" in text
    assert out == b""  # no report: it did not finish
    assert stopped_s < 5, stopped_s
    ((stored,),) = rows(dst, stored_sql)
    assert 10 <= stored < total  # stopped part way, and kept what it wrote
    assert f"{stored} messages were imported by this run" in text
    assert rows(dst, "SELECT count(*) FROM queen.cursors") == [(0,)]  # positions come last

    done = subprocess.run(
        [sys.executable, "-m", "queen.cli", "import", "--from", src, "--batch-size", "500"],
        capture_output=True,
        env=environ,
        cwd=str(ROOT),
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    ids = [
        r[0]
        for r in rows(
            dst,
            """SELECT u.mid::text FROM queen.segments s
               CROSS JOIN LATERAL unnest(s.message_ids) WITH ORDINALITY AS u (mid, i)
               ORDER BY s.first_offset, u.i""",
        )
    ]
    assert ids == o.ordered("big", "Default")


async def test_dry_run_reports_and_writes_nothing(new_database: Any) -> None:
    src, dst = new_database("orig"), new_database("ours")
    fill(src)
    done = await run_import(src, dst, "--dry-run")
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    orders = next(line for line in lines if line.startswith("orders"))
    assert orders.split()[:8] == ["orders", "3", "102", "0", "102", "2", "yes", "1"]
    assert "dry run: would import 120 messages" in done.stdout.decode()
    assert rows(dst, "SELECT count(*) FROM pg_namespace WHERE nspname = 'queen'") == [(0,)]


async def test_bad_sources_are_refused_in_one_line(new_database: Any) -> None:
    src, dst, empty = new_database("orig"), new_database("ours"), new_database("empty")
    fill(src)

    not_original = await run_import(empty, dst)
    assert not_original.returncode == 2
    err = not_original.stderr.decode().strip()
    assert err.count("\n") == 0 and "not an original Queen database" in err

    same = await run_import(src, src)
    assert same.returncode == 2
    assert "is the database this broker is configured for" in same.stderr.decode()
    assert rows(src, "SELECT to_regclass('queen.segments') IS NULL") == [(True,)]

    ours = await run_import(src, dst)
    assert ours.returncode == 0
    ours_as_source = await run_import(dst, empty)
    assert ours_as_source.returncode == 2
    assert "Queen on Trio database" in ours_as_source.stderr.decode()

    theirs = new_database("theirs")
    OriginalDb(theirs).create_schema()
    into_original = await run_import(src, theirs)
    assert into_original.returncode == 2
    assert "the target database cannot be used" in into_original.stderr.decode()
    assert rows(theirs, "SELECT to_regclass('queen.segments') IS NULL") == [(True,)]

    unreachable = await run_import("postgresql://nobody@127.0.0.1:1/none", dst)
    assert unreachable.returncode == 2
    assert "cannot connect to --from" in unreachable.stderr.decode()


async def test_a_queue_of_the_same_name_already_here_is_refused(
    new_database: Any, broker_api: Any
) -> None:
    src, dst = new_database("orig"), new_database("ours")
    fill(src)
    async with broker_api(dst) as api:
        await api.push("audit", "Default", {"mine": True})
        refused = await run_import(src, dst)
        assert refused.returncode == 2
        assert "already exist in the target" in refused.stderr.decode()
        assert "audit" in refused.stderr.decode()
        assert rows(dst, "SELECT count(*) FROM queen.queues") == [(1,)]


KEY_HEX = "11" * 32


def test_an_original_envelope_opens_with_its_key_only() -> None:
    key = bytes.fromhex(KEY_HEX)
    sealed = seal_as_original('{"card":"4242"}', key)
    assert open_original(sealed, key, "m1") == '{"card":"4242"}'
    with pytest.raises(OriginalPayloadUnreadable, match="set QUEEN_ENCRYPTION_KEY"):
        open_original(sealed, None, "m1")
    with pytest.raises(OriginalPayloadUnreadable, match="does not open"):
        open_original(sealed, bytes.fromhex("22" * 32), "m1")
    # Sealed again for this broker, bound to the message id.
    cipher = PayloadCipher(key)
    stored = stored_payload(
        sealed, encrypted=True, message_id=str(uuid.uuid4()), original_key=key, cipher=cipher
    )
    assert stored.startswith('"\\/qenc1:')


async def test_encrypted_messages_are_opened_and_sealed_again(
    new_database: Any, tmp_path: Path
) -> None:
    src, dst = new_database("orig"), new_database("ours")
    o = OriginalDb(src)
    o.create_schema()
    o.queue("secrets", encryption_enabled=True)
    key = bytes.fromhex(KEY_HEX)
    o.push("secrets", "Default", [{"card": "4242"}, {"card": "1881"}], key=key)

    refused = await run_import(src, dst)
    assert refused.returncode == 2
    assert "2 messages are stored encrypted; set QUEEN_ENCRYPTION_KEY" in refused.stderr.decode()

    done = await run_import(src, dst, env={"QUEEN_ENCRYPTION_KEY": KEY_HEX})
    assert done.returncode == 0, done.stderr.decode()
    stored = [r[0] for r in rows(dst, "SELECT unnest(payloads) FROM queen.segments")]
    assert stored and all(s.startswith('"\\/qenc1:') for s in stored)
    settings = Settings(
        database_url=dst, file_buffer_dir=str(tmp_path / "spool"), encryption_key=KEY_HEX
    )
    async with open_broker(settings) as broker:
        api = Api(create_app(broker).test_client())
        got = await pop_all(api, "secrets", "Default", None)
    assert [m["data"] for m in got] == [{"card": "4242"}, {"card": "1881"}]


async def test_values_holding_the_column_separator_are_stored_exactly(new_database: Any) -> None:
    src, dst = new_database("orig"), new_database("ours")
    o = OriginalDb(src)
    o.create_schema()
    o.queue("odd")
    tx = ["plain", "with\x1fseparator"]
    o.push("odd", "Default", [{"s": "a\u001fb"}, "two"], transaction_ids=tx, producer_sub="x\x1fy")
    done = await run_import(src, dst)
    assert done.returncode == 0, done.stderr.decode()
    stored = rows(
        dst,
        """SELECT u.tx, u.payload, u.sub FROM queen.segments s
           CROSS JOIN LATERAL unnest(s.transaction_ids, s.payloads, s.producer_subs)
                WITH ORDINALITY AS u (tx, payload, sub, i)
           ORDER BY s.first_offset, u.i""",
    )
    assert [(r[0], json.loads(r[1]), r[2]) for r in stored] == [
        ("plain", {"s": "a\x1fb"}, "x\x1fy"),
        ("with\x1fseparator", "two", "x\x1fy"),
    ]


def test_progress_on_a_terminal_is_a_bar() -> None:
    stream = io.StringIO()
    bar = RichProgress(stream)
    bar.start(10)
    bar.advance("orders/p0", 4)
    bar.advance("orders/p1", 6)
    bar.finish()
    assert "10/10" in stream.getvalue()
    assert isinstance(progress_for(io.StringIO()), PlainProgress)  # not a terminal

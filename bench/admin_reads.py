"""How long the admin API takes on a big queue: 10,000 partitions and 1,000,000 messages.

    python -m bench.admin_reads [--partitions 10000] [--messages-per-partition 100]
                                [--segments-per-partition 10] [--runs 5] [--database-url URL]

The queue is written straight into the tables in the layout the push path produces (segments
of consecutive offsets, one dedup sidecar row per message), which takes seconds instead of the
minutes a million pushes would: queue mode has consumed half of every partition and holds a live
lease on one partition in ten, a named group is 10 messages behind everywhere (both have
looked at every partition, and hold the cursor mark a pop leaves), and 1,000 messages are in
the DLQ. Every admin read is then called through the app (in process, no
socket) once to warm up and ``--runs`` times; the table gives the median and the slowest.
It starts its own embedded PostgreSQL unless ``--database-url`` is given.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import trio

from queen import open_broker
from queen.http.app import create_app
from queen.settings import Settings
from queen.storage.embedded import EmbeddedPostgres

QUEUE = "bench-admin"
GROUP = "g-bench"

FILL = """
DELETE FROM queen.queues WHERE name = %(queue)s;
WITH q AS (INSERT INTO queen.queues (name, namespace, task) VALUES (%(queue)s, 'bench', 'reads')
           RETURNING id)
INSERT INTO queen.partitions (queue_id, name, next_offset)
SELECT q.id, 'p' || lpad(i::text, 5, '0'), %(per)s FROM q, generate_series(1, %(parts)s) i;

INSERT INTO queen.segments (partition_id, first_offset, last_offset, created_at, message_ids,
                            transaction_ids, payloads)
SELECT p.id, s * %(seg)s, s * %(seg)s + %(seg)s - 1,
       now() - make_interval(secs => (%(segs)s - s) * 60 + p.id %% 60),
       ARRAY(SELECT gen_random_uuid() FROM generate_series(1, %(seg)s)),
       ARRAY(SELECT 'tx-' || p.id || '-' || (s * %(seg)s + k)
             FROM generate_series(0, %(seg)s - 1) k),
       ARRAY(SELECT '{"order":' || (s * %(seg)s + k) || ',"pad":"' || repeat('x', 60) || '"}'
             FROM generate_series(0, %(seg)s - 1) k)
FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id AND q.name = %(queue)s
CROSS JOIN generate_series(0, %(segs)s - 1) s;

INSERT INTO queen.dedup (key_hash, partition_id, transaction_id, msg_offset)
SELECT hashtextextended(t.txid, s.partition_id), s.partition_id, t.txid, s.first_offset + t.i - 1
FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id
JOIN queen.queues q ON q.id = p.queue_id AND q.name = %(queue)s
CROSS JOIN LATERAL unnest(s.transaction_ids) WITH ORDINALITY t (txid, i);

INSERT INTO queen.cursors (partition_id, consumer_group, queue_id, next_offset, lease_id,
                           lease_end, lease_expires_at, delivered_at)
SELECT p.id, '__QUEUE_MODE__', p.queue_id, %(per)s / 2,
       CASE WHEN p.id %% 10 = 0 THEN gen_random_uuid() END,
       CASE WHEN p.id %% 10 = 0 THEN %(per)s / 2 + 5 END,
       CASE WHEN p.id %% 10 = 0 THEN now() + interval '1 hour' END, now()
FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id AND q.name = %(queue)s
UNION ALL
SELECT p.id, %(group)s, p.queue_id, %(per)s - 10, NULL, NULL, NULL, now()
FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id AND q.name = %(queue)s;

INSERT INTO queen.consumer_groups (queue_id, consumer_group, subscription_mode)
SELECT q.id, %(group)s, 'all' FROM queen.queues q WHERE q.name = %(queue)s;

-- (the fill is one transaction: the mark is just past it, as a later look would leave it)
INSERT INTO queen.cursor_marks (queue_id, consumer_group, covered)
SELECT q.id, g.name, (pg_current_xact_id()::text::bigint + 1)::text::xid8
FROM queen.queues q CROSS JOIN (VALUES ('__QUEUE_MODE__'), (%(group)s)) g (name)
WHERE q.name = %(queue)s;

INSERT INTO queen.dlq (queue_id, partition_id, consumer_group, msg_offset, message_id,
                       transaction_id, payload, error_message, retry_count)
SELECT p.queue_id, p.id, '__QUEUE_MODE__', 0, gen_random_uuid(), 'tx-' || p.id || '-0', '{}',
       'bench failure', 3
FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id AND q.name = %(queue)s
ORDER BY p.id LIMIT 1000;
"""


def fill(url: str, parts: int, per: int, segs: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET jit = off")
        values = {
            "queue": QUEUE,
            "group": GROUP,
            "parts": parts,
            "per": per,
            "segs": segs,
            "seg": per // segs,
        }
        with conn.transaction():
            for statement in FILL.split(";\n"):
                if statement.strip():
                    conn.execute(statement, values)  # type: ignore[call-overload]
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


async def measure(url: str, spool: str, runs: int) -> list[tuple[str, float, float, int]]:
    settings = Settings(database_url=url, file_buffer_dir=spool)
    rows: list[tuple[str, float, float, int]] = []
    async with open_broker(settings) as broker:
        client = create_app(broker).test_client()
        first = await (await client.get(f"/api/v1/status/queues/{QUEUE}?limit=1")).get_json()
        pid = first["partitions"][0]["id"]
        paths = [
            "/api/v1/resources/queues",
            f"/api/v1/resources/queues/{QUEUE}",
            f"/api/v1/status/queues/{QUEUE}",
            "/api/v1/resources/overview",
            "/api/v1/resources/namespaces",
            "/api/v1/status",
            f"/api/v1/messages?queue={QUEUE}&limit=50",
            f"/api/v1/messages?queue={QUEUE}&limit=50&offset=950",
            f"/api/v1/messages?queue={QUEUE}&status=pending&limit=50",
            f"/api/v1/messages?queue={QUEUE}&partition=p00042&limit=50",
            f"/api/v1/messages/{pid}/tx-{pid}-77",
            "/api/v1/consumer-groups",
            f"/api/v1/consumer-groups/{GROUP}",
            "/api/v1/consumer-groups/lagging?minLagSeconds=0",
            "/api/v1/analytics/queue-lag",
            "/metrics/prometheus",
            "/dashboard/view/overview",
            f"/dashboard/view/queue/{QUEUE}",
            f"/dashboard/view/messages?queue={QUEUE}",
            f"/dashboard/view/queue/{QUEUE}?sort=pending",
            f"/dashboard/view/queue/{QUEUE}?sort=oldest",
            f"/dashboard/view/queue/{QUEUE}?sort=lease",
            f"/dashboard/view/group/{GROUP}",
            "/dashboard/view/groups",
            f"/api/v1/messages?queue={QUEUE}&transactionId=tx-{pid}-77",
            f"/api/v1/messages?queue={QUEUE}&transactionId=not-there",
        ]
        for path in paths:
            times: list[float] = []
            size = 0
            for _ in range(runs + 1):
                started = time.perf_counter()
                resp = await client.get(path)
                body: Any = await resp.get_data()
                times.append((time.perf_counter() - started) * 1000)
                if resp.status_code != 200:
                    raise RuntimeError(f"{path}: {resp.status_code} {body[:200]!r}")
                size = len(body)
            rows.append((path, statistics.median(times[1:]), max(times[1:]), size))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--messages-per-partition", type=int, default=100)
    ap.add_argument("--segments-per-partition", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--database-url")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="queen-bench-"))
    server = None
    try:
        url = args.database_url
        if url is None:
            server = EmbeddedPostgres(scratch / "pg")
            url = server.start()
        with psycopg.connect(url, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        # The schema first: a broker opened once creates it.
        trio.run(_migrate, url, str(scratch / "spool"))
        took = fill(url, args.partitions, args.messages_per_partition, args.segments_per_partition)
        total = args.partitions * args.messages_per_partition
        print(
            f"PostgreSQL {version[0] if version else '?'}: {args.partitions:,} partitions, "
            f"{total:,} messages in {args.partitions * args.segments_per_partition:,} segments,"
            f" filled in {took:.1f} s; {args.runs} runs per call after one warm-up"
        )
        rows = trio.run(measure, url, str(scratch / "spool"), args.runs)
        print("| call | median ms | slowest ms | answer bytes |")
        print("|---|--:|--:|--:|")
        for path, median, slowest, size in rows:
            print(f"| `GET {path}` | {median:.1f} | {slowest:.1f} | {size:,} |")
    finally:
        if server is not None:
            server.stop("fast")
        shutil.rmtree(scratch, ignore_errors=True)


async def _migrate(url: str, spool: str) -> None:
    async with open_broker(Settings(database_url=url, file_buffer_dir=spool)):
        pass


if __name__ == "__main__":
    main()

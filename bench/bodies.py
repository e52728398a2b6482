"""Memory under big bodies: peak RSS of a ``queen serve`` process taking N bodies at once.

    python -m bench.bodies --bodies 1,4,8          # bodies just under QUEEN_MAX_BODY_BYTES

For each N a fresh broker process is started (so its high-water mark belongs to this run), N
clients each send one push body of ``--body-bytes`` (default: just under the body limit,
~1 KiB JSON payloads over 16 partitions) at the same moment, and a body answered 503 is sent
again after its ``Retry-After``. Reported per N: the process's peak RSS (``VmHWM``), its RSS
once every body is stored, the 503 answers, and the wall time until every body was stored.
Uses ``DATABASE_URL`` or starts an embedded PostgreSQL; the run's queues are deleted
afterwards. ``QUEEN_*`` variables reach the broker (e.g. ``QUEEN_MAX_DECODING_BYTES``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import trio

from bench import procfs
from bench.servers import drop_queues, open_database, start_broker
from queen.settings import Settings

MIB = 1024 * 1024


def make_body(queue: str, size: int) -> bytes:
    """A push body of at most ``size`` bytes: ~1 KiB object payloads over 16 partitions."""
    text = "x" * 1000
    head, tail = b'{"items": [', b"]}"
    items: list[bytes] = []
    total = len(head) + len(tail)
    i = 0
    while True:
        item = orjson.dumps(
            {"queue": queue, "partition": f"p{i % 16}", "payload": {"i": i, "text": text}}
        )
        if total + len(item) + 1 > size:
            break
        items.append(item)
        total += len(item) + 1
        i += 1
    return head + b",".join(items) + tail


async def send_all(base: str, body: bytes, count: int) -> tuple[int, int]:
    """Send ``count`` copies of ``body`` at once; (items stored, 503 answers)."""
    stored = refused = 0

    async def one() -> None:
        nonlocal stored, refused
        async with httpx.AsyncClient(base_url=base, timeout=600) as http:
            while True:
                answer = await http.post(
                    "/api/v1/push", content=body, headers={"content-type": "application/json"}
                )
                if answer.status_code == 503:
                    refused += 1
                    await trio.sleep(float(answer.headers.get("retry-after", "1")))
                    continue
                answer.raise_for_status()
                stored += sum(1 for r in answer.json() if r["status"] == "queued")
                return

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return stored, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", default="1,4,8", help="concurrent bodies, per run")
    parser.add_argument("--body-bytes", type=int, default=0, help="default: the body limit")
    args = parser.parse_args()
    settings = Settings.from_env()
    size = args.body_bytes or settings.max_body_bytes
    prefix = f"bodies-{time.time_ns()}"
    with tempfile.TemporaryDirectory(prefix="queen-bodies-") as tmp:
        workdir = Path(tmp)
        with open_database(os.environ.get("DATABASE_URL"), workdir) as db:
            print(f"database: {db.description}; body limit {settings.max_body_bytes} bytes")
            print("bodies  body MiB  items/body  peak RSS MiB  RSS after MiB  503s  seconds")
            try:
                for count in (int(n) for n in args.bodies.split(",")):
                    queue = f"{prefix}-{count}"
                    body = make_body(queue, size)
                    items = body.count(b'"partition"')
                    server = start_broker(db, workers=1, workdir=workdir, name=f"n{count}")
                    try:
                        server.wait_ready()
                        started = time.perf_counter()
                        stored, refused = trio.run(send_all, server.base_url, body, count)
                        elapsed = time.perf_counter() - started
                        peak = procfs.tree_rss_bytes(server.pids, peak=True)
                        after = procfs.tree_rss_bytes(server.pids)
                    finally:
                        server.stop()
                    assert stored == count * items, (stored, count * items)
                    print(
                        f"{count:>6}  {len(body) / MIB:>8.1f}  {items:>10}  {peak / MIB:>12.0f}"
                        f"  {after / MIB:>13.0f}  {refused:>4}  {elapsed:>7.1f}"
                    )
            finally:
                drop_queues(db, prefix)


if __name__ == "__main__":
    main()

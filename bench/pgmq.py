"""Beside PGMQ: ``broker.push()`` in process against PGMQ's ``send``/``send_batch`` on one new
PostgreSQL, alternating by round (``python -m bench.pgmq --pgmq-sql FILE``; docs/benchmark.md).
Ours is :mod:`bench.inproc`'s E step, PGMQ's :func:`_drive`, each a process of its own."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import servers
from bench.inproc import in_process, item, percentiles
from bench.report import _n, table
from bench.runner import describe_machine, head, new_run_id, scratch
from bench.scenarios import EMBEDDED, Load, pick
from bench.servers import ROOT, Meter, per_100k

TARGETS = {1: 3.0, 10: 1.5}  # items per call: ours ÷ PGMQ, msg/s and CPU per message
NO_DEDUP = "ours-nodedup"  # the side whose queue has no dedup window, as PGMQ's queues
STEP_LIMIT_S = 300.0


def queue_name(shape: str) -> str:
    return f"qbench_{shape.lower()}"


async def _drive(args: argparse.Namespace, load: Load) -> dict[str, Any]:
    """PGMQ's side of a step (docs/benchmark.md, "Beside PGMQ")."""
    import psycopg
    from psycopg.types.json import Jsonb

    queue = queue_name(args.drive)
    batch = load.items > 1
    call = "SELECT pgmq.send_batch(%s, %s)" if batch else "SELECT pgmq.send(%s, %s)"
    measuring, done, counter = False, 0, 0
    latencies: list[float] = []

    async def sender(conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal done, counter
        while True:
            first, counter = counter, counter + load.items
            msgs = [Jsonb(item(queue, 1, n, "")["payload"]) for n in range(first, counter)]
            t0 = time.perf_counter()
            cur = await conn.execute(call, (queue, msgs if batch else msgs[0]))
            ids = await cur.fetchall()
            if measuring:
                latencies.append((time.perf_counter() - t0) * 1000)
                done += len(ids)

    conns = [
        await psycopg.AsyncConnection.connect(args.database_url, autocommit=True)
        for _ in range(load.connections)
    ]
    tasks = [asyncio.create_task(sender(c)) for c in conns]
    await asyncio.sleep(args.warmup)
    measuring, meter = True, Meter(args.db_pid)
    await asyncio.sleep(args.duration)
    measuring = False
    window = meter.stop()
    for task in tasks:
        task.cancel()
    ended = await asyncio.gather(*tasks, return_exceptions=True)
    for conn in conns:
        await conn.close()
    failures = [e for e in ended if isinstance(e, Exception)]  # not the cancellations
    if failures:
        raise failures[0]
    return {
        "items_per_request": load.items,
        "connections": load.connections,
        "requests": len(latencies),
        "msg_per_s": done / window["wall_s"],
        "latency_ms": percentiles(latencies),
        **per_100k(window, done),
    }


def _step(
    side: str, shape: str, db: servers.Database, args: argparse.Namespace, tag: str, logs: Path
) -> Any:
    module = ["bench.pgmq", "--drive", shape] if side == "pgmq" else ["bench.inproc", shape]
    options: dict[str, Any] = {"duration": args.duration, "warmup": args.warmup, "tag": tag}
    if side == NO_DEDUP:  # a queue of its own, made with the window 0
        options.update(dedup_window=0, queue_prefix="qbench-nodedup-")
    return in_process(module, db, logs / f"{side}.log", STEP_LIMIT_S, **options)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sql, run_id = args.pgmq_sql.read_bytes(), new_run_id()
    started, before = datetime.now(UTC), describe_machine()
    steps: list[dict[str, Any]] = []
    with (
        scratch("queen-bench-pgmq-", print) as workdir,
        servers.open_database(None, workdir, bin_dir=args.pg_bin) as db,
    ):
        with db.connect() as conn:  # PGMQ's SQL-only install, and a queue per shape
            conn.execute(sql)
            for shape in args.shapes:
                conn.execute("SELECT pgmq.create(%s)", (queue_name(shape),))
        sides = ["ours", "pgmq", *([NO_DEDUP] if args.without_dedup else [])]
        for r in range(1, args.rounds + 1):
            for shape in args.shapes:
                for side in sides if r % 2 else sides[::-1]:
                    # every step starts after a checkpoint: none falls inside its window
                    # (checkpoint_timeout), and the WAL files written before are there to reuse
                    with db.connect() as conn:
                        conn.execute("CHECKPOINT")
                    record = _step(side, shape, db, args, f"{run_id}-{shape}-{r}", workdir)
                    record.update(round=r, shape=shape, side=side)
                    steps.append(record)
                    print(" ".join(step_row(record)), flush=True)
    return {
        **head(run_id, started, before, ""),
        "database": db.describe(),
        "pgmq_sql": {"path": str(args.pgmq_sql), "sha256": hashlib.sha256(sql).hexdigest()[:12]},
        "shapes": {s: EMBEDDED[s].describe() for s in args.shapes},
        "steps": steps,
    }


def _total(r: Mapping[str, Any]) -> float | None:
    own, db = r.get("server_cpu_s_per_100k"), r.get("db_cpu_s_per_100k")
    return None if own is None or db is None else own + db


def step_row(r: Mapping[str, Any]) -> list[str]:
    lat = r.get("latency_ms") or {}
    figures = [(r.get("msg_per_s"), ",.0f"), (lat.get("p50"), ".1f"), (lat.get("p99"), ".1f")]
    figures += [(r.get(k), ".2f") for k in ("server_cpu_s_per_100k", "db_cpu_s_per_100k")]
    figures += [(_total(r), ".2f"), (r.get("other_cores"), ".2f")]
    return [str(r["round"]), r["shape"], r["side"], *(_n(v, spec) for v, spec in figures)]


def ratios(
    steps: Sequence[Mapping[str, Any]], shape: str, side: str = "ours"
) -> tuple[list[float], list[float]]:
    """Per round: ``side`` ÷ PGMQ in msg/s, and PGMQ's CPU per message ÷ ``side``'s (> 1:
    ours better)."""
    speed: list[float] = []
    cpu: list[float] = []
    for r in sorted({s["round"] for s in steps if s["shape"] == shape}):
        pair = {s["side"]: s for s in steps if s["shape"] == shape and s["round"] == r}
        ours, theirs = pair.get(side), pair.get("pgmq")
        if not ours or not theirs:
            continue
        if theirs.get("msg_per_s"):
            speed.append(ours["msg_per_s"] / theirs["msg_per_s"])
        a, b = _total(ours), _total(theirs)
        if a and b:
            cpu.append(b / a)
    return speed, cpu


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _held(values: Sequence[float], target: float | None) -> str:
    if target is None or not values:
        return "-"
    return "yes" if statistics.median(values) >= target else "no"


def _without_dedup(doc: Mapping[str, Any]) -> bool:
    """Whether the run had the side without a dedup window."""
    return any(s["side"] == NO_DEDUP for s in doc["steps"])


def summary_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    without = _without_dedup(doc)
    for shape in doc.get("shapes", {}):
        steps = [s for s in doc["steps"] if s["shape"] == shape]
        items = EMBEDDED[shape].load.items
        target = TARGETS.get(items)
        speed, cpu = ratios(steps, shape)
        medians = [
            _n(statistics.median([s["msg_per_s"] for s in steps if s["side"] == side] or [0]))
            for side in ("ours", "pgmq")
        ]
        judged = ["-" if target is None else f"{target:g}x", _held(speed, target)]
        rows.append([shape, str(items), *medians, _spread(speed), _spread(cpu), *judged])
        rows[-1].append(_held(cpu, target))
        if without:  # what the dedup sidecar costs, set beside a queue that has none
            rows[-1].append(_spread(ratios(steps, shape, NO_DEDUP)[1]))
    return rows


_STEP = "round|shape|side|msg/s|p50 ms|p99 ms|process CPU s/100k|PG CPU s/100k|total s/100k"
STEP_HEADERS = [*_STEP.split("|"), "other load"]
_SUMMARY = "shape|items/call|ours msg/s|PGMQ msg/s|msg/s ours÷PGMQ|CPU/msg PGMQ÷ours|target"
SUMMARY_HEADERS = [*_SUMMARY.split("|"), "msg/s held", "CPU held"]


def summary_headers(doc: Mapping[str, Any]) -> list[str]:
    extra = ["CPU/msg PGMQ÷ours without dedup"] if _without_dedup(doc) else []
    return [*SUMMARY_HEADERS, *extra]


def render(doc: Mapping[str, Any], *, markdown: bool = False) -> str:
    db = doc.get("database") or {}
    head = f"Beside PGMQ: {db.get('version', 'PostgreSQL')} ({db.get('description', '')})"
    run = f"Run `{doc.get('run_id')}`; pgmq.sql sha256 {doc['pgmq_sql']['sha256']}."
    shapes = [f"- {k}: {v}" for k, v in (doc.get("shapes") or {}).items()]
    steps = [step_row(s) for s in doc.get("steps", [])]
    return "\n\n".join(  # blocks, a blank line between
        [
            f"## {head}" if markdown else head,
            "\n".join([run, *shapes]),
            table(STEP_HEADERS, steps, markdown=markdown, left=3),
            "Medians over rounds (min-max); a target holds where the median ratio reaches it.",
            table(summary_headers(doc), summary_rows(doc), markdown=markdown, left=2),
        ]
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.pgmq", description=__doc__.split("\n")[0])
    p.add_argument("--pgmq-sql", type=Path, help="PGMQ's pgmq-extension/sql/pgmq.sql")
    p.add_argument("--pg-bin", type=Path, help="these PostgreSQL binaries, default settings")
    p.add_argument("--shapes", default="E1,E2", help="comma-separated E scenarios")
    p.add_argument("--rounds", type=int, default=3, help="steps per side and shape")
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per step")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per step")
    p.add_argument(
        "--without-dedup",
        action="store_true",
        help="a third side: ours on a queue without a dedup window, as PGMQ's",
    )
    p.add_argument("--output", type=Path, help="JSON (default bench/results/pgmq-<run>.json)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--render", type=Path, nargs="+", metavar="JSON", help="report saved runs")
    # one PGMQ step, run by the harness in a process of its own
    p.add_argument("--drive", choices=list(EMBEDDED), help=argparse.SUPPRESS)
    p.add_argument("--database-url", help=argparse.SUPPRESS)
    p.add_argument("--db-pid", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tag", default="", help=argparse.SUPPRESS)
    return p


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    try:
        args.shapes = pick(args.shapes, list(EMBEDDED), "E scenario")
    except ValueError as exc:
        p.error(f"--shapes: {exc}")
    if args.rounds < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--rounds and --duration must be positive, --warmup not negative")
    if args.drive and not args.database_url:
        p.error("--drive needs --database-url")
    if args.drive or args.render:
        return args
    if args.pgmq_sql is None or not args.pgmq_sql.is_file():
        p.error("--pgmq-sql FILE is required: PGMQ's pgmq-extension/sql/pgmq.sql")
    if args.pg_bin is not None and not (args.pg_bin / "postgres").is_file():
        p.error(f"--pg-bin {args.pg_bin}: no postgres binary there")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.drive:
        record = asyncio.run(_drive(args, EMBEDDED[args.drive].load))
        sys.stdout.write(json.dumps(record) + "\n")
        return 0
    if args.render:
        docs = [json.loads(path.read_text()) for path in args.render]
    else:
        docs = [run(args)]
        output = args.output or ROOT / "bench" / "results" / f"pgmq-{docs[0]['run_id']}.json"
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(docs[0], indent=2) + "\n")
        print(f"results: {output}")
    print("\n\n".join(render(doc, markdown=args.markdown) for doc in docs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Pushing from SQL: what ``queen.push_messages_v3`` costs PostgreSQL per call and per item, on
one connection, each call its own transaction (``python -m bench.sql_push``; docs/benchmark.md,
"Pushing from SQL"). The backend's CPU is read from /proc around each step."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.report import _n, table
from bench.runner import scratch
from bench.servers import Database, open_database, read_stat

PARTITIONS = 10  # every call writes its items round-robin over this many partitions


@dataclass(frozen=True, slots=True)
class Step:
    items: int  # per call
    calls: int
    seconds: float
    backend_cpu_s: float | None  # None: the backend is not a process of this machine

    @property
    def items_per_s(self) -> float:
        return self.items * self.calls / self.seconds

    @property
    def cpu_us_per_call(self) -> float | None:
        return None if self.backend_cpu_s is None else self.backend_cpu_s / self.calls * 1e6

    @property
    def cpu_us_per_item(self) -> float | None:
        per_call = self.cpu_us_per_call
        return None if per_call is None else per_call / self.items


def call_items(queue: str, items: int, call: int) -> list[dict[str, object]]:
    """One call's items: distinct transaction ids, spread over the partitions."""
    return [
        {
            "queue": queue,
            "partition": f"p{(call * items + j) % PARTITIONS}",
            "transactionId": f"t{call}-{j}",
            "payload": {"call": call, "item": j},
        }
        for j in range(items)
    ]


def step(db: Database, queue: str, items: int, calls: int) -> Step:
    """``calls`` calls of ``items`` items to ``queue`` (its partitions made first, unmeasured)."""
    sql = "SELECT queen.push_messages_v3(%s::jsonb)"
    bodies = [json.dumps(call_items(queue, items, n)) for n in range(calls)]
    with db.connect() as conn:
        conn.execute(
            "SELECT queen.ensure_partitions(%s, %s)",
            ([queue] * PARTITIONS, [f"p{k}" for k in range(PARTITIONS)]),
        )
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        backend = int(row[0]) if db.postmaster_pid is not None else None
        before = read_stat(backend) if backend is not None else None
        started = time.perf_counter()
        for body in bodies:
            conn.execute(sql, (body,))
        seconds = time.perf_counter() - started
        after = read_stat(backend) if backend is not None else None
    cpu = None if before is None or after is None else after.cpu_s - before.cpu_s
    return Step(items, calls, seconds, cpu)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def render(db: Database, steps: Sequence[Step], *, markdown: bool = False) -> str:
    rows = []
    for items in sorted({s.items for s in steps}):
        mine = [s for s in steps if s.items == items]
        rows.append(
            [
                str(items),
                str(len(mine)),
                _n(_median([s.items_per_s for s in mine])),
                _n(_median([s.cpu_us_per_call for s in mine]), ",.1f"),
                _n(_median([s.cpu_us_per_item for s in mine]), ",.1f"),
            ]
        )
    headers = ["items/call", "rounds", "items/s", "backend CPU µs/call", "µs/item"]
    title = f"queen.push_messages_v3 on {db.version} ({db.description}); medians over rounds"
    return title + "\n\n" + table(headers, rows, markdown=markdown)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.sql_push", description=__doc__.split("\n")[0])
    p.add_argument("--items", default="1,10,100", help="items per call, comma-separated")
    p.add_argument(
        "--calls",
        type=int,
        default=0,
        help="calls per step (default: 3,000 items' worth, at least 200)",
    )
    p.add_argument("--rounds", type=int, default=2, help="steps per size")
    p.add_argument("--pg-bin", type=Path, help="these PostgreSQL binaries, default settings")
    p.add_argument("--database-url", help="default: a new embedded PostgreSQL")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    return p


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    try:
        args.items = [int(v) for v in args.items.split(",") if v.strip()]
    except ValueError:
        p.error("--items: whole numbers, comma-separated")
    if not args.items or min(args.items) < 1 or args.rounds < 1 or args.calls < 0:
        p.error("--items and --rounds must be positive, --calls not negative")
    if args.pg_bin is not None and not (args.pg_bin / "postgres").is_file():
        p.error(f"--pg-bin {args.pg_bin}: no postgres binary there")
    return args


def calls_for(items: int, calls: int) -> int:
    return calls or max(200, 3000 // items)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with (
        scratch("sql-push-", print) as workdir,
        open_database(args.database_url, workdir, bin_dir=args.pg_bin) as db,
    ):
        steps = [
            step(db, f"sqlbench-{time.time_ns()}", items, calls_for(items, args.calls))
            for _ in range(args.rounds)
            for items in args.items
        ]
        print(render(db, steps, markdown=args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

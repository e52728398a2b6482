"""``python -m bench`` (or ``./bench/run.sh``): run the push benchmark and report it
(docs/benchmark.md). QUEEN_* variables reach the broker, so settings can be tried."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import report
from bench.runner import Options, Run, plan
from bench.scenarios import SCENARIOS, select
from bench.wrk import WrkError, ensure_wrk
from queen.settings import Settings

HERE = Path(__file__).resolve().parent


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the push path against same-run HTTP and PostgreSQL ceilings.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = p.add_argument
    names = ", ".join(f"{s.name} ({s.describe()})" for s in SCENARIOS.values())
    add("--scenarios", default="all", help=f"comma-separated, or all: {names}")
    add("--duration", type=float, default=25.0, help="measured seconds per wrk run")
    add("--warmup", type=float, default=5.0, help="warm-up seconds per wrk run")
    add("--no-http-ceiling", action="store_true", help="skip the HTTP ceilings")
    add("--no-pg-ceiling", action="store_true", help="skip the PostgreSQL ceilings")
    add("--pg-duration", type=float, default=10.0, help="measured seconds per shape")
    add("--pg-warmup", type=float, default=2.0, help="warm-up seconds per shape")
    add("--pg-group", type=int, default=10, help="batches per commit (G)")
    add("--pg-connections", type=int, help="writers (default: QUEEN_WRITE_CONCURRENCY)")
    add("--wrk-threads", type=int, default=1, help="wrk threads")
    add("--output", type=Path, help="JSON results (default bench/results/<run>.json)")
    results, into = HERE / "RESULTS.md", "also as Markdown, into PATH or bench/RESULTS.md"
    add("--write-results", nargs="?", const=results, type=Path, metavar="PATH", help=into)
    add("--render", type=Path, metavar="JSON", help="report a saved run; run nothing")
    peer = p.add_argument_group("beside the original C++ server (--peer)").add_argument
    peer("--peer", action="store_true", help="run the peer shapes (original and ours) instead")
    shapes = "comma-separated, or all: S1,S2,S3,C1,C2,C3,PIPE,BP1,BP10,BP100"
    peer("--peer-shapes", default="all", help=shapes)
    peer("--rounds", type=int, default=2, help="steps per server and shape")
    peer("--ours-workers", type=int, default=0, help="queen serve --workers (0: one per core)")
    peer("--pg-bin", type=Path, help="these PostgreSQL binaries, their default settings")
    peer("--pipeline-duration", type=float, default=60.0, help="the pipeline producer's seconds")
    peer("--pipeline-warmup", type=float, default=15.0, help="analyze.js's WARMUP_SEC")
    counts = "the pipeline's partition counts (NUM_PARTITIONS), comma-separated: each a shape"
    peer("--pipeline-partitions", default="100", help=counts + " (PIPE at 100, else PIPE-<n>)")
    return p


def _options(args: argparse.Namespace) -> Options:
    for name in ("duration", "pg_duration", "pg_group", "wrk_threads"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    connections = args.pg_connections or Settings.from_env().write_concurrency
    return Options(
        scenarios=select(args.scenarios),
        duration_s=args.duration,
        warmup_s=max(0.0, args.warmup),
        http_ceilings=not args.no_http_ceiling,
        pg_ceilings=not args.no_pg_ceiling,
        pg_duration_s=args.pg_duration,
        pg_warmup_s=max(0.0, args.pg_warmup),
        pg_group=args.pg_group,
        pg_connections=connections,
        wrk_threads=args.wrk_threads,
        database_url=os.environ.get("DATABASE_URL") or None,
    )


def _run(args: argparse.Namespace) -> dict[str, Any]:
    options = _options(args)
    needs_wrk = any(step.kind in ("http", "broker") for step in plan(options))  # not E, C, pg
    wrk = ensure_wrk() if needs_wrk else ""
    return Run(options, wrk, log=lambda line: print(line, flush=True)).execute()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        render: Any = report
        run = _run
        if args.peer:
            try:
                from bench import peer_report, peer_run  # peer_run needs httpx, of the test extra
            except ImportError as exc:
                needs = f"the peer run needs {exc.name}: pip install -e '.[test]'"
                raise RuntimeError(needs) from None
            render, run = peer_report, peer_run.run
        if args.render:
            doc = json.loads(args.render.read_text())
            if (doc.get("kind") == "peer") != args.peer:
                raise ValueError(f"{args.render}: a peer run's document goes with --peer, no other")
        else:
            doc = run(args)
            if not doc:
                return 0  # the peer is not built here: said so, nothing run
            doc["command"] = shlex.join(["./bench/run.sh", *argv])
            name = f"{'peer-' if args.peer else ''}{doc['run_id']}.json"
            output = args.output or HERE / "results" / name
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(doc, indent=2) + "\n")
            print(f"\nresults: {output}")
        print("\n" + render.terminal(doc))
        if args.write_results:
            path: Path = args.write_results
            path.write_text(render.merge(path.read_text() if path.exists() else None, doc))
            print(f"written: {path}")
    except (WrkError, ValueError, RuntimeError, OSError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    return 0

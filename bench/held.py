"""Ours beside the HTTP stack held as long as ours' pushes wait (``python -m bench.held``;
docs/benchmark.md, "The stack, held"): a push waits for its transaction, so ours answers fewer
requests per second than a stack that answers at once, and a server that answers fewer requests
per second pays more CPU for each (fewer events per wake-up of the loop). Per shape and round:
our stack without a broker, ``queen serve`` (on a new database), the stack again with its push
route waiting so long that its median latency is ours' (a first try, then the hold corrected by
what it gave), and bare Hypercorn, each under the same wrk load."""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import servers
from bench.http_ceiling import HOLD_ENV
from bench.peer_run import fresh_database
from bench.profile import SERVERS
from bench.report import table
from bench.runner import new_run_id
from bench.scenarios import SCENARIOS, pick
from bench.servers import Meter
from bench.wrk import ensure_wrk, run_wrk

SIDES = ("stack", "ours", "held", "floor")  # a round's steps, in order (held needs ours' p50)


def measure(
    which: str, db: servers.Database, shape: str, args: argparse.Namespace, hold_ms: float = 0.0
) -> dict[str, float]:
    """One step: the server's requests/s, CPU per message (µs) and median latency (ms)."""
    name, load, wrk = f"{which}-{shape}-{args.step}", SCENARIOS[shape].load, ensure_wrk()
    args.step += 1
    where = {"workers": args.workers, "workdir": args.workdir, "name": name}
    if which == "ours":
        server = servers.start_broker(db, **where)
    else:
        hold = {HOLD_ENV: f"{hold_ms:.3f}"}
        server = servers.start_http_stack(SERVERS[which], **where, env=hold)
    try:
        server.wait_ready()
        with db.connect() as conn:  # the new database's pages written: none waits in the step
            conn.execute("CHECKPOINT")
        queue, tag = f"held_{shape.lower()}", f"{args.run_id}-{name}"  # a tag new to the queue
        run_wrk(wrk, server.base_url, load, args.warmup, queue, f"{tag}-w", args.wrk_threads)
        meter = Meter(None, server.pids)
        report = run_wrk(wrk, server.base_url, load, args.duration, queue, tag, args.wrk_threads)
        cpu = meter.stop()
    finally:
        server.stop()
    return {
        "requests_per_s": report.ok_requests / cpu["wall_s"],
        "us_per_msg": cpu["server_cpu_s"] * 1e6 / max(1, report.ok_requests * load.items),
        "p50_ms": report.percentiles_ms.get("50", 0.0),
        "hold_ms": hold_ms,
        "errors": float(report.errors),
    }


def hold_for(
    stack: Mapping[str, float], ours: Mapping[str, float], tried: Mapping[str, float] | None = None
) -> float:
    """How long the held stack's route waits: first ours' median latency less the stack's own;
    then, from a step ``tried`` with a hold, the hold that brings the median to ours' if the
    median grows in proportion to the hold (what the stack adds to a held request is not what
    it adds to one answered at once)."""
    first = max(0.0, ours["p50_ms"] - stack["p50_ms"])
    if tried is None or tried["p50_ms"] <= stack["p50_ms"]:
        return first
    return max(0.0, tried["hold_ms"] * first / (tried["p50_ms"] - stack["p50_ms"]))


def rows(steps: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Per shape, medians over its rounds."""
    out = []
    for shape in dict.fromkeys(s["shape"] for s in steps):

        def med(side: str, key: str, shape: str = shape) -> float:
            found = [s[key] for s in steps if s["shape"] == shape and s["side"] == side]
            return statistics.median(found) if found else float("nan")

        ours, held, floor = (
            med("ours", "us_per_msg"),
            med("held", "us_per_msg"),
            med("floor", "us_per_msg"),
        )
        out.append(
            [
                shape,
                f"{med('ours', 'requests_per_s'):,.0f} / {ours:.1f} / {med('ours', 'p50_ms'):.1f}",
                f"{med('held', 'hold_ms'):.1f}",
                f"{med('held', 'requests_per_s'):,.0f} / {held:.1f} / {med('held', 'p50_ms'):.1f}",
                f"{med('stack', 'requests_per_s'):,.0f} / {med('stack', 'us_per_msg'):.1f}",
                f"{med('floor', 'requests_per_s'):,.0f} / {floor:.1f}",
                f"{ours / floor:.2f}",
                f"{held / floor:.2f}",
                f"{ours / held:.2f}",
            ]
        )
    return out


HEADERS = [
    "shape",
    "ours: req/s / µs per msg / p50 ms",
    "hold ms",
    "stack held: req/s / µs per msg / p50 ms",
    "stack: req/s / µs per msg",
    "bare Hypercorn: req/s / µs per msg",
    "ours ÷ bare",
    "held ÷ bare",
    "ours ÷ held",
]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.held", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="S1,S2", help="push scenarios, comma-separated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per step")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=2, help="processes of each server")
    p.add_argument("--wrk-threads", type=int, default=1, help="as the peer bench")
    p.add_argument("--pg-bin", type=Path, help="these PostgreSQL binaries, default settings")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = p.parse_args(argv)
    shapes = pick(args.shapes, list(SCENARIOS))
    steps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="queen-bench-held-") as tmp:
        args.workdir, args.run_id, args.step = Path(tmp), new_run_id(), 0
        with servers.open_database(None, args.workdir, tcp=True, bin_dir=args.pg_bin) as db:
            for r in range(1, args.rounds + 1):
                for shape in shapes:
                    done: dict[str, dict[str, float]] = {}
                    for side in SIDES:
                        if side == "ours":  # a new database for each, as the peer bench's
                            with fresh_database(db, f"held_{args.step}") as empty:
                                done[side] = measure(side, empty, shape, args)
                        elif side == "held":  # a first try, then the hold corrected by it
                            stack, ours = done["stack"], done["ours"]
                            tried = measure("stack", db, shape, args, hold_for(stack, ours))
                            hold = hold_for(stack, ours, tried)
                            done[side] = measure("stack", db, shape, args, hold)
                        else:
                            done[side] = measure(side, db, shape, args)
                        steps.append({"round": r, "shape": shape, "side": side, **done[side]})
                        s = done[side]
                        print(
                            f"round {r} {shape} {side}: {s['requests_per_s']:,.0f} req/s, "
                            f"{s['us_per_msg']:.1f} µs/msg, p50 {s['p50_ms']:.1f} ms"
                            + (f" (held {s['hold_ms']:.1f} ms)" if side == "held" else "")
                            + (f", {s['errors']:.0f} errors" if s["errors"] else ""),
                            flush=True,
                        )
    print("\nMedians over rounds; CPU of the server's processes per message pushed.\n")
    print(table(HEADERS, rows(steps), markdown=args.markdown, left=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

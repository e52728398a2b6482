"""Render a peer run (the JSON ``./bench/run.sh --peer`` writes): the original beside ours."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from statistics import mean
from typing import Any

from bench import report
from bench.original_runner import SHAPES as RUNNER
from bench.report import Doc, _n, columns, merge_results, table
from bench.scenarios import get

Steps = Sequence[Mapping[str, Any]]  # one side's steps of a shape
SIDES = ("original", "ours")
CEILINGS = ("stack", "hypercorn")  # the HTTP stack alone (see bench.peer_run)
_STAGES = ("worker", "analytics", "log")  # of the pipeline
RUNNER_SHAPES = tuple(RUNNER)  # the original's own runner

METHOD = """\
- **Alternation**: every shape runs original, ours, original, ours, ... (`--rounds` each), each
  step a fresh server process on a fresh database (`CREATE DATABASE`, dropped afterwards) of
  the one PostgreSQL server of the run, both servers reaching it over TCP on 127.0.0.1. The
  figures are the means over the rounds; the ratio is ours ÷ original of those means.
- **Push (S)**: wrk (1 thread, `push.lua`, the same body to both: `POST /api/v1/push
  {"items":[...]}`), warm-up then the measured window; msg/s = 2xx answers x items ÷ window;
  p50/p99 per request (wrk). "stored" (JSON) counts the messages in the database after the
  step, to check every answered push was stored.
- **Consume (C)**: the queue is filled over HTTP (100 items per push, not measured), then
  the consumers drain it over HTTP with the official JS client's requests (`GET
  /api/v1/pop/queue/{q}?batch=N&wait=true&timeout=30000[&consumerGroup=g]`, then one
  `POST /api/v1/ack/batch` per batch with transactionId, partitionId, leaseId), from one Trio
  process with httpx; msg/s = deliveries acked ÷ drain time; p50/p99 of the pops (acks in the
  JSON). C3: three groups drain the same 100k messages at once, 8 consumers each; msg/s
  counts the 300k deliveries.
- **Pipeline (PIPE)**: the original's own `benchmark-queen/2026-04-26/pipeline/queen` scripts on
  its JS client (from its repository), unchanged, run by their environment knobs; the consumers
  start first and take the warm-up message `warmup-partitions.js` left in every partition, then
  the producer runs for the window, the consumers until every message it had pushed reached
  both tail groups (or nothing arrived for 65 s, longer than the queues' 60 s lease). msg/s = the
  smaller of the analytics and log rates `analyze.js` reports for the steady state (after its
  warm-up cut); p50/p99 = its end-to-end latency, producer push to analytics done; lost =
  producer txids of the steady state that `analyze.js` finds missing at analytics or log (the
  larger); duplicates = its worker + analytics + log duplicate counts; requests per message =
  the Node processes' own requests by route (`bench/count_requests.cjs`) ÷ messages pushed.
- **The original's own runner (BP1, BP10, BP100)**: its `benchmark-queen/2026-04-26/_runner`
  scripts (`bench-producer.js`, `bench-consumer.js`, autocannon) unchanged, at its `bp-*`
  tests' knobs: pushes of 1, 10 or 100 items, each to one of 1,001 partitions in turn, from 50
  connections, beside 50 connections of long-poll pops of 100 with `autoAck` in queue mode,
  both started together for the push window; msg/s and p50/p99 are the producer's own report;
  "unconsumed" counts what no pop had taken when both stopped (from the database).
- **CPU** (from `/proc`, user + system, over the measured window: the push window, the drain,
  or the pipeline from its producer's start, once the warm-up is taken, to the end of the
  drain), per 100k messages
  (pushed, delivered, or produced in the pipeline): the broker's process (the original's
  threads included), the backends of the step's database (listed in `pg_stat_activity` every
  0.5 s), the PostgreSQL server's whole process tree (WAL writer, checkpointer, autovacuum too),
  and the clients (wrk, the consume driver, or the pipeline's Node processes).
"""


def _values(steps: Steps, *keys: str) -> list[float]:
    values = (get(step, *keys) for step in steps)
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


def avg(steps: Steps, *keys: str) -> float | None:
    values = _values(steps, *keys)
    return mean(values) if values else None


def _latency(name: str) -> str:
    if name.startswith("C"):
        return "pop_ms"
    return "e2e_ms.analytics" if name.startswith("PIPE") else "latency_ms"


def step_line(name: str, r: Mapping[str, Any]) -> str:
    note = notes(name, [r])
    return report.step_line(r, _latency(name), "broker", "" if note == "-" else note)


def notes(name: str, steps: Steps) -> str:
    out = []
    errors = sum(_values(steps, "errors")) + sum(_values(steps, "failed_acks"))
    if errors:
        out.append(f"errors {errors:,.0f}")
    short = sum(
        max(0, s["answered"] - s["stored"]) for s in steps if "stored" in s and "answered" in s
    )
    if short:
        out.append(f"answered but not stored {short:,}")
    if any(s.get("finished") is False for s in steps):
        out.append("UNFINISHED")
    if name in RUNNER_SHAPES:
        pop_errors = sum(_values(steps, "pop_errors"))
        if pop_errors:
            out.append(f"pop errors {pop_errors:,.0f}")
        out.append(f"unconsumed {sum(_values(steps, 'unconsumed')):,.0f}")
    if name.startswith("PIPE"):
        out.append(f"lost {sum(_values(steps, 'lost')):,.0f}")
        out.append(f"duplicates {sum(_values(steps, 'duplicates')):,.0f}")
    return ", ".join(out) or "-"


def pipeline_figures(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of one ``analyze.js`` summary the tables show."""
    rate, done = summary.get("throughput") or {}, summary.get("completeness") or {}
    dup, lat = summary.get("duplicates") or {}, summary.get("latency_ms") or {}
    produced = int(done.get("producedTxids") or 0)
    lost = {stage: produced - int(done.get(f"reached{stage.title()}") or 0) for stage in _STAGES}
    duplicates = {stage: int(dup.get(stage) or 0) for stage in _STAGES}

    def stats(key: str) -> dict[str, Any]:
        s = lat.get(key) or {}
        return {k: s.get(k) for k in ("p50", "p90", "p99", "max", "count")}

    return {
        "msg_per_s": min(rate.get("analytics_msgPerSec") or 0, rate.get("log_msgPerSec") or 0),
        "producer_msg_per_s": rate.get("producer_msgPerSec"),
        "worker_msg_per_s": rate.get("worker_msgPerSec"),
        "steady_s": rate.get("steadyDurationSec"),
        "produced_steady": produced,
        "lost_at": lost,
        "lost": max(lost["analytics"], lost["log"]),
        "duplicates_at": duplicates,
        "duplicates": sum(duplicates.values()),
        "e2e_ms": {"analytics": stats("end_to_end_analytics"), "log": stats("end_to_end_log")},
    }


def _pair(a: float | None, b: float | None, spec: str) -> str:
    return f"{_n(a, spec)} / {_n(b, spec)}"


def _both(a: Steps, b: Steps, key: str, spec: str = ".2f") -> str:
    """The means at ``key`` of the steps ``a`` and ``b``, as :func:`_pair`'s ``a / b``."""
    return _pair(avg(a, key), avg(b, key), spec)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def _by_shape(doc: Doc) -> list[tuple[str, Mapping[str, Any], list[Any], list[Any]]]:
    """Per shape: its name, its steps by side, the original's and ours."""
    shapes = (doc.get("shapes") or {}).items()
    by_side = [(name, shape.get("steps") or {}) for name, shape in shapes]
    return [(n, s, s.get("original", []), s.get("ours", [])) for n, s in by_side]


THROUGHPUT_HEADERS = columns(
    "shape|original msg/s|ours msg/s|ours ÷ original|original p50 / p99 ms|ours p50 / p99 ms|"
    "msg/s per round (original; ours)|notes (original; ours)"
)


def throughput_rows(doc: Doc, *, markdown: bool = True) -> list[list[str]]:
    rows = []
    for name, _, o, u in _by_shape(doc):
        mo, mu, lk = avg(o, "msg_per_s"), avg(u, "msg_per_s"), _latency(name).split(".")
        bold = "**" if markdown else ""
        ratio = "-" if not mo or mu is None else f"{bold}{mu / mo:.2f}{bold}"
        latency = [_pair(avg(s, *lk, "p50"), avg(s, *lk, "p99"), ".1f") for s in (o, u)]
        rounds = "; ".join(", ".join(_n(v) for v in _values(s, "msg_per_s")) for s in (o, u))
        note = f"{notes(name, o)}; {notes(name, u)}"
        rows.append([name, _n(mo), _n(mu), ratio, *latency, rounds, note])
    return rows


CPU_HEADERS = columns(
    "shape|broker|PG backends of its database|PG server (all processes)|clients|"
    "broker + PG server|broker cores|other load (cores)"
)
_PER_100K = {k: f"{k}_cpu_s_per_100k" for k in ("server", "db_backends", "db", "client")}


def cpu_rows(doc: Doc) -> list[list[str]]:
    rows = []
    for name, _, o, u in _by_shape(doc):
        cpu = [_both(o, u, key) for key in _PER_100K.values()]
        total = [sum(avg(s, _PER_100K[k]) or 0.0 for k in ("server", "db")) for s in (o, u)]
        cpu.append(_pair(total[0], total[1], ".2f"))  # broker + PG server
        rows.append([name, *cpu, _both(o, u, "server_cores"), _both(o, u, "other_cores")])
    return rows


CEILING_HEADERS = columns(
    "shape|original msg/s|ours msg/s|our HTTP stack alone msg/s|bare Hypercorn msg/s|"
    "ours ÷ our stack|our stack ÷ original|bare Hypercorn ÷ original|"
    "server cores (our stack / Hypercorn)|"
    "msg/s the cores hold: bare Hypercorn + wrk + PostgreSQL|that ÷ original"
)


def ceiling_rows(doc: Doc) -> list[list[str]]:
    """The push shapes against the HTTP stack alone, beside the original and ours."""
    rows = []
    for name, steps, _, _ in _by_shape(doc):
        if not any(steps.get(side) for side in CEILINGS):
            continue
        mo, mu, ms, mh = (avg(steps.get(side, []), "msg_per_s") for side in (*SIDES, *CEILINGS))
        bound = hypercorn_bound(steps, (doc.get("machine") or {}).get("cores"))
        cores = _both(steps.get("stack", []), steps.get("hypercorn", []), "server_cores")
        ratios = [_ratio(mu, ms), _ratio(ms, mo), _ratio(mh, mo)]
        held = [_n(bound), _ratio(bound, mo)]
        rows.append([name, *map(_n, (mo, mu, ms, mh)), *ratios, cores, *held])
    return rows


def hypercorn_bound(steps: Mapping[str, Any], cores: int | None) -> float | None:
    """msg/s the machine's cores hold for a broker that costs nothing beyond bare Hypercorn:
    cores x 100k ÷ (bare Hypercorn's CPU and its load generator's per 100k messages +
    PostgreSQL's, as cheap as the cheaper of the two servers made it)."""
    floor = steps.get("hypercorn", [])
    http, client = (avg(floor, _PER_100K[k]) for k in ("server", "client"))
    pg = [avg(steps.get(side, []), "db_cpu_s_per_100k") for side in SIDES]
    known = [v for v in pg if v is not None]
    if not cores or http is None or client is None or not known:
        return None
    return cores * 100_000 / (http + client + min(known))


PER_MESSAGE_HEADERS = columns(
    "shape|original µs|ours µs|our stack alone µs|bare Hypercorn µs|ours ÷ bare Hypercorn|"
    "per round|goal|the rounds against it|msg/s original / ours"
)
# Broker CPU per message, ours ÷ bare Hypercorn, at most (the push shapes' goals).
CPU_GOALS: dict[str, float] = {"S1": 1.25, "S2": 1.5}


def against_goal(rounds: Sequence[float], goal: float | None) -> str:
    """Whether every round held ``goal`` (at most), none did, or the rounds fell on both sides
    of it: then the run says so, since the figure moves more than its distance to the goal."""
    if goal is None or not rounds:
        return "-"
    held = sum(r <= goal for r in rounds)
    if held == len(rounds):
        return "held in every round"
    if held == 0:
        return "missed in every round"
    return f"held in {held} of {len(rounds)} rounds: they fall on both sides of it"


def per_message_rows(doc: Doc) -> list[list[str]]:
    """Broker CPU µs per message per side, ours ÷ bare Hypercorn, its range over the rounds and
    the rounds against the shape's goal (:data:`CPU_GOALS`)."""
    rows = []
    for name, steps, o, u in _by_shape(doc):
        per_100k = [avg(steps.get(side, []), _PER_100K["server"]) for side in (*SIDES, *CEILINGS)]
        us = [None if v is None else v * 10 for v in per_100k]
        rounds = [
            a["server_cpu_s_per_100k"] / b["server_cpu_s_per_100k"]
            for a, b in zip(u, steps.get("hypercorn", []), strict=False)
            if a.get("server_cpu_s_per_100k") and b.get("server_cpu_s_per_100k")
        ]
        spread = f"{min(rounds):.2f}-{max(rounds):.2f}" if rounds else "-"
        msg = _both(o, u, "msg_per_s", ",.0f")
        goal = CPU_GOALS.get(name)
        shown = "-" if goal is None else f"≤ {goal:g}"
        verdict = against_goal(rounds, goal)
        rows.append([name, *map(_n, us), _ratio(us[1], us[3]), spread, shown, verdict, msg])
    return rows


def _pipelines(doc: Doc) -> list[tuple[str, str, list[Any], list[Any]]]:
    """Per pipeline shape (one per partition count) and side: the label of its rows (the side
    alone for PIPE, the side and the shape for PIPE-<count>), its steps and the original's."""
    out = []
    for name, shape in (doc.get("shapes") or {}).items():
        if name == "PIPE" or name.startswith("PIPE-"):
            steps = shape.get("steps") or {}
            for side in SIDES:
                label = side if name == "PIPE" else f"{side}, {name}"
                out.append((label, side, steps.get(side, []), steps.get("original", [])))
    return out


PIPELINE_BOUND_HEADERS = columns(
    "with|clients CPU s/100k|PG server CPU s/100k|broker CPU s/100k|"
    "msg/s the cores hold at these costs|measured msg/s|"
    "msg/s the cores hold with a broker costing nothing|that ÷ original's measured"
)


def pipeline_bound_rows(doc: Doc) -> list[list[str]]:
    """What the cores hold in the pipeline, as measured and with a broker costing nothing."""
    cores = (doc.get("machine") or {}).get("cores")
    if not cores:
        return []
    rows = []
    for label, _, steps, original in _pipelines(doc):
        client, db, broker = (avg(steps, _PER_100K[k]) for k in ("client", "db", "server"))
        if client is None or db is None:
            continue
        bound = cores * 100_000 / (client + db) if client + db > 0 else None
        total = client + db + (broker or 0.0)
        held = _n(cores * 100_000 / total if total else None)
        costs = [_n(client, ".0f"), _n(db, ".0f"), _n(broker, ".0f")]
        measured, that = _n(avg(steps, "msg_per_s")), _ratio(bound, avg(original, "msg_per_s"))
        rows.append([label, *costs, held, measured, _n(bound), that])
    return rows


PIPELINE_HEADERS = columns(
    "run|producer msg/s|worker msg/s|end to end msg/s|produced (steady)|"
    "lost worker/analytics/log|duplicates worker/analytics/log|e2e analytics p50/p99/max ms|"
    "e2e log p50/p99/max ms|missing, whole run|drain s|requests per message push/pop/ack"
)


def pipeline_rows(doc: Doc) -> list[list[str]]:
    rows = []
    for label, _, steps, _ in _pipelines(doc):
        for number, s in enumerate(steps, 1):
            rates = ("producer_msg_per_s", "worker_msg_per_s", "msg_per_s", "produced_steady")
            counts = [s.get("lost_at") or {}, s.get("duplicates_at") or {}]
            e2e = [get(s, "e2e_ms", stage) or {} for stage in ("analytics", "log")]
            row = [
                f"{label} {number}",
                *(_n(s.get(k)) for k in rates),
                *("/".join(_n(c.get(k)) for k in _STAGES) for c in counts),
                *(" / ".join(_n(e.get(k)) for k in ("p50", "p99", "max")) for e in e2e),
                _n(s.get("missing_all")),
                _n(s.get("drain_s"), ".0f"),
                _per_message(s.get("requests"), s.get("pushed")),
            ]
            rows.append(row)
    return rows


RUNNER_HEADERS = columns(
    "run|push msg/s|push p50 / p99 ms|pops/s|pop p50 / p99 ms|unconsumed at the end|"
    "errors push / pop|machine CPU µs per message (broker + PG server + clients + other)"
)


def runner_rows(doc: Doc) -> list[list[str]]:
    """The original's own runner, step by step."""
    rows = []
    for name, steps, _, _ in _by_shape(doc):
        if name not in RUNNER_SHAPES:
            continue
        for side in SIDES:
            for number, s in enumerate(steps.get(side, []), 1):
                push, pop = s.get("latency_ms") or {}, s.get("pop_latency_ms") or {}
                row = [
                    f"{name} {side} {number}",
                    _n(s.get("msg_per_s")),
                    _pair(push.get("p50"), push.get("p99"), ".0f"),
                    _n(s.get("pops_per_s")),
                    _pair(pop.get("p50"), pop.get("p99"), ".0f"),
                    _n(s.get("unconsumed")),
                    _pair(s.get("errors"), s.get("pop_errors"), ".0f"),
                    _n(machine_us(s), ".1f"),
                ]
                rows.append(row)
    return rows


def machine_us(step: Mapping[str, Any]) -> float | None:
    """µs of the whole machine's CPU per message of a step: the broker, the PostgreSQL
    server, the clients and the rest of the machine over its window."""
    messages, wall = step.get("answered"), step.get("wall_s")
    if not messages or wall is None:
        return None
    keys = ("server_cpu_s", "db_cpu_s", "client_cpu_s")
    other = float(step.get("other_cores") or 0.0) * float(wall)
    busy = sum(float(step.get(k) or 0.0) for k in keys) + other
    return busy / float(messages) * 1e6


def _per_message(requests: Mapping[str, int] | None, pushed: int | None) -> str:
    """Requests per pushed message by route (the Node processes' counts): push / pop / ack."""
    if not requests or not pushed:
        return "-"
    return " / ".join(f"{requests.get(route, 0) / pushed:.2f}" for route in ("push", "pop", "ack"))


def _conditions(doc: Doc) -> list[str]:
    m, db, o = doc.get("machine") or {}, doc.get("database") or {}, doc.get("options") or {}
    orig = doc.get("original") or {}
    settings = ", ".join(f"{k}={v}" for k, v in (db.get("settings") or {}).items())
    peer_settings = " ".join(f"{k}={v}" for k, v in (orig.get("settings") or {}).items())
    env = ", ".join(f"{k}={v}" for k, v in (doc.get("broker_env") or {}).items()) or "none"
    skipped = "; ".join(f"{k}: {v}" for k, v in (doc.get("skipped") or {}).items())
    n = o.get("ours_workers", 1)
    processes = f"{n} processes, `--workers {n}`" if n > 1 else "1 process"
    processes = "its default: one process per core" if n == 0 else processes
    return [
        f"- Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB; "
        f"{m.get('os')}; shared with other work (load average before / after "
        f"{m.get('load_average')} / {doc.get('load_average_after')})",
        f"- Database: {db.get('description')}, {db.get('version')} ({settings})",
        f"- Original: `{orig.get('binary')}` (built {orig.get('built')}, from the mirror at "
        f"{orig.get('mirror_head')}), `{peer_settings}`",
        f"- Ours: `queen serve` ({processes}), settings from the environment: {env}",
        f"- Windows: {o.get('rounds')} round(s) per server; push: warm-up {o.get('warmup_s')} s "
        f"+ {o.get('duration_s')} s; pipeline: producer {o.get('pipeline_s')} s, "
        f"`WARMUP_SEC={o.get('pipeline_warmup_s'):g}` for analyze.js; {doc.get('wrk')}",
        *([f"- Skipped: {skipped}"] if skipped else []),
    ]


_PER_MESSAGE_INTRO = (
    "Broker CPU per message (µs; bare Hypercorn: a bare ASGI callable answering the push):"
)
_CEILING_INTRO = """\
The push shapes against the HTTP stack alone (same wrk load, ours' process count, no
broker, no database): our Quart-Trio app and serving layer answering the push
(`bench/http_ceiling.py`), and a bare ASGI callable on Hypercorn with its defaults
(`bench/hypercorn_floor.py`). What bare Hypercorn reaches bounds any server built on
it on this machine; the last columns add what PostgreSQL spends per message (the
cheaper server's figure) to bare Hypercorn's and wrk's CPU: the msg/s the cores hold
for a broker that costs nothing beyond Hypercorn:"""
_BOUND_INTRO = """\
What the machine's cores sustain in the pipeline (cores x 100k ÷ CPU seconds per
100k messages of everything on them, over the stages and the drain), at the costs
measured with each server, and with a broker that cost nothing (the clients' and
PostgreSQL's costs as measured). A measured rate above what the cores sustain means
the consumers fell behind while the producer ran and caught up in the drain:"""


def _tables(doc: Doc, *, markdown: bool) -> list[str]:
    """Each table after its introduction, as blocks; the last four only where they have rows."""
    tables = [
        (_PER_MESSAGE_INTRO, PER_MESSAGE_HEADERS, per_message_rows(doc)),
        ("", THROUGHPUT_HEADERS, throughput_rows(doc, markdown=markdown)),
        ("CPU seconds per 100k messages (original / ours):", CPU_HEADERS, cpu_rows(doc)),
        (_CEILING_INTRO, CEILING_HEADERS, ceiling_rows(doc)),
        ("The pipeline, run by run (analyze.js):", PIPELINE_HEADERS, pipeline_rows(doc)),
        (_BOUND_INTRO, PIPELINE_BOUND_HEADERS, pipeline_bound_rows(doc)),
        ("The original's own runner, step by step:", RUNNER_HEADERS, runner_rows(doc)),
    ]
    out: list[str] = []
    for number, (intro, headers, rows) in enumerate(tables):
        if rows or number < 3:
            out += [*([intro] if intro else []), table(headers, rows, markdown=markdown)]
    return out


def terminal(doc: Doc) -> str:
    return "Beside the original\n" + "\n\n".join(_tables(doc, markdown=False))


def markdown(doc: Doc) -> str:
    version = (doc.get("database") or {}).get("version") or "PostgreSQL"
    legend = [f"- {n}: {s.get('description')}" for n, s in (doc.get("shapes") or {}).items()]
    intro = (
        f"Run `{doc.get('run_id')}`, {doc.get('started_at')} to {doc.get('finished_at')}, "
        f"produced by `{doc.get('command') or './bench/run.sh --peer'}`. Absolute figures\n"
        "on this shared machine swing by up to 2x within minutes: read the ratios of one\n"
        "alternating run, not the msg/s."
    )
    conditions = "\n".join([*_conditions(doc), "", *legend])
    blocks = [f"## Beside the original: {version}", intro, conditions, *_tables(doc, markdown=True)]
    return "\n\n".join([*blocks, "How these figures are measured:", METHOD])


def merge(existing: str | None, doc: Doc) -> str:
    """The results file with this run's section, one per PostgreSQL major version."""
    found = re.search(r"PostgreSQL (\d+)", str((doc.get("database") or {}).get("version") or ""))
    key = f"PostgreSQL {found.group(1)}" if found else "PostgreSQL"
    head = f"<!-- generated by ./bench/run.sh --peer --write-results ({key})"
    markers = (f"{head}: begin -->", f"{head}: end -->")
    return merge_results(existing, markdown(doc), markers, append=True)

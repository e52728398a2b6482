"""Render a results document (the JSON a run writes) as terminal tables or as RESULTS.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.pg_ceiling import VARIANTS
from bench.targets import TARGETS, evaluate

Doc = Mapping[str, Any]

METHOD = """\
- **Scenarios**: a fresh `queen serve` (1 or 2 processes) per scenario on one database for
  the whole run, emptied after every step (the step's queues deleted, the tables vacuumed, a
  checkpoint taken), so no step is measured against the millions of rows an earlier one
  stored or the pages it left to flush; wrk (1 thread, `push.lua`) sends ~100-byte JSON
  payloads with unique transactionIds (a new prefix for every wrk run, so warm-up and
  measurement never collide). Warm-up first, then the measured window.
  msg/s = 2xx responses x items/request ÷ duration. S5 sends every request twice: half of
  its items answer `duplicate`.
- **Latency**: wrk's own percentiles (`--latency`), per request.
- **req/tx, part/tx**: deltas over the window of the broker's counters
  `queen_push_requests_committed_total` (partition requests: a push to k partitions counts
  k), `queen_push_segments_total` and `queen_push_transactions_total`, summed over workers.
- **CPU**: from `/proc/<pid>/stat` (user + system, reaped children included) over the window:
  the broker's process tree (the `--workers` parent and its workers), the PostgreSQL server's
  process tree, wrk's own; per 100k messages the broker took in. "Other load" is what the rest
  of the machine used meanwhile (should be ~0 on a quiet machine).
- **RSS**: the broker's process tree, sampled every 0.5 s during the window (largest value).
- **HTTP ceiling**: the same Quart-Trio app class, Hypercorn worker, configuration and
  SO_REUSEPORT socket as `queen serve`, with a push route that decodes the body (orjson),
  mints ids and answers the broker's shape for every item, without the broker's intake
  (validation, payload re-encoding, grouping) or the database; same load and process count
  as the scenario it bounds.
- **Targets**: "HTTP ceiling's own" is the same figure measured on the bare HTTP stack; with
  a closed loop of N connections, mean latency is N ÷ requests/s, so a latency target below
  what the bare stack reaches cannot be met by the broker at that load.
- **PostgreSQL ceiling**: a plain psycopg loop (no HTTP, no actors, no Trio), one thread and
  connection per concurrent transaction of the broker, each on its own queue. Batches shaped
  like the scenario's requests (one segment row per partition with the parallel arrays, one
  sidecar row per frame). Variants: `fn` the broker's own `queen.push_segments` call, one
  commit per batch; `fn-group` G calls per transaction; `fn-merged` G batches packed into one
  call (one segment per partition, what coalescing and batching produce); `insert` plain
  INSERTs of the same rows and an UPDATE of `next_offset` without lock or dedup probe, one
  commit per batch; `insert-group` the same for G batches per commit.
"""


def _n(value: Any, spec: str = ",.0f", missing: str = "-") -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return missing
    return format(value, spec)


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool, left: int = 1
) -> str:
    """A table; the first ``left`` columns are text (left-aligned), the rest figures."""
    if markdown:
        rule = ["---" if i < left else "--:" for i in range(len(headers))]
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _errors(record: Mapping[str, Any]) -> str:
    total = sum((record.get("errors") or {}).values())
    failed = (record.get("counters") or {}).get("failed") or 0
    return _n(total + failed, ",.0f") if total + failed else "0"


def _best_pg(record: Mapping[str, Any]) -> str:
    vs = record.get("vs_pg") or {}
    if not vs:
        return "-"
    variant = min(vs, key=lambda v: vs[v])  # the smallest fraction: the fastest ceiling
    return f"{vs[variant]:.2f} ({variant})"


def scenario_rows(doc: Doc) -> list[list[str]]:
    rows = []
    for name, r in doc.get("scenarios", {}).items():
        lat = r.get("latency_ms", {})
        rows.append(
            [
                name,
                _n(r.get("msg_per_s")),
                _n(r.get("vs_http"), ".2f"),
                _best_pg(r),
                _n(lat.get("p50"), ".1f"),
                _n(lat.get("p99"), ".1f"),
                _n(lat.get("max"), ".0f"),
                _n(r.get("requests_per_tx"), ".1f"),
                _n(r.get("partitions_per_tx"), ".1f"),
                _n(r.get("server_cpu_s_per_100k"), ".2f"),
                _n(r.get("db_cpu_s_per_100k"), ".2f"),
                _n(r.get("rss_mb"), ".0f"),
                _n(r.get("other_cores"), ".2f"),
                _errors(r),
            ]
        )
    return rows


SCENARIO_HEADERS = [
    "scenario",
    "msg/s",
    "vs HTTP",
    "vs PG (fastest)",
    "p50 ms",
    "p99 ms",
    "max ms",
    "req/tx",
    "part/tx",
    "broker CPU s/100k",
    "DB CPU s/100k",
    "RSS MB",
    "other load",
    "errors",
]


def http_rows(doc: Doc) -> list[list[str]]:
    return [
        [
            name,
            r.get("description", ""),
            _n(r.get("msg_per_s")),
            _n(r.get("requests_per_s")),
            _n(r.get("latency_ms", {}).get("p50"), ".1f"),
            _n(r.get("latency_ms", {}).get("p99"), ".1f"),
            _n(r.get("server_cpu_s_per_100k"), ".2f"),
            _n(r.get("wrk_cpu_s"), ".1f"),
            _n(r.get("other_cores"), ".2f"),
            _errors(r),
        ]
        for name, r in doc.get("http_ceilings", {}).items()
    ]


HTTP_HEADERS = [
    "ceiling",
    "load",
    "msg/s",
    "req/s",
    "p50 ms",
    "p99 ms",
    "server CPU s/100k",
    "wrk CPU s",
    "other load",
    "errors",
]


def pg_rows(doc: Doc) -> list[list[str]]:
    rows = []
    for name, variants in doc.get("pg_ceilings", {}).items():
        for variant, r in variants.items():
            rows.append(
                [
                    f"{name} {variant}",
                    r.get("description", ""),
                    str(r.get("group", 1)),
                    _n(r.get("msg_per_s")),
                    _n(r.get("commits_per_s")),
                    _n(r.get("db_cpu_s_per_100k"), ".2f"),
                    _n(r.get("client_cpu_s_per_100k"), ".2f"),
                ]
            )
    return rows


PG_HEADERS = [
    "ceiling",
    "batch",
    "batches/commit",
    "msg/s",
    "commits/s",
    "DB CPU s/100k",
    "client CPU s/100k",
]


def fraction_rows(doc: Doc) -> tuple[list[str], list[list[str]]]:
    measured = {v for variants in doc.get("pg_ceilings", {}).values() for v in variants}
    shown = [v for v in VARIANTS if v in measured]
    headers = ["scenario", "HTTP ceiling", "vs HTTP", *(f"vs {v}" for v in shown)]
    rows = []
    for name, r in doc.get("scenarios", {}).items():
        vs = r.get("vs_pg") or {}
        rows.append(
            [
                name,
                str(r.get("http_ceiling", "")),
                _n(r.get("vs_http"), ".2f"),
                *(_n(vs.get(v), ".2f") for v in shown),
            ]
        )
    return headers, rows


def _spec(value: float | None) -> str:
    return ",.0f" if value is not None and value >= 1000 else ".2f"


def _ceiling_figure(doc: Doc, scenario: str, target: str) -> float | None:
    """The same figure measured on the bare HTTP stack, where that tells whether the target
    is reachable at all (latency, absolute msg/s)."""
    record = doc.get("scenarios", {}).get(scenario) or {}
    http = doc.get("http_ceilings", {}).get(record.get("http_ceiling", "")) or {}
    if "p99" in target:
        value = (http.get("latency_ms") or {}).get("p99")
    elif target.startswith("msg/s ≥"):
        value = http.get("msg_per_s")
    else:
        return None
    return float(value) if isinstance(value, int | float) else None


def target_rows(doc: Doc) -> list[list[str]]:
    rows = []
    for outcome in evaluate(doc.get("scenarios", {})):
        ceiling = _ceiling_figure(doc, outcome.scenario, outcome.target)
        rows.append(
            [
                outcome.scenario,
                outcome.target,
                _n(outcome.measured, _spec(outcome.measured)),
                outcome.status.upper() if outcome.status == "miss" else outcome.status,
                _n(ceiling, _spec(ceiling)),
            ]
        )
    return rows


TARGET_HEADERS = ["scenario", "target", "measured", "result", "HTTP ceiling's own"]


def _per_msg(seconds: Any, messages: float) -> float | None:
    return float(seconds) / messages if isinstance(seconds, int | float) and messages else None


def budget_rows(doc: Doc) -> list[list[str]]:
    """For every throughput target: the msg/s it asks for and the CPU that would take at the
    CPU per message this run measured. One broker process cannot use more than one core, and
    broker, database and load generator together cannot use more than the machine has."""
    scenarios = doc.get("scenarios", {})
    ceilings = doc.get("http_ceilings", {})
    cores = (doc.get("machine") or {}).get("cores")
    rows = []
    for target in TARGETS:
        record = scenarios.get(target.scenario) or {}
        if target.what == "msg/s ÷ HTTP ceiling":
            ceiling = (ceilings.get(record.get("http_ceiling", "")) or {}).get("msg_per_s")
            needed = target.limit * ceiling if isinstance(ceiling, int | float) else None
        elif target.what == "msg/s":
            needed = target.limit
        else:
            continue
        rate, seconds = record.get("msg_per_s"), record.get("seconds")
        if not needed or not isinstance(rate, int | float) or not isinstance(seconds, int | float):
            continue
        messages = rate * seconds
        broker = _per_msg(record.get("server_cpu_s"), messages)
        db = _per_msg(record.get("db_cpu_s"), messages)
        load = _per_msg(record.get("wrk_cpu_s"), messages)
        if broker is None or db is None or load is None:
            continue
        per_process = needed * broker / max(1, int(record.get("workers") or 1))
        machine = needed * (broker + db + load)
        beyond = []
        if per_process > 1:
            beyond.append("one process (1 core)")
        if isinstance(cores, int) and machine > cores:
            beyond.append(f"the machine ({cores} cores)")
        verdict = "beyond " + " and ".join(beyond) if beyond else "within reach"
        rows.append(
            [
                target.scenario,
                target.describe(),
                _n(needed),
                _n(per_process, ".2f"),
                _n(machine, ".2f"),
                verdict,
            ]
        )
    return rows


BUDGET_HEADERS = [
    "scenario",
    "target",
    "needs msg/s",
    "cores per broker process",
    "cores in all (broker + DB + wrk)",
    "at this run's CPU per message",
]


def other_load(doc: Doc) -> float | None:
    """Mean CPU (cores) that processes outside the benchmark used during the wrk windows."""
    values = [
        r["other_cores"]
        for group in ("scenarios", "http_ceilings")
        for r in doc.get(group, {}).values()
        if isinstance(r.get("other_cores"), int | float)
    ]
    return sum(values) / len(values) if values else None


def busy_warning(doc: Doc) -> str | None:
    load = other_load(doc)
    if load is None or load < BUSY_CORES:
        return None
    return (
        f"warning: other processes used {load:.2f} cores on average during the measurements; "
        "these figures are distorted (a quiet machine shows ~0)"
    )


BUSY_CORES = 0.15


def terminal(doc: Doc) -> str:
    """The tables printed at the end of a run."""
    parts = ["Scenarios", table(SCENARIO_HEADERS, scenario_rows(doc), markdown=False)]
    if doc.get("http_ceilings"):
        parts += ["", "HTTP ceilings", table(HTTP_HEADERS, http_rows(doc), markdown=False, left=2)]
    if doc.get("pg_ceilings"):
        parts += [
            "",
            "PostgreSQL ceilings",
            table(PG_HEADERS, pg_rows(doc), markdown=False, left=2),
        ]
        headers, rows = fraction_rows(doc)
        parts += ["", "Broker msg/s as a fraction of each ceiling"]
        parts += [table(headers, rows, markdown=False, left=2)]
    parts += ["", "Targets", table(TARGET_HEADERS, target_rows(doc), markdown=False, left=2)]
    budget = budget_rows(doc)
    if budget:
        parts += ["", "What the throughput targets would take, at this run's CPU per message"]
        parts += [table(BUDGET_HEADERS, budget, markdown=False, left=2)]
    warning = busy_warning(doc)
    if warning:
        parts += ["", warning]
    return "\n".join(parts)


def _machine_lines(doc: Doc) -> list[str]:
    m = doc.get("machine", {})
    db = doc.get("database", {})
    o = doc.get("options", {})
    packages = ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items())
    settings = ", ".join(f"{k}={v}" for k, v in db.get("settings", {}).items())
    env = ", ".join(f"{k}={v}" for k, v in doc.get("broker_env", {}).items()) or "none"
    return [
        f"- CPU: {m.get('cpu')}, {m.get('cores')} cores; memory {m.get('memory_gib')} GiB",
        f"- OS: {m.get('os')}, kernel {m.get('kernel')}; Python {m.get('python')}",
        f"- Packages: {packages}",
        f"- Database: {db.get('description')}, {db.get('version')} ({settings})",
        f"- Load generator: {doc.get('wrk')}, {o.get('wrk_threads', 1)} thread, same machine",
        f"- Broker settings from the environment: {env}",
        f"- Load average before / after: {m.get('load_average')} / "
        f"{doc.get('load_average_after')}; CPU used by other processes during the "
        f"measurements: {_n(other_load(doc), '.2f')} cores on average",
        f"- Windows: warm-up {o.get('warmup_s')} s + {o.get('duration_s')} s per wrk run; "
        f"PostgreSQL ceilings {o.get('pg_warmup_s')} s + {o.get('pg_duration_s')} s, "
        f"G = {o.get('pg_group')} batches, {o.get('pg_connections')} connections",
    ]


def _legend(doc: Doc) -> list[str]:
    lines = []
    for name, r in doc.get("scenarios", {}).items():
        note = f" ({r['note']})" if r.get("note") else ""
        lines.append(f"- {name}: {r.get('description', '')}{note}")
    return lines


def markdown(doc: Doc, *, command: str) -> str:
    """RESULTS.md for a run."""
    headers, rows = fraction_rows(doc)
    out = [
        "# Push benchmark results",
        "",
        f"Run `{doc.get('run_id')}`, started {doc.get('started_at')}, produced by `{command}`.",
        "Broker, database and load generator share the machine.",
        *([f"**{busy_warning(doc)}**"] if busy_warning(doc) else []),
        "",
        "## Machine",
        "",
        *_machine_lines(doc),
        "",
        "## Scenarios",
        "",
        *_legend(doc),
        "",
        table(SCENARIO_HEADERS, scenario_rows(doc), markdown=True),
        "",
        "## Targets",
        "",
        table(TARGET_HEADERS, target_rows(doc), markdown=True, left=2),
        "",
        "What the throughput targets would take, at the CPU per message measured in this run",
        "(a broker process runs Python on one core at most):",
        "",
        table(BUDGET_HEADERS, budget_rows(doc), markdown=True, left=2),
        "",
        "## Ceilings measured in the same run",
        "",
        table(HTTP_HEADERS, http_rows(doc), markdown=True, left=2),
        "",
        table(PG_HEADERS, pg_rows(doc), markdown=True, left=2),
        "",
        "Broker msg/s as a fraction of each ceiling:",
        "",
        table(headers, rows, markdown=True, left=2),
        "",
        "## How the figures are measured",
        "",
        METHOD,
    ]
    return "\n".join(out)

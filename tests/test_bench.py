"""The benchmark harness's pure parts: wrk reports, /proc and /metrics readings, targets,
the run plan and the report. No load is generated here."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import trio

from bench import report, runner, servers, wrk
from bench.runner import Options, plan
from bench.scenarios import ALL, SCENARIOS, evaluate, select
from bench.wrk import WrkError, parse_report

WRK_OK = """\
Running 25s test @ http://127.0.0.1:41234/api/v1/push
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    73.57ms   30.12ms    1.20s    70.00%
    Req/Sec     0.86k   123.45     1.02k    66.67%
  Latency Distribution
     50%   67.13ms
     75%   88.12ms
     90%  122.08ms
     99%  163.16ms
  21657 requests in 25.08s, 10.23MB read
  Socket errors: connect 0, read 2, write 0, timeout 5
  Non-2xx or 3xx responses: 7
Requests/sec:    863.52
Transfer/sec:    417.70KB
"""

WRK_FAST = """\
Running 1s test @ http://127.0.0.1:6755/api/v1/push
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   812.00us    1.24ms  17.14ms   96.12%
    Req/Sec     1.64k   135.36     1.76k    90.00%
  Latency Distribution
     50%  733.00us
     75%    2.52ms
     90%    2.84ms
     99%    8.05ms
  1643 requests in 1.01s, 1.26MB read
Requests/sec:   1633.44
Transfer/sec:      1.25MB
"""


def test_wrk_report_is_read_with_units_and_errors() -> None:
    r = parse_report(WRK_OK)
    assert r.requests == 21657
    assert r.duration_s == pytest.approx(25.08)
    assert r.latency_avg_ms == pytest.approx(73.57)
    assert r.latency_max_ms == pytest.approx(1200.0)
    assert r.percentiles_ms == {"50": 67.13, "75": 88.12, "90": 122.08, "99": 163.16}
    assert r.non_2xx == 7
    assert r.socket_errors == {"connect": 0, "read": 2, "write": 0, "timeout": 5}
    assert r.errors == 14
    assert r.requests_per_s == pytest.approx((21657 - 7) / 25.08)

    fast = parse_report(WRK_FAST)
    assert fast.percentiles_ms["50"] == pytest.approx(0.733)
    assert fast.latency_avg_ms == pytest.approx(0.812)
    assert fast.non_2xx == 0 and fast.socket_errors == {}


def test_wrk_report_without_results_is_an_error() -> None:
    with pytest.raises(WrkError, match="no result"):
        parse_report("unable to connect to 127.0.0.1:1 Connection refused\n")


def test_missing_wrk_is_installed_or_named_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    class Result:
        returncode = 100
        stdout = ""
        stderr = "E: Unable to locate package wrk"

    def run(argv: list[str], **_kw: object) -> Result:
        calls.append(argv)
        return Result()

    monkeypatch.setattr(wrk.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        wrk.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None
    )
    monkeypatch.setattr(wrk.subprocess, "run", run)
    with pytest.raises(WrkError, match=r"Unable to locate package wrk.*Install wrk"):
        wrk.ensure_wrk()
    assert calls == [
        ["apt-get", "install", "-y", "-q", "wrk"],
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "wrk"],
    ]

    monkeypatch.setattr(wrk.shutil, "which", lambda name: None)
    with pytest.raises(WrkError, match="apt-get is not available"):
        wrk.ensure_wrk()


def test_proc_stat_with_a_command_name_holding_spaces_and_parens() -> None:
    fields = ["S", "41"] + ["0"] * 9 + ["300", "100", "50", "50"] + ["0"] * 30
    stat = servers.parse_stat("1234 (my (odd) proc) " + " ".join(fields))
    assert (stat.pid, stat.ppid, stat.comm) == (1234, 41, "my (odd) proc")
    assert stat.cpu_s == pytest.approx(500 / servers._TICKS)


def test_tree_cpu_counts_live_descendants_only_once() -> None:
    stats = {
        1: servers.ProcStat(1, 0, "init", 100.0),
        10: servers.ProcStat(10, 1, "queen", 2.0),  # parent of two workers
        11: servers.ProcStat(11, 10, "python", 3.0),
        12: servers.ProcStat(12, 10, "python", 4.0),
        13: servers.ProcStat(13, 12, "python", 0.5),
        20: servers.ProcStat(20, 1, "postgres", 7.0),
    }
    assert servers.descendants([10], stats) == {10, 11, 12, 13}
    assert servers.tree_cpu_s([10], stats) == pytest.approx(9.5)
    assert servers.tree_cpu_s([11, 20, 99], stats) == pytest.approx(10.0)


def test_machine_busy_time_leaves_out_idle_and_iowait() -> None:
    line = "cpu  1000 10 500 90000 300 20 30 40 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert servers.machine_busy_s(line) == pytest.approx(1600 / servers._TICKS)


METRICS_TEXT = """\
# TYPE queen_push_requests_total counter
queen_push_requests_total 120
queen_push_transactions_total 10.0
queen_push_segments_total 40
queen_push_requests_committed_total 100
queen_some_labelled{kind="x"} 5
# TYPE queen_process_id gauge
queen_process_id 4242
"""


def test_metrics_text_is_parsed() -> None:
    values = runner.parse_metrics(METRICS_TEXT)
    assert values["queen_push_requests_total"] == 120
    assert values["queen_process_id"] == 4242
    assert "queen_some_labelled" not in values
    assert runner.process_count(METRICS_TEXT) == 1


def test_a_workers_answer_counts_every_worker() -> None:
    text = (
        "# TYPE queen_process_id gauge\n"
        'queen_process_id{pid="11",worker="0"} 11.0\n'
        'queen_process_id{pid="12",worker="1"} 12.0\n'
    )
    assert runner.process_count(text) == 2


def test_window_figures_count_a_counter_absent_before_from_zero() -> None:
    before = {"queen_push_transactions_total": 10, "queen_push_segments_total": 30}
    after = {
        "queen_push_transactions_total": 35,
        "queen_push_segments_total": 120,
        "queen_push_requests_committed_total": 250,
        "queen_push_items_failed_total": 2,
        "queen_push_items_buffered_total": 1,
    }
    f = runner.push_figures(before, after)
    assert f["push_transactions"] == 25 and f["push_segments"] == 90
    assert f["push_requests_committed"] == 250  # absent before: counted from zero
    assert f["push_items"] == 0
    assert f["failed"] == 3  # failed + buffered: not stored by this run
    assert f["requests_per_tx"] == pytest.approx(10.0)
    assert f["partitions_per_tx"] == pytest.approx(3.6)
    assert runner.push_figures({}, {})["requests_per_tx"] is None


def _record(msg: float, **extra: object) -> dict[str, object]:
    return {"msg_per_s": msg, **extra}


def test_targets_pass_miss_and_not_available() -> None:
    records = {
        "S1": _record(1000, vs_http=0.7, requests_per_tx=8.0, latency_ms={"p99": 50.1}, rss_mb=80),
        "S3": _record(59_999, vs_http=0.9),
        "S4": _record(750, rss_mb=500),
        "S5": _record(790),
    }
    got = {(o.scenario, o.target): o for o in evaluate(records)}
    assert got[("S1", "msg/s ÷ HTTP ceiling ≥ 0.7")].status == "pass"
    assert got[("S1", "requests/transaction ≥ 8")].status == "pass"
    assert got[("S1", "p99 latency ms ≤ 50")].status == "miss"
    assert got[("S3", "msg/s ÷ HTTP ceiling ≥ 0.6")].status == "pass"
    assert got[("S3", "msg/s ≥ 60000")].status == "miss"
    assert got[("S4", "msg/s ÷ S1 msg/s ≥ 0.75")].status == "pass"
    assert got[("S4", "msg/s ÷ S1 msg/s ≥ 0.75")].measured == pytest.approx(0.75)
    assert got[("S4", "broker RSS MB < 500")].status == "miss"  # strictly below
    assert got[("S5", "msg/s ÷ S1 msg/s ≥ 0.8")].status == "miss"

    without_s1 = evaluate({"S4": _record(750, rss_mb=100), "S3": _record(70_000)})
    status = {(o.scenario, o.target): o.status for o in without_s1}
    assert status[("S4", "msg/s ÷ S1 msg/s ≥ 0.75")] == "n/a"
    assert status[("S4", "broker RSS MB < 500")] == "pass"
    assert status[("S3", "msg/s ÷ HTTP ceiling ≥ 0.6")] == "n/a"  # no ceiling measured
    assert status[("S1", "p99 latency ms ≤ 50")] == "n/a"


def test_scenarios_are_selected_by_name() -> None:
    assert [s.name for s in select("s3, S1,S3")] == ["S1", "S3"]
    assert [s.name for s in select("all")] == list(ALL)
    with pytest.raises(ValueError, match="unknown scenario"):
        select("S9")
    assert SCENARIOS["S5"].load.duplicates
    assert SCENARIOS["S6"].workers == 2


def test_plan_runs_each_ceiling_once_beside_its_first_scenario() -> None:
    steps = plan(Options(select("S1,S2,S3,S4,S5,S6")))
    labels = [(s.kind, s.name) for s in steps]
    assert labels[:3] == [("http", "H1"), ("broker", "S1"), ("pg", "P1")]
    assert [n for k, n in labels if k == "http"] == ["H1", "H2", "H3", "H3x2"]
    assert [n for k, n in labels if k == "broker"] == ["S1", "S2", "S3", "S4", "S5", "S6"]
    assert [n for k, n in labels if k == "pg"] == ["P1", "P2", "P3"]
    assert labels.index(("http", "H3x2")) == labels.index(("broker", "S6")) - 1
    bare = plan(Options(select("S4"), http_ceilings=False, pg_ceilings=False))
    assert [(s.kind, s.name) for s in bare] == [("broker", "S4")]


def test_cpu_budget_of_the_throughput_targets() -> None:
    doc: dict[str, Any] = {
        "machine": {"cores": 2},
        "http_ceilings": {"H3": {"msg_per_s": 150_000.0}},
        "scenarios": {
            # 1 ms of broker CPU per 100 messages: 90,000 msg/s would need 0.9 cores
            "S3": {
                "http_ceiling": "H3",
                "msg_per_s": 50_000.0,
                "seconds": 10.0,
                "workers": 1,
                "server_cpu_s": 5.0,
                "db_cpu_s": 6.0,
                "wrk_cpu_s": 0.5,
            }
        },
    }
    rows = {row[1]: row for row in report.budget_rows(doc)}
    ratio = rows["msg/s ÷ HTTP ceiling ≥ 0.6"]
    assert ratio[2:] == ["90,000", "0.90", "2.07", "beyond the machine (2 cores)"]
    assert rows["msg/s ≥ 60000"][2:] == ["60,000", "0.60", "1.38", "within reach"]
    doc["scenarios"]["S3"]["server_cpu_s"] = 6.0  # now 1.08 cores for one process
    verdict = {row[1]: row for row in report.budget_rows(doc)}["msg/s ÷ HTTP ceiling ≥ 0.6"][5]
    assert verdict == "beyond one process (1 core) and the machine (2 cores)"
    assert report.budget_rows({"scenarios": {}}) == []


def test_report_renders_a_partial_run() -> None:
    doc = {
        "run_id": "r1",
        "options": {"duration_s": 3},
        "scenarios": {
            "S1": {
                "description": "1 item/request",
                "msg_per_s": 900.0,
                "vs_http": 0.6,
                "vs_pg": {"fn": 1.2, "fn-merged": 0.1},
                "latency_ms": {"p50": 10.0, "p99": 40.0, "max": 90.0},
                "requests_per_tx": 9.5,
                "errors": {"non_2xx": 0},
                "http_ceiling": "H1",
            }
        },
        "http_ceilings": {"H1": {"description": "1 item/request", "msg_per_s": 1500.0}},
        "pg_ceilings": {"P1": {"fn": {"msg_per_s": 750.0, "group": 1}}},
    }
    text = report.terminal(doc)
    assert "0.10 (fn-merged)" in text
    assert "MISS" in text  # S1 vs HTTP 0.6 < 0.7
    md = report.markdown(doc, command="./bench/run.sh")
    assert "| S1 | 900 | 0.60 |" in md
    assert "| S3 | msg/s ≥ 60000 | - | n/a | - |" in md
    assert "warning" not in text  # no window recorded any load from other processes

    doc["scenarios"]["S1"]["other_cores"] = 0.9
    assert "distorted" in report.terminal(doc)


async def test_postgres_ceiling_writes_for_real(broker: Any, pg_url: str) -> None:
    """A very short run of the PostgreSQL ceiling against the test database: the harness must
    keep calling the broker's store the way the store expects."""
    import trio

    from bench.runner import run_pg_ceiling
    from bench.scenarios import PgShape
    from bench.servers import Database

    db = Database(conninfo=pg_url, description="test")
    result = await trio.to_thread.run_sync(
        lambda: run_pg_ceiling(
            db,
            PgShape("T", 10, 3),
            seconds=0.2,
            warmup_s=0.05,
            group=2,
            connections=1,
            queue_prefix="bench-smoke-",
            tag="smoke",
        )
    )
    assert result["frames"] > 0 and result["commits"] > 0
    assert result["variant"] == "fn-merged"


def test_embedding_and_consume_scenarios_are_planned_without_http_ceilings() -> None:
    chosen = select("c2,E1,s1,e3")
    assert [s.name for s in chosen] == ["S1", "E1", "E3", "C2"]
    labels = [(s.kind, s.name) for s in plan(Options(chosen))]
    assert labels == [
        ("http", "H1"),
        ("broker", "S1"),
        ("pg", "P1"),
        ("embedded", "E1"),  # P1 already measured beside S1
        ("embedded", "E3"),
        ("pg", "P3"),
        ("consume", "C2"),
    ]
    everything = [s.name for s in select("all")]
    assert everything[-6:] == ["E1", "E2", "E3", "C1", "C2", "C3"]


def test_targets_of_the_embedding_api_and_the_consume_side() -> None:
    records = {
        "S3": _record(60_000),
        "E1": _record(15_000, vs_pg={"fn": 2.0, "fn-merged": 0.7}),
        "E2": _record(20_000, vs_pg={"fn": 1.5, "fn-merged": 0.69}),
        "C1": _record(30_000),
        "C2": _record(2_500, single_pop_ms={"p50": 5.5}),
        "C3": _record(29_999),
    }
    got = {(o.scenario, o.target): o.status for o in evaluate(records)}
    assert got[("E1", "msg/s ÷ P1 fn-merged ≥ 0.7")] == "pass"
    assert got[("E2", "msg/s ÷ P2 fn-merged ≥ 0.7")] == "miss"
    assert got[("E3", "msg/s ÷ P3 fn-merged ≥ 0.7")] == "n/a"
    assert got[("C1", "msg/s ÷ S3 msg/s ≥ 0.5")] == "pass"
    assert got[("C2", "msg/s ≥ 2000")] == "pass"
    assert got[("C2", "single pop p50 ms ≤ 5")] == "miss"
    assert got[("C3", "msg/s ÷ S3 msg/s ≥ 0.5")] == "miss"
    del records["S3"]
    without_s3 = {(o.scenario, o.target): o.status for o in evaluate(records)}
    assert without_s3[("C1", "msg/s ÷ S3 msg/s ≥ 0.5")] == "n/a"


def test_report_shows_embedding_and_consume_tables() -> None:
    doc = {
        "run_id": "r2",
        "embedded": {
            "E1": {
                "description": "broker.push(): 1 item/call",
                "msg_per_s": 14_000.0,
                "vs_pg": {"fn-merged": 0.66},
                "latency_ms": {"p50": 4.0, "p99": 9.0},
                "errors": {"failed_items": 0},
            }
        },
        "consume": {
            "C2": {
                "description": "10,000 messages in 10,000 partitions",
                "msg_per_s": 2_345.0,
                "messages": 9_900,
                "pop_ms": {"p50": 3.0, "p99": 8.0},
                "ack_ms": {"p50": 1.0, "p99": 2.0},
                "single_pop_ms": {"p50": 1.5},
                "finished": False,
            }
        },
    }
    text = report.terminal(doc)
    assert "Scenarios" not in text  # no HTTP scenario in this run
    assert "E1" in text and "0.66" in text
    md = report.markdown(doc, command="./bench/run.sh --scenarios E1,C2")
    assert "| E1 | 14,000 | 0.66 |" in md
    assert "| C2 | 2,345 | 9,900 | 3.0 | 8.0 | 1.0 | 2.0 | 1.5 |" in md
    assert md.count("| NO |") == 1  # the drain did not finish
    assert "| E1 | msg/s ÷ P1 fn-merged ≥ 0.7 | 0.66 | MISS |" in md


def test_written_results_keep_what_was_written_by_hand() -> None:
    first = report.merge_results(None, "# Results\n\nrun 1")
    assert first.startswith(report.BEGIN) and first.rstrip().endswith(report.END)
    by_hand = "Intro by hand.\n\n" + first + "\n## Memory under big bodies\n\nkept\n"
    second = report.merge_results(by_hand, "# Results\n\nrun 2\n")
    assert second.startswith("Intro by hand.\n\n" + report.BEGIN)
    assert "run 2" in second and "run 1" not in second
    assert second.endswith("\n## Memory under big bodies\n\nkept\n")
    with pytest.raises(ValueError, match="no generated section"):
        report.merge_results("## Memory under big bodies\n", "# Results")


def test_the_results_file_has_its_generated_section() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "bench" / "RESULTS.md").read_text()
    merged = report.merge_results(text, "# Results")
    assert "## Memory under big bodies" in merged


async def test_embedding_scenario_pushes_for_real(broker: Any) -> None:
    """A very short in-process push step: every call answered, items counted."""
    from bench import inproc
    from bench.scenarios import Load

    args = inproc.parser().parse_args(
        ["E1", "--database-url", "unused", "--duration", "0.3", "--warmup", "0.1"]
    )
    args.queue_prefix = "bench-smoke-"
    record = await inproc.embedded(broker, "E1", Load(2, 4, 3), args)
    assert record["msg_per_s"] > 0 and record["errors"] == {"failed_items": 0}
    assert record["latency_ms"]["p50"] > 0
    assert record["requests_per_tx"] is not None


async def test_embedding_scenario_without_dedup_writes_no_sidecar_rows(broker: Any) -> None:
    """``--dedup-window 0`` makes the step's queue without a dedup window before pushing: its
    messages are stored and none leaves a sidecar row; the default queue's each leave one."""
    from bench import inproc
    from bench.scenarios import Load

    held = {}
    for prefix, extra in (("bench-nodedup-", ["--dedup-window", "0"]), ("bench-dedup-", [])):
        args = inproc.parser().parse_args(
            ["E1", "--database-url", "unused", "--duration", "0.2", "--warmup", "0", *extra]
        )
        args.queue_prefix = prefix
        record = await inproc.embedded(broker, "E1", Load(2, 4, 3), args)
        assert record["errors"] == {"failed_items": 0}
        held[prefix] = await broker.queue_holdings(f"{prefix}e1")
    off, on = held["bench-nodedup-"], held["bench-dedup-"]
    assert off.dedup_window_seconds == 0 and off.messages > 0 and off.sidecar_entries == 0
    assert on.dedup_window_seconds > 0 and on.sidecar_entries == on.messages > 0


async def test_consume_scenario_drains_for_real(broker: Any) -> None:
    """A tiny C step with a fan-out and single pops: every message is acked by the second
    group, none left."""
    from bench import inproc
    from bench.scenarios import ConsumeLoad

    args = inproc.parser().parse_args(["C3", "--database-url", "unused"])
    args.queue_prefix = "bench-smoke-"
    load = ConsumeLoad("T", 120, 7, 3, 10, fan_out=True, single_pops=True)
    record = await inproc.consume(broker, load, args)
    assert record["finished"]
    assert record["messages"] + inproc.SINGLE_POPS == 120
    assert record["single_pop_ms"]["p50"] > 0 and record["pop_ms"]["p99"] > 0
    left = await broker.pop("bench-smoke-t", batch=10, consumer_group="bench-second")
    assert not left


def _peer_doc() -> dict[str, Any]:
    def steps(*rates: float, **figures: float) -> list[dict[str, Any]]:
        return [{"msg_per_s": r, **figures} for r in rates]

    return {
        "machine": {"cores": 2},
        "shapes": {
            "S1": {
                "description": "push",
                "steps": {
                    "original": steps(5000.0, 7000.0, server_cores=0.5, db_cpu_s_per_100k=6.0),
                    "ours": steps(3000.0, server_cores=1.6, db_cpu_s_per_100k=8.0),
                    "stack": steps(4500.0, server_cores=1.9),
                    "hypercorn": steps(
                        5400.0,
                        5600.0,
                        server_cores=1.8,
                        server_cpu_s_per_100k=30.0,
                        client_cpu_s_per_100k=4.0,
                    ),
                },
            },
            "C1": {"description": "consume", "steps": {"original": steps(10.0)}},
            "PIPE": {
                "description": "pipeline",
                "steps": {
                    "original": steps(
                        500.0,
                        client_cpu_s_per_100k=200.0,
                        db_cpu_s_per_100k=200.0,
                        server_cpu_s_per_100k=100.0,
                    ),
                    "ours": steps(
                        200.0,
                        client_cpu_s_per_100k=300.0,
                        db_cpu_s_per_100k=200.0,
                        server_cpu_s_per_100k=500.0,
                    ),
                },
            },
        },
    }


def test_peer_report_sets_the_push_shapes_beside_the_http_stack_alone() -> None:
    from bench import peer_report

    rows = peer_report.ceiling_rows(_peer_doc())
    assert [r[0] for r in rows] == ["S1"]  # only shapes measured against the stack
    (s1,) = rows
    assert s1[1:5] == ["6,000", "3,000", "4,500", "5,500"]  # means over the rounds
    assert s1[5:8] == ["0.67", "0.75", "0.92"]  # ours ÷ stack, stack and Hypercorn ÷ original
    assert s1[8] == "1.90 / 1.80"
    # 2 cores x 100k ÷ (30 s bare Hypercorn + 4 s wrk + 6 s PostgreSQL, the cheaper side's)
    assert s1[9:] == ["5,000", "0.83"]
    assert "bare Hypercorn" in peer_report.terminal(_peer_doc())


def test_peer_report_says_what_the_cores_hold_in_the_pipeline() -> None:
    from bench import peer_report

    rows = {r[0]: r for r in peer_report.pipeline_bound_rows(_peer_doc())}
    # original: 2 cores x 100k ÷ 500 s at its costs, ÷ 400 s without its broker
    assert rows["original"][4] == "400" and rows["original"][6] == "500"
    assert rows["original"][7] == "1.00"
    # ours: 2 x 100k ÷ 1,000 s; with a broker costing nothing, ÷ 500 s: 400 = 0.80 x 500
    assert rows["ours"][4] == "200" and rows["ours"][6] == "400"
    assert rows["ours"][7] == "0.80"


def test_peer_run_measures_the_http_stack_only_at_the_push_shapes() -> None:
    from bench.peer_run import CEILINGS, SIDES, PeerOptions, PeerRun

    run = PeerRun(PeerOptions(shapes=["S1", "C1", "PIPE"]))
    assert run._sides("S1") == SIDES + CEILINGS
    assert run._sides("C1") == SIDES and run._sides("PIPE") == SIDES
    bare = PeerRun(PeerOptions(shapes=["S1"], ceilings=False))
    assert bare._sides("S1") == SIDES


async def test_held_stack_answers_a_push_only_after_its_hold(autojump_clock: Any) -> None:
    """``bench.held``'s stack: the same route, answering ``hold_s`` after the body."""
    import trio

    from bench.http_ceiling import create_app

    body = b'{"items": [{"queue": "q", "payload": 1}]}'
    for hold_s in (0.0, 0.25):
        client = create_app(1 << 20, hold_s).test_client()
        start = trio.current_time()
        answer = await client.post("/api/v1/push", data=body)
        took = trio.current_time() - start
        assert answer.status_code == 201 and (await answer.get_json())[0]["status"] == "queued"
        assert took >= 0.25 if hold_s else took < 0.25


def test_held_report_holds_the_stack_for_ours_latency_and_divides_by_both() -> None:
    from bench import held

    assert held.hold_for({"p50_ms": 1.5}, {"p50_ms": 20.0}) == 18.5
    assert held.hold_for({"p50_ms": 3.0}, {"p50_ms": 2.0}) == 0.0  # never negative
    # a try held 8 ms gave a median of 25 ms, not 18: the median grew 16 ms for 8 of hold
    tried = {"hold_ms": 8.0, "p50_ms": 25.0}
    assert held.hold_for({"p50_ms": 9.0}, {"p50_ms": 17.0}, tried) == 4.0

    def step(r: int, side: str, rate: float, us: float, p50: float, hold: float = 0.0) -> Any:
        return {
            "round": r,
            "shape": "S2",
            "side": side,
            "requests_per_s": rate,
            "us_per_msg": us,
            "p50_ms": p50,
            "hold_ms": hold,
        }

    steps = [
        step(1, "stack", 6000, 27.0, 2.0),
        step(1, "ours", 1600, 64.0, 20.0),
        step(1, "held", 1500, 40.0, 21.0, 18.0),
        step(1, "floor", 5000, 32.0, 2.0),
        step(2, "stack", 6000, 29.0, 2.0),
        step(2, "ours", 1600, 66.0, 20.0),
        step(2, "held", 1500, 44.0, 21.0, 18.0),
        step(2, "floor", 5000, 32.0, 2.0),
    ]
    (row,) = held.rows(steps)
    assert row[0] == "S2" and row[1] == "1,600 / 65.0 / 20.0" and row[2] == "18.0"
    assert row[3] == "1,500 / 42.0 / 21.0" and row[4] == "6,000 / 28.0"
    # ours ÷ bare, the held stack ÷ bare, ours ÷ the held stack
    assert row[6:] == [f"{65 / 32:.2f}", f"{42 / 32:.2f}", f"{65 / 42:.2f}"]


async def test_bare_hypercorn_floor_answers_a_push_as_the_broker_does() -> None:
    import orjson

    from bench.hypercorn_floor import app

    async def call(method: str, path: str, body: bytes) -> tuple[int, Any]:
        sent: list[dict[str, Any]] = []
        chunks = [
            {"type": "http.request", "body": body[:5], "more_body": True},
            {"type": "http.request", "body": body[5:], "more_body": False},
        ]

        async def receive() -> dict[str, Any]:
            return chunks.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path}
        await app(scope, receive, send)  # type: ignore[arg-type]
        return sent[0]["status"], orjson.loads(sent[1]["body"])

    body = orjson.dumps({"items": [{"queue": "q", "payload": 1, "transactionId": "t"}, {}]})
    status, answer = await call("POST", "/api/v1/push", body)
    assert status == 201
    first = answer[0]
    assert (first["index"], first["transactionId"], first["status"]) == (0, "t", "queued")
    assert (
        answer[1]["partition"] == "Default" and answer[1]["transactionId"] == answer[1]["messageId"]
    )
    status, _ = await call("POST", "/api/v1/push", b"not json at all")
    assert status == 400


async def test_call_counts_are_split_by_module(broker: Any) -> None:
    """A tiny in-process count: every push profiled, the drivers left out of the figures."""
    from bench import inproc

    args = inproc.parser().parse_args(["calls", "--requests", "3", "--tasks", "2"])
    args.queue_prefix = "bench-smoke-"
    record = await inproc.count_calls(broker, "E2", args)
    assert record["items"] == 30 and 10 <= record["segments"] <= 30  # some may coalesce
    groups = record["per_item"]
    assert groups["actors"] > 0 and groups["storage"] > 0 and groups["trio"] > 0
    assert "bench" not in groups
    assert record["calls_per_request"] == pytest.approx(record["calls_per_item"] * 10)
    assert "| E2 | 2 |" in inproc.calls_table([record])


def _pgmq_step(shape: str, r: int, side: str, msg_per_s: float, cpu: float) -> dict[str, Any]:
    return {
        "shape": shape,
        "round": r,
        "side": side,
        "msg_per_s": msg_per_s,
        "latency_ms": {"p50": 2.0, "p99": 9.0},
        "server_cpu_s_per_100k": cpu / 2,
        "db_cpu_s_per_100k": cpu / 2,
        "other_cores": 0.1,
    }


def test_pgmq_options_need_the_sql_file_and_known_shapes(tmp_path: Any) -> None:
    from bench import pgmq

    sql = tmp_path / "pgmq.sql"
    sql.write_text("-- pgmq")
    args = pgmq.parse(["--pgmq-sql", str(sql), "--shapes", "e1, E2", "--rounds", "4"])
    assert (args.shapes, args.rounds, args.pg_bin) == (["E1", "E2"], 4, None)
    for bad in (
        [],  # no --pgmq-sql
        ["--pgmq-sql", str(tmp_path / "missing.sql")],
        ["--pgmq-sql", str(sql), "--shapes", "S1"],
        ["--pgmq-sql", str(sql), "--rounds", "0"],
        ["--pgmq-sql", str(sql), "--pg-bin", str(tmp_path)],  # no postgres there
        ["--drive", "E1"],  # a step needs its database
    ):
        with pytest.raises(SystemExit):
            pgmq.parse(bad)
    assert pgmq.parse(["--render", "a.json", "b.json"]).render[1].name == "b.json"


def test_pgmq_report_pairs_each_round_and_judges_the_medians() -> None:
    from bench import pgmq

    steps = [
        # E1 (target 3x): ours 3.5x, 2.5x, 4x PGMQ's msg/s; CPU per message 4x better
        _pgmq_step("E1", 1, "ours", 7000, 5.0),
        _pgmq_step("E1", 1, "pgmq", 2000, 20.0),
        _pgmq_step("E1", 2, "pgmq", 2000, 20.0),
        _pgmq_step("E1", 2, "ours", 5000, 5.0),
        _pgmq_step("E1", 3, "ours", 8000, 5.0),
        _pgmq_step("E1", 3, "pgmq", 2000, 20.0),
        # E2 (target 1.5x): ours 2x the msg/s, CPU per message only 1.25x less
        _pgmq_step("E2", 1, "ours", 20000, 2.0),
        _pgmq_step("E2", 1, "pgmq", 10000, 2.5),
        _pgmq_step("E2", 2, "ours", 20000, 2.0),  # round 2 of PGMQ missing: not paired
    ]
    speed, cpu = pgmq.ratios(steps, "E1")
    assert speed == pytest.approx([3.5, 2.5, 4.0]) and cpu == pytest.approx([4.0] * 3)
    assert pgmq.ratios(steps, "E2") == (pytest.approx([2.0]), pytest.approx([1.25]))
    doc = {
        "run_id": "r1",
        "database": {"version": "PostgreSQL 15.18", "description": "Debian's"},
        "pgmq_sql": {"path": "pgmq.sql", "sha256": "abc"},
        "shapes": {"E1": "1 item", "E2": "10 items"},
        "steps": steps,
    }
    rows = {row[0]: row for row in pgmq.summary_rows(doc)}
    assert rows["E1"][4] == "3.50 (2.50-4.00)" and rows["E1"][6:] == ["3x", "yes", "yes"]
    assert rows["E2"][5] == "1.25 (1.25-1.25)" and rows["E2"][6:] == ["1.5x", "yes", "no"]
    text = pgmq.render(doc, markdown=True)
    assert text.startswith("## Beside PGMQ: PostgreSQL 15.18")
    assert "| 2 | E1 | pgmq | 2,000 | 2.0 | 9.0 | 10.00 | 10.00 | 20.00 | 0.10 |" in text
    assert (
        "| E1 | 1 | 7,000 | 2,000 | 3.50 (2.50-4.00) | 4.00 (4.00-4.00) | 3x | yes | yes |" in text
    )


def test_pgmq_report_sets_ours_without_dedup_beside_pgmq_apart_from_the_target() -> None:
    from bench import pgmq

    steps = [
        _pgmq_step("E2", 1, "ours", 20000, 2.0),
        _pgmq_step("E2", 1, "pgmq", 10000, 2.5),
        _pgmq_step("E2", 1, pgmq.NO_DEDUP, 25000, 1.25),
        _pgmq_step("E2", 2, pgmq.NO_DEDUP, 25000, 1.0),
        _pgmq_step("E2", 2, "pgmq", 10000, 2.5),
        _pgmq_step("E2", 2, "ours", 20000, 2.0),
    ]
    doc = {
        "run_id": "r1",
        "database": {"version": "PostgreSQL 18.6", "description": "embedded"},
        "pgmq_sql": {"path": "pgmq.sql", "sha256": "abc"},
        "shapes": {"E2": "10 items"},
        "steps": steps,
    }
    assert pgmq.ratios(steps, "E2", pgmq.NO_DEDUP)[1] == pytest.approx([2.0, 2.5])
    (row,) = pgmq.summary_rows(doc)
    # the target is judged on the default queue (dedup on) alone
    assert row[5] == "1.25 (1.25-1.25)" and row[6:] == ["1.5x", "yes", "no", "2.25 (2.00-2.50)"]
    text = pgmq.render(doc, markdown=True)
    assert "| CPU/msg PGMQ÷ours without dedup |" in text
    assert "| 2 | E2 | ours-nodedup | 25,000 |" in text
    # a run without that side keeps its table as it was
    doc["steps"] = [s for s in steps if s["side"] != pgmq.NO_DEDUP]
    assert "without dedup" not in pgmq.render(doc, markdown=True)
    assert pgmq.parse(["--pgmq-sql", __file__, "--without-dedup"]).without_dedup


def test_peer_report_leads_with_broker_cpu_per_message_beside_bare_hypercorn() -> None:
    from bench import peer_report

    def step(rate: float, cpu: float) -> dict[str, Any]:
        return {"msg_per_s": rate, "server_cpu_s_per_100k": cpu}

    doc = {
        "shapes": {
            "S1": {
                "steps": {
                    "original": [step(5000.0, 15.0), step(5000.0, 17.0)],
                    "ours": [step(4000.0, 40.0), step(4000.0, 44.0)],
                    "stack": [step(5500.0, 32.0)],
                    "hypercorn": [step(5200.0, 32.0), step(5200.0, 30.0)],
                }
            }
        }
    }
    (s1,) = peer_report.per_message_rows(doc)
    # seconds per 100k messages x 10 = µs per message, means over the rounds
    assert s1[:5] == ["S1", "160", "420", "320", "310"]
    assert s1[5] == "1.35"  # ours ÷ bare Hypercorn
    assert s1[6] == "1.25-1.47"  # round by round: 40/32 and 44/30
    assert s1[7:9] == ["≤ 1.25", "held in 1 of 2 rounds: they fall on both sides of it"]
    assert s1[9] == "5,000 / 4,000"
    assert peer_report.terminal(doc).index("Broker CPU per message") < peer_report.terminal(
        doc
    ).index("ours ÷ original")


def test_a_shapes_rounds_are_set_against_its_goal() -> None:
    from bench.peer_report import against_goal

    assert against_goal([1.05, 1.10], 1.25) == "held in every round"
    assert against_goal([1.25], 1.25) == "held in every round"  # at most the goal
    assert against_goal([1.90, 2.01], 1.5) == "missed in every round"
    assert against_goal([1.2, 1.3, 1.4], 1.25) == (
        "held in 1 of 3 rounds: they fall on both sides of it"
    )
    assert against_goal([1.2], None) == against_goal([], 1.25) == "-"


def test_a_profile_sample_counts_for_the_innermost_component_below_the_scheduler() -> None:
    from bench.profile import RUN_LOOP, component, shares

    loop = "run (trio/_core/_run.py:2500);unrolled_run (trio/_core/_run.py:2866)"
    route = "push (queen/http/push.py:40)"
    # Trio's own frames inside a task count for the code that called them
    assert component(f"{loop};{route};checkpoint (trio/_core/_run.py:2700)") == (
        "push route, body, answer"
    )
    assert component(f"{loop};{route};write_segments (queen/storage/postgres.py:353)") == (
        "storage, psycopg"
    )
    assert component(f"{loop};{route};send (trio/_socket.py:900)") == "socket send/recv"
    assert component(f"{loop};handle (hypercorn/protocol/h11.py:120)") == "Hypercorn, h11"
    # the scheduler's own work is not given to the program's start (queen/cli.py) outside it
    assert component(f"main (queen/cli.py:10);{loop};get_events (trio/_core/_io_epoll.py:243)") == (
        RUN_LOOP
    )
    # a thread of Trio's thread cache waiting for a job is not working: its samples are left out
    idle = "Thread.run (threading.py:982);WorkerThread._work (trio/_core/_thread_cache.py:200)"
    job = f"{idle};fetch (queen/storage/pool.py:300)"
    raw = f"{loop};{route} 3\n{loop} 2\n{idle} 9\n{job} 1\nnot a sample line\n"
    assert shares(raw) == {"push route, body, answer": 3, RUN_LOOP: 2, "storage, psycopg": 1}


_SAMPLED_CHILD = """
import sys, time

def idle():
    time.sleep(0.3)

def burn():
    start = time.thread_time()
    while time.thread_time() - start < 0.3:
        pass

def after():
    return 1

def churn():
    kept = [[i] for i in range(20000)]
    del kept  # freed with no check by the interpreter until after() starts
    return after()

print("ready", flush=True)
sys.stdin.readline()
idle()
burn()
start = time.thread_time()
while time.thread_time() - start < 0.3:
    churn()
print("burnt", flush=True)
sys.stdin.readline()
print("bye", flush=True)
"""


def test_the_cpu_sampler_counts_a_process_stacks_by_the_cpu_they_spend(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from bench.profile import cpu_samples, sampler_env

    script = tmp_path / "child.py"
    script.write_text(_SAMPLED_CHILD)
    samples = tmp_path / "samples"
    samples.mkdir()
    child = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, **sampler_env(samples)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"  # the hook ran before the program
        assert [p.name for p in samples.iterdir()] == [f"{child.pid}.ready"]
        with cpu_samples(samples) as counts:
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline() == "burnt\n"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "bye\n"
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(timeout=10)
        child.stdout.close()  # type: ignore[union-attr]
    raw = (samples / f"{child.pid}.txt").read_text().splitlines()
    by_stack = {line.rpartition(" ")[0]: int(line.rpartition(" ")[2]) for line in raw}
    burnt = sum(n for stack, n in by_stack.items() if stack.endswith("burn (child.py:7)"))
    slept = sum(n for stack, n in by_stack.items() if "idle (child.py:" in stack)
    churned = sum(n for stack, n in by_stack.items() if stack.endswith("churn (child.py:15)"))
    after = sum(n for stack, n in by_stack.items() if "after (child.py:" in stack)
    # 0.3 s of CPU in burn() (defined on line 7), a sample every 2 ms or every timer tick of
    # the kernel if coarser; the 0.3 s asleep in idle() spent none, so it has (next to) none
    assert burnt >= 30
    assert slept <= 2
    # the time churn() spends freeing its list counts for churn(), not for after(), which the
    # interpreter starts before it looks at the signal
    assert churned >= 5
    assert after <= 2
    in_churn = sum(n for stack, n in by_stack.items() if "churn (child.py:15)" in stack)
    assert burnt + in_churn >= 0.9 * sum(by_stack.values())
    assert sum(counts.values()) == sum(by_stack.values())


_COUNTED_WORK = """
def tick():
    return len([])

def run(n):
    for _ in range(n):
        tick()
"""

_COUNTED_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from queen.actors import work

print("ready", flush=True)
sys.stdin.readline()
work.run(1000)
print("ran", flush=True)
sys.stdin.readline()
"""


def test_the_call_counter_counts_every_python_call_of_a_group_between_its_signals(
    tmp_path: Any,
) -> None:
    import os
    import subprocess
    import sys

    from bench.profile import profiled_calls, sampler_env, signalled

    package = tmp_path / "src" / "queen" / "actors"
    package.mkdir(parents=True)
    (package / "work.py").write_text(_COUNTED_WORK)
    (tmp_path / "child.py").write_text(_COUNTED_CHILD)
    samples = tmp_path / "samples"
    samples.mkdir()
    child = subprocess.Popen(
        [sys.executable, str(tmp_path / "child.py"), str(tmp_path / "src")],
        env={**os.environ, **sampler_env(samples, "calls")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        with signalled(samples, ".prof") as written:
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline() == "ran\n"
        assert [p.name for p in written] == [f"{child.pid}.prof"]
    finally:
        child.stdin.close()
        child.wait(timeout=10)
        child.stdout.close()
    # run() once, tick() 1,000 times, and the len() each tick calls, counted in tick's group
    assert profiled_calls(written)["actors"] == 2001


async def test_the_sql_push_bench_pushes_for_real(broker: Any, pg_url: str, db: Any) -> None:
    from bench.servers import Database
    from bench.sql_push import PARTITIONS, parse, render, step

    queue = f"sqlbench-{uuid.uuid4().hex[:8]}"
    taken = await trio.to_thread.run_sync(
        step, Database(pg_url, "the tests' PostgreSQL"), queue, 3, 4
    )
    assert (taken.items, taken.calls) == (3, 4) and taken.items_per_s > 0
    assert taken.backend_cpu_s is None  # not measured: the database was not opened by the bench
    assert await db.count_frames(queue) == 12
    assert (
        await db.value(
            "SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id"
            " WHERE q.name = %s",
            queue,
        )
        == PARTITIONS
    )
    assert "items/call" in render(Database(pg_url, "x", version="PostgreSQL"), [taken])
    with pytest.raises(SystemExit):
        parse(["--items", "0"])

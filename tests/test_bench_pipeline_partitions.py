"""The pipeline benchmark's partition count as a dimension: one shape per count, reported
apart, so a collapse at many partitions shows beside the same run at few; and its requests per
message, counted in the Node processes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench import peer_report, pipeline
from bench.peer_run import PeerRun, options
from bench.pipeline import PipelineShape


def _args(**over: Any) -> argparse.Namespace:
    base = {
        "peer_shapes": "PIPE",
        "rounds": 1,
        "duration": 10.0,
        "warmup": 1.0,
        "pipeline_duration": 30.0,
        "pipeline_warmup": 5.0,
        "wrk_threads": 1,
        "pg_bin": None,
        "ours_workers": 0,
        "no_http_ceiling": False,
        "pipeline_partitions": "100,1000",
    }
    return argparse.Namespace(**{**base, **over})


def test_each_partition_count_is_a_shape_of_its_own() -> None:
    assert PipelineShape.at(100) == PipelineShape()
    assert PipelineShape.at(1000).name == "PIPE-1000"
    assert PipelineShape.at(1000).partitions == 1000
    chosen = options(_args())
    assert chosen.pipeline_partitions == (100, 1000)
    run = PeerRun(chosen)
    assert list(run.pipelines) == ["PIPE", "PIPE-1000"]
    assert run.pipelines["PIPE-1000"].partitions == 1000


@pytest.mark.parametrize("bad", ["", "0", "100,x", "-5"])
def test_a_partition_count_must_be_a_positive_number(bad: str) -> None:
    with pytest.raises(ValueError, match="pipeline-partitions"):
        options(_args(pipeline_partitions=bad))


def test_the_report_gives_each_partition_count_its_rows() -> None:
    def steps(rate: float) -> list[dict[str, Any]]:
        return [
            {
                "msg_per_s": rate,
                "client_cpu_s_per_100k": 300.0,
                "db_cpu_s_per_100k": 200.0,
                "server_cpu_s_per_100k": 500.0,
                "e2e_ms": {"analytics": {"p50": 5.0, "p99": 9.0}},
            }
        ]

    doc = {
        "machine": {"cores": 2},
        "shapes": {
            "PIPE": {"description": "100", "steps": {"ours": steps(120.0)}},
            "PIPE-1000": {"description": "1000", "steps": {"ours": steps(12.0)}},
        },
    }
    runs = [r[0] for r in peer_report.pipeline_rows(doc)]
    assert runs == ["ours 1", "ours, PIPE-1000 1"]
    bound = {r[0]: r for r in peer_report.pipeline_bound_rows(doc)}
    assert bound["ours"][5] == "120" and bound["ours, PIPE-1000"][5] == "12"
    assert "PIPE-1000" in peer_report.terminal(doc)


def test_the_pipelines_requests_are_added_up_and_shown_per_message(tmp_path: Path) -> None:
    # what count_requests.cjs leaves: one file per Node process, its requests by route
    (tmp_path / "101.json").write_text(json.dumps({"push": 100, "pop": 0, "ack": 0, "other": 2}))
    (tmp_path / "102.json").write_text(json.dumps({"push": 45, "pop": 126, "ack": 125}))
    (tmp_path / "103.json").write_text("")  # a process stopped before its first count
    counted = pipeline.requests_counted(tmp_path)
    assert counted == {"push": 145, "pop": 126, "ack": 125, "other": 2}
    step = {"pushed": 100, "requests": counted, "e2e_ms": {}}
    doc = {"shapes": {"PIPE": {"description": "100", "steps": {"ours": [step]}}}}
    [row] = peer_report.pipeline_rows(doc)
    assert row[-1] == "1.45 / 1.26 / 1.25"
    [older] = peer_report.pipeline_rows(
        {"shapes": {"PIPE": {"description": "", "steps": {"ours": [{"pushed": 100}]}}}}
    )
    assert older[-1] == "-"  # a run saved before requests were counted


def _records(path: Path, role: str, txids: range) -> None:
    lines = (json.dumps({"role": role, "txid": f"t{n}"}) for n in txids)
    with path.open("a") as f:
        f.write("".join(f"{line}\n" for line in lines))


def _logged(directory: Path, **counts: int) -> None:
    """Each role's JSONL file holding that many records."""
    for role, n in counts.items():
        _records(directory / f"{role}-1.jsonl", role, range(n))


def test_the_warm_up_is_drained_before_the_window_once_every_group_logged_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # warmup-partitions.js leaves one message per partition in q1 and in q2: the workers log
    # one record per partition, each tail group two (q1's forwarded, q2's own)
    shape = PipelineShape.at(3)
    _logged(tmp_path, worker=3, analytics=6, log=5)
    looks: list[int] = []

    def sleep(_: float) -> None:  # the log group's last record arrives on the second look
        looks.append(1)
        if len(looks) == 2:
            _records(tmp_path / "log-1.jsonl", "log", range(5, 6))

    monkeypatch.setattr(pipeline.time, "sleep", sleep)
    drained = pipeline._drain_warmup(pipeline.Tail(tmp_path), shape)
    assert drained["drained"] is True
    assert drained["records"] == {"worker": 3, "analytics": 6, "log": 6}  # it waited for it


def test_a_warm_up_that_stops_arriving_short_is_reported_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = PipelineShape.at(3)
    _logged(tmp_path, worker=3, analytics=6, log=4)  # two of the log group's never come
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(pipeline.time, "sleep", sleep)
    monkeypatch.setattr(pipeline.time, "monotonic", lambda: clock[0])
    drained = pipeline._drain_warmup(pipeline.Tail(tmp_path), shape)
    assert drained["drained"] is False
    assert drained["records"]["log"] == 4
    assert pipeline.WARMUP_QUIET_S < drained["seconds"] < pipeline.WARMUP_QUIET_S + 1


def test_the_window_counts_only_the_requests_made_after_the_warm_up() -> None:
    before = {"push": 0, "pop": 2010, "ack": 2000, "other": 0}
    after = {"push": 1500, "pop": 4000, "ack": 3990, "other": 0}
    assert pipeline._less(after, before) == {"push": 1500, "pop": 1990, "ack": 1990, "other": 0}

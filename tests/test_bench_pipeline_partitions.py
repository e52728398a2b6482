"""The pipeline benchmark's partition count as a dimension: one shape per count, reported
apart, so a collapse at many partitions shows beside the same run at few."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench import peer_report
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

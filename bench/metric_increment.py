"""What one counter increment costs on the push path, and what publishing costs a worker.

``python -m bench.metric_increment`` times, in this process:

- ``plain``: ``metrics.push_items += 1`` on :class:`queen.metrics.Metrics` (what the push path
  does, with or without ``--workers``);
- ``mmap``: ``Counter.inc(1)`` of ``prometheus_client`` in multiprocess mode (a lock and a
  write into the process's mmapped file: what writing every increment through would cost);
- ``publish``: one :meth:`queen.metrics.SharedFigures.publish` of every family with every
  counter changed (what a worker does once a second and before each ``/metrics`` answer);
- ``read``: one :meth:`queen.metrics.SharedFigures.read` over two workers' files (what each
  history sample and each JSON ``/metrics`` does);
- ``exposition``: the same two workers' ``/metrics`` text.

Each is the best of five rounds; the result is one JSON line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

_CHILD = """
import sys
from pathlib import Path
from queen.metrics import Metrics, SharedFigures
m = Metrics()
m.push_items += 10
SharedFigures(m, Path(sys.argv[1]), "other").publish({"process_id": 1.0}, {})
"""


def _best(statement: str, number: int, globals_: dict[str, object]) -> float:
    rounds = timeit.repeat(statement, number=number, repeat=5, globals=globals_)
    return min(rounds) / number


def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="queen-metrics-bench-"))
    subprocess.run([sys.executable, "-c", _CHILD, str(directory)], check=True)
    import os

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    from prometheus_client import Counter, values

    from queen.metrics import Metrics, SharedFigures

    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    metrics = Metrics()
    figures = SharedFigures(metrics, directory, "bench")
    counter = Counter("bench_increments", "increments", registry=None)
    gauges = {"process_id": 1.0, "database_up": 1.0, "maintenance_mode": 0.0}
    names = list(metrics.snapshot())

    def publish_all_changed() -> None:
        for name in names:
            if name != "push_transaction_seconds":
                setattr(metrics, name, getattr(metrics, name) + 1)
        figures.publish(gauges, {})

    scope: dict[str, object] = {
        "metrics": metrics,
        "counter": counter,
        "figures": figures,
        "gauges": gauges,
        "publish_all_changed": publish_all_changed,
    }
    result = {
        "plain_ns": round(_best("metrics.push_items += 1", 200_000, scope) * 1e9, 1),
        "mmap_ns": round(_best("counter.inc(1)", 200_000, scope) * 1e9, 1),
        "publish_us": round(_best("publish_all_changed()", 200, scope) * 1e6, 1),
        "read_us": round(_best("figures.read()", 200, scope) * 1e6, 1),
        "exposition_us": round(_best("figures.exposition(gauges, {})", 100, scope) * 1e6, 1),
    }
    print(json.dumps(result))
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The benchmark (``./bench/run.sh``, or ``python -m bench``): docs/benchmark.md.

- The harness: :mod:`bench.cli` (the command), :mod:`bench.scenarios` (what runs, the targets),
  :mod:`bench.runner` (a run, step by step), :mod:`bench.wrk` and ``push.lua`` (the HTTP load),
  :mod:`bench.inproc` (the embedding API, the consume side, the calls per item),
  :mod:`bench.http_ceiling` and :mod:`bench.pg_ceiling` (the same-run ceilings),
  :mod:`bench.servers`, :mod:`bench.procfs`, :mod:`bench.counters`, :mod:`bench.machine`
  (processes and readings), :mod:`bench.report` (the tables, RESULTS.md).
- Beside the original C++ server (``--peer``): :mod:`bench.peer_run` (the alternating run),
  :mod:`bench.peer` (the original, a database per step, a step's CPU), :mod:`bench.pipeline`
  (the original's own pipeline benchmark), :mod:`bench.hypercorn_floor` (bare Hypercorn),
  :mod:`bench.peer_report`.
"""

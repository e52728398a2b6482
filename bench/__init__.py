"""The push benchmark: ``./bench/run.sh`` (or ``python -m bench`` from the project root).

Rooms: :mod:`bench.scenarios` (what runs), :mod:`bench.runner` (one run),
:mod:`bench.measure` (one wrk window), :mod:`bench.wrk` (load generator),
:mod:`bench.http_ceiling` and :mod:`bench.pg_ceiling` (the same-run ceilings),
:mod:`bench.servers` (processes and database), :mod:`bench.procfs` and :mod:`bench.counters`
(readings), :mod:`bench.targets` and :mod:`bench.report` (judging and rendering).
"""

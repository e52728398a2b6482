"""The benchmark (``./bench/run.sh``, or ``python -m bench``): docs/benchmark.md; its modules
are listed in docs/layout.md."""

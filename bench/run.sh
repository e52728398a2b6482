#!/usr/bin/env sh
# The push benchmark: ./bench/run.sh [options]   (./bench/run.sh --help lists them)
# Uses the project's .venv (created and installed here if missing), installs wrk if missing.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if ! .venv/bin/python -c "import queen" >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[embedded]'
fi
exec .venv/bin/python -m bench "$@"

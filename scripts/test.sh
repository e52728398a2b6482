#!/usr/bin/env sh
# Install everything the tests need into .venv (and the official client, whose import name
# clashes with ours, into .venv-client) and run the whole suite: lint, types, tests.
# Usage: ./scripts/test.sh [extra pytest arguments]
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
echo "== browser for the dashboard tests (Debian's chromium and chromium-driver)"
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            chromium chromium-driver >/dev/null
    else
        echo "missing /usr/bin/chromium or /usr/bin/chromedriver; as root run:" >&2
        echo "  apt-get install chromium chromium-driver" >&2
        exit 1
    fi
fi
echo "== official client (.venv-client)"
.venv/bin/python -m tests.client_env
echo "== ruff"
.venv/bin/ruff check queen tests bench
.venv/bin/ruff format --check queen tests bench
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
.venv/bin/python -m pytest "$@"

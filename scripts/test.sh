#!/usr/bin/env sh
# Install everything the tests need into .venv (and the official client, whose import name
# clashes with ours, into .venv-client) and run the whole suite: lint, types, tests on the
# embedded PostgreSQL 18; then the push, pop and ack tests again on a PostgreSQL 15 with its
# default settings (Debian's postgresql-15 package, installed here when running as root).
# Usage: ./scripts/test.sh [extra pytest arguments for the whole suite]
set -eu
cd "$(dirname "$0")/.."
PG15_BIN=/usr/lib/postgresql/15/bin
if [ ! -x "$PG15_BIN/pg_ctl" ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing PostgreSQL 15 (apt-get install postgresql-15)"
        apt-get -o DPkg::Lock::Timeout=600 update
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y \
            --no-install-recommends postgresql-15
    else
        echo "The tests also run on PostgreSQL 15, which is not installed ($PG15_BIN)." >&2
        echo "Install it first, as root:" >&2
        echo "  apt-get update && apt-get install -y --no-install-recommends postgresql-15" >&2
        exit 1
    fi
fi
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
echo "== container tools for the image test (Debian's debootstrap, buildah, podman, runc)"
if ! command -v debootstrap >/dev/null 2>&1 || ! command -v buildah >/dev/null 2>&1 \
    || ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            debootstrap buildah podman runc >/dev/null
    else
        echo "note: tests/test_container.py needs root and debootstrap, buildah, podman, runc;" >&2
        echo "  it is skipped (as root: apt-get install debootstrap buildah podman runc)" >&2
    fi
fi
echo "== official client (.venv-client)"
.venv/bin/python -m tests.client_env
echo "== ruff"
.venv/bin/ruff check queen tests bench
.venv/bin/ruff format --check queen tests bench
echo "== mypy"
.venv/bin/mypy
echo "== pytest (embedded PostgreSQL 18)"
.venv/bin/python -m pytest "$@"
echo "== pytest (PostgreSQL 15, default settings): push, pop, ack, transactions, sessions, streams, SQL interface"
QUEEN_TEST_PG=15 .venv/bin/python -m pytest -q tests/test_pg_sessions.py \
    tests/test_push_http.py tests/test_pop.py tests/test_ack.py tests/test_transaction.py \
    tests/test_streams.py tests/test_push_plans.py tests/test_sql_api.py tests/test_pop_parking.py

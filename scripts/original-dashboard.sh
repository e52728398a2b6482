#!/usr/bin/env sh
# Build the original broker's dashboard (the Vue app in its app/ folder) and open every page of
# it in headless Chromium against this broker, which serves it (WEBAPP_ROOT): the test
# tests/test_original_app_browser.py, with a screenshot of every page.
#
# Usage: ./scripts/original-dashboard.sh APP_SOURCE_DIR [SCREENSHOT_DIR]
#   APP_SOURCE_DIR  a checkout of the original's app/ folder (package.json, package-lock.json,
#                   src/); it is in no package registry, so the suite cannot fetch it
#   SCREENSHOT_DIR  where the screenshots go (default: tests/artifacts/original-app)
#
# Needs node and npm (apt-get install nodejs npm), Debian's chromium and chromium-driver, and
# the npm registry. The build is cached under .cache/original-app/, keyed by the digest of
# the app's sources: a second run with the same sources builds nothing.
set -eu
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ ! -f "$1/package.json" ]; then
    echo "usage: $0 APP_SOURCE_DIR [SCREENSHOT_DIR] (a directory holding package.json)" >&2
    exit 2
fi
SOURCE=$(cd "$1" && pwd)
SHOTS=${2:-tests/artifacts/original-app}
for tool in node npm; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool missing: apt-get install nodejs npm" >&2; exit 1; }
done
DIGEST=$(cd "$SOURCE" && find package.json package-lock.json index.html vite.config.js \
    tailwind.config.js postcss.config.js src public -type f 2>/dev/null | LC_ALL=C sort \
    | xargs sha256sum | sha256sum | cut -c1-16)
CACHE=.cache/original-app/$DIGEST
if [ ! -f "$CACHE/dist/index.html" ]; then
    echo "== building the app ($SOURCE -> $CACHE)"
    rm -rf "$CACHE" && mkdir -p "$CACHE"
    (cd "$SOURCE" && tar -cf - --exclude=node_modules --exclude=dist --exclude=.vite .) \
        | tar -xf - -C "$CACHE"
    (cd "$CACHE" && npm ci --no-audit --no-fund --loglevel=error && npm run build)
else
    echo "== the app is built already ($CACHE)"
fi
if [ ! -x .venv/bin/python ]; then
    python3.11 -m venv .venv
    .venv/bin/python -m pip install --quiet -e '.[test]'
fi
mkdir -p "$SHOTS"
QUEEN_ORIGINAL_APP="$(pwd)/$CACHE/dist" QUEEN_ORIGINAL_APP_SHOTS="$SHOTS" \
    .venv/bin/python -m pytest -q tests/test_original_app_browser.py
echo "screenshots: $SHOTS"

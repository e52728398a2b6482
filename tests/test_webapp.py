"""An operator's built dashboard (``WEBAPP_ROOT``: the original broker's Vue app, built) served
at the original's paths: its page at ``/`` under a policy that lets exactly its own inline
script run, its files under ``/assets/``, its router's pages on a reload, nothing outside the
directory, the broker's own paths left alone, our dashboard moved to ``/dashboard/``, and the
files public exactly when ``/`` is."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from queen.auth import build_gate
from queen.broker import Broker
from queen.http.app import create_app
from queen.http.headers import DASHBOARD_POLICY
from queen.http.webapp import page_policy
from queen.server import StartupError, check_webapp
from queen.settings import Settings
from tests.jwt_tools import SECRET

INLINE = "document.documentElement.classList.add('dark');"
INDEX = f"""<!DOCTYPE html>
<html><head>
<link rel="preconnect" href="https://fonts.example.net">
<link href="https://fonts.example.com/css2?family=Inter" rel="stylesheet">
<script>{INLINE}</script>
<script type="module" crossorigin src="/assets/index-abc.js"></script>
</head><body><div id="app"></div></body></html>
"""


def build_dir(root: Path) -> Path:
    (root / "assets").mkdir(parents=True)
    (root / "index.html").write_text(INDEX)
    (root / "assets" / "index-abc.js").write_text("console.log('app');")
    (root / "assets" / "index-abc.css").write_text("body{}")
    (root / "queen_head.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return root


@pytest.fixture
def settings(pg_url: str, tmp_path: Path) -> Settings:
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the directory")
    return Settings(
        database_url=pg_url,
        file_buffer_dir=str(tmp_path / "spool"),
        db_pool_size=6,
        write_concurrency=2,
        shutdown_grace_s=5,
        webapp_root=str(build_dir(tmp_path / "dist")),
    )


async def test_the_page_is_the_directorys_index_under_a_policy_naming_its_inline_script(
    client: Any,
) -> None:
    resp = await client.get("/")
    assert resp.status_code == 200
    assert await resp.get_data(as_text=True) == INDEX
    assert resp.mimetype == "text/html"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["Cache-Control"] == "no-cache"
    policy = resp.headers["Content-Security-Policy"]
    digest = base64.b64encode(hashlib.sha256(INLINE.encode()).digest()).decode()
    directives = {d.split()[0]: d.split()[1:] for d in policy.split("; ")}
    assert directives["script-src"] == ["'self'", f"'sha256-{digest}'"]
    assert directives["style-src"] == [
        "'self'",
        "https://fonts.example.com",
        "https://fonts.example.net",
    ]
    assert "https://fonts.example.com" in directives["font-src"]
    assert directives["frame-ancestors"] == ["'none'"]
    assert directives["connect-src"] == ["'self'"]
    assert "'unsafe-inline'" not in directives["script-src"]


def test_another_inline_script_is_not_in_the_policy() -> None:
    policy = page_policy(INDEX)
    other = page_policy(INDEX.replace(INLINE, "alert(1)"))
    assert policy != other
    assert page_policy("<p>no script</p>").split("; ")[1] == "script-src 'self'"


async def test_assets_are_served_with_their_type_and_cached_for_good(client: Any) -> None:
    resp = await client.get("/assets/index-abc.js")
    assert resp.status_code == 200
    assert resp.mimetype == "text/javascript"
    assert await resp.get_data(as_text=True) == "console.log('app');"
    assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    css = await client.get("/assets/index-abc.css")
    assert css.mimetype == "text/css"
    assert (await client.get("/assets/nothing.js")).status_code == 404


async def test_the_apps_own_routes_reload_into_its_page_and_its_files_are_served(
    client: Any,
) -> None:
    for path in ("/queues", "/queues/orders", "/dlq", "/consumers?x=1"):
        resp = await client.get(path)
        assert resp.status_code == 200, path
        assert await resp.get_data(as_text=True) == INDEX, path
        assert "sha256-" in resp.headers["Content-Security-Policy"], path
    icon = await client.get("/queen_head.png")
    assert icon.status_code == 200 and icon.mimetype == "image/png"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/nothing-here",
        "/api/me",
        "/metrics/other",
        "/health/x",
        "/ws/x",
        "/streams/v1/nothing",
        "/dashboard/nothing",
    ],
)
async def test_the_brokers_own_paths_are_never_the_apps(client: Any, path: str) -> None:
    resp = await client.get(path)
    assert resp.status_code == 404
    assert resp.mimetype == "application/json"


@pytest.mark.parametrize(
    "path",
    ["/assets/../../secret.txt", "/assets/%2E%2E/%2E%2E/secret.txt", "/../secret.txt", "/link"],
)
async def test_nothing_outside_the_directory_is_served(
    client: Any, settings: Settings, path: str
) -> None:
    root = Path(str(settings.webapp_root))
    os.symlink(root.parent / "secret.txt", root / "link")
    resp = await client.get(path)
    assert b"outside the directory" not in await resp.get_data()


async def test_the_brokers_routes_and_its_own_dashboard_stay(client: Any) -> None:
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/api/v1/resources/queues")).status_code == 200
    ours = await client.get("/dashboard/")
    assert ours.status_code == 200
    assert "/dashboard/assets/dashboard.js" in await ours.get_data(as_text=True)
    assert ours.headers["Content-Security-Policy"] == DASHBOARD_POLICY


async def test_the_apps_files_are_public_exactly_when_the_page_is(broker: Broker) -> None:
    settings = broker.settings.with_changes(jwt_enabled=True, jwt_secret=SECRET)
    public = create_app(broker, gate=build_gate(settings)).test_client()
    for path in ("/", "/assets/index-abc.js", "/queues/orders", "/queen_head.png", "/dashboard/"):
        assert (await public.get(path)).status_code == 200, path
    assert (await public.get("/api/v1/resources/queues")).status_code == 401
    closed = create_app(
        broker, gate=build_gate(settings.with_changes(jwt_skip_paths="/health"))
    ).test_client()
    for path in ("/", "/assets/index-abc.js", "/queues/orders", "/dashboard/"):
        assert (await closed.get(path)).status_code == 401, path


def test_a_directory_without_an_index_does_not_start(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for root, said in ((tmp_path / "empty", "has no index.html"), (tmp_path / "no", "not a dir")):
        with pytest.raises(StartupError, match=said):
            check_webapp(Settings(webapp_root=str(root)))
    check_webapp(Settings(webapp_root=str(build_dir(tmp_path / "ok"))))
    check_webapp(Settings())

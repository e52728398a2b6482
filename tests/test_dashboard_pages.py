"""What the dashboard's answers carry: a name the URL holds comes back escaped (the 404 views
too), every answer says ``nosniff``, every HTML answer carries a policy that lets no inline
script run, no template holds an inline script, handler or style, and the page's script and
style sheet are served by the broker, public whenever the page is."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import queen.http
from queen.auth import build_gate
from queen.broker import Broker
from queen.http.app import create_app
from queen.http.headers import DASHBOARD_POLICY
from tests.consuming import Api
from tests.jwt_tools import SECRET

HOSTILE = "<svg onload=alert(1)>\"'&"
TEMPLATES = Path(queen.http.__file__).parent / "templates"


def assert_protected_html(resp: Any) -> None:
    assert resp.mimetype == "text/html"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    policy = resp.headers["Content-Security-Policy"]
    assert policy == DASHBOARD_POLICY
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy


@pytest.mark.parametrize(
    ("path", "said"),
    [
        (f"/dashboard/view/queue/{quote(HOSTILE, safe='')}", f"queue {HOSTILE} does not exist"),
        (
            f"/dashboard/view/group/{quote(HOSTILE, safe='')}",
            f"consumer group {HOSTILE} does not exist",
        ),
        (f"/dashboard/view/message/1/{quote(HOSTILE, safe='')}", "message not found"),
    ],
    ids=["queue", "group", "message"],
)
async def test_a_missing_view_answers_escaped_html_with_nosniff_and_the_policy(
    client: Any, path: str, said: str
) -> None:
    resp = await client.get(path)
    assert resp.status_code == 404
    html = await resp.get_data(as_text=True)
    assert "<svg onload" not in html
    text = re.sub(r"<[^>]*>", "", html)
    unescaped = (
        text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#34;", '"')
        .replace("&#39;", "'")
        .replace("&amp;", "&")
    )
    assert unescaped == said
    assert_protected_html(resp)


async def test_a_view_showing_a_hostile_name_escapes_it_under_the_policy(
    api: Api, client: Any, queue: str
) -> None:
    name = f"{queue}-{HOSTILE}"
    await api.push(name, HOSTILE, 1)
    for path in (
        f"/dashboard/view/queue/{quote(name, safe='')}",
        f"/dashboard/view/messages?queue={quote(name, safe='')}",
        f"/dashboard/view/overview?search={quote(queue, safe='')}",
    ):
        resp = await client.get(path)
        assert resp.status_code == 200, path
        assert_protected_html(resp)
        html = await resp.get_data(as_text=True)
        assert "<svg onload" not in html, path
        assert "&lt;svg onload=alert(1)&gt;" in html, path


async def test_the_page_and_every_json_answer_carry_their_headers(client: Any) -> None:
    page = await client.get("/")
    assert page.status_code == 200
    assert_protected_html(page)
    for path in ("/health", "/api/v1/resources/queues", "/api/v1/nothing-here"):
        resp = await client.get(path)
        assert resp.headers["X-Content-Type-Options"] == "nosniff", path
        assert resp.mimetype == "application/json", path
    refused = await client.post("/api/v1/push", data=b"{", headers={"content-type": "text/plain"})
    assert refused.status_code == 400
    assert refused.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.glob("*.html")))
def test_no_template_holds_an_inline_script_handler_or_style(template: str) -> None:
    text = (TEMPLATES / template).read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", text), "inline <script>"
    assert not re.search(r"\son[a-z]+\s*=", text, re.IGNORECASE), "inline event handler"
    assert not re.search(r"\sstyle\s*=|<style", text, re.IGNORECASE), "inline style"
    assert "javascript:" not in text.lower()


async def test_the_script_and_style_sheet_are_served_and_revalidated(client: Any) -> None:
    page = await (await client.get("/")).get_data(as_text=True)
    for path, kind in (
        ("/dashboard/assets/dashboard.js", "text/javascript"),
        ("/dashboard/assets/dashboard.css", "text/css"),
    ):
        assert f'"{path}"' in page
        resp = await client.get(path)
        assert resp.status_code == 200 and resp.mimetype == kind
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Cache-Control"] == "no-cache"
        again = await client.get(path, headers={"If-None-Match": resp.headers["ETag"]})
        assert again.status_code == 304
    assert (await client.get("/dashboard/assets/nothing.js")).status_code == 404


async def test_the_assets_are_public_exactly_when_the_page_is(broker: Broker) -> None:
    settings = broker.settings.with_changes(jwt_enabled=True, jwt_secret=SECRET)
    public = create_app(broker, gate=build_gate(settings)).test_client()
    assert (await public.get("/")).status_code == 200
    assert (await public.get("/dashboard/assets/dashboard.js")).status_code == 200
    assert (await public.get("/dashboard/view/overview")).status_code == 401
    closed = create_app(
        broker, gate=build_gate(settings.with_changes(jwt_skip_paths="/health"))
    ).test_client()
    assert (await closed.get("/")).status_code == 401
    assert (await closed.get("/dashboard/assets/dashboard.js")).status_code == 401

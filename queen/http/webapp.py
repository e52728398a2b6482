"""A built single-page dashboard an operator provides (the original broker's Vue app, built
with its ``npm run build``), served from the directory ``WEBAPP_ROOT`` names, at the paths the
original broker serves it from:

- ``GET /``: the directory's ``index.html``;
- ``GET /assets/<file>``: the build's files (their names carry a hash of their content, so
  they are cached for a year);
- ``GET /<anything else>``: a file of the directory when there is one (``/queen_head.png``),
  else ``index.html`` again, so that the app's own routes (``/queues/orders``) load on a
  reload. Paths under the broker's own prefixes (``/api/``, ``/health``, ``/metrics``,
  ``/ws/``, ``/streams/``, ``/dashboard``) are never the app's: they answer 404.

The app calls the API on the origin it was loaded from, so it needs no setting of its own.
Nothing outside the directory is served (a path that resolves outside it, through ``..`` or
a symbolic link, is a 404). ``index.html`` is read at every request, so a rebuilt directory is
served at once.

Its pages carry the broker's security headers: ``nosniff``, and a Content-Security-Policy
(:func:`page_policy`) that lets scripts run only from the broker and, inline, exactly the
scripts ``index.html`` holds (by their SHA-256), style sheets and fonts only from the broker
and from the origins ``index.html`` itself links to, and no framing by another site. Its
elements may carry ``style`` attributes (the original's app sets its bars' widths and colours
so): an attribute can style, never run a script.
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
import re
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import trio
from quart import Blueprint, Response, request

from queen.http.responses import error_response

INDEX: Final = "index.html"
RESERVED: Final = ("/api/", "/health", "/metrics", "/ws/", "/streams/", "/dashboard")
"""Path prefixes that stay the broker's: the app's fallback never answers them."""

_TYPES: Final = {
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".woff": "font/woff",
    ".txt": "text/plain; charset=utf-8",
}
_INLINE_SCRIPT: Final = re.compile(
    r"<script\b(?![^>]*\bsrc\s*=)[^>]*>(.*?)</script\s*>", re.IGNORECASE | re.DOTALL
)
_LINK: Final = re.compile(r"<link\b[^>]*>", re.IGNORECASE)
_HREF: Final = re.compile(r"""\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.IGNORECASE)
_HTML: Final = "text/html; charset=utf-8"


def problem(root: str) -> str | None:
    """Why ``root`` cannot be served as a built dashboard, or None."""
    path = Path(root)
    if not path.is_dir():
        return f"WEBAPP_ROOT={root!r} is not a directory"
    if not (path / INDEX).is_file():
        return f"WEBAPP_ROOT={root!r} has no {INDEX} (give the directory npm run build wrote)"
    return None


def content_type(path: Path) -> str:
    known = _TYPES.get(path.suffix.lower())
    if known is not None:
        return known
    guessed, _ = mimetypes.guess_type(path.name)
    return guessed or "application/octet-stream"


def page_policy(index_html: str) -> str:
    """The Content-Security-Policy of the app's page: the broker's own rules, plus the
    inline scripts of ``index_html`` by hash and the https origins its ``<link>`` elements
    name (a web font's style sheet and the host it loads the fonts from) for styles and
    fonts."""
    hashes = sorted(
        {
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
            for body in _INLINE_SCRIPT.findall(index_html)
        }
    )
    origins: set[str] = set()
    for tag in _LINK.findall(index_html):
        found = _HREF.search(tag)
        if found is None:
            continue
        href = next(g for g in found.groups() if g is not None)
        parts = urlsplit(href)
        if parts.scheme == "https" and parts.netloc:
            origins.add(f"https://{parts.netloc}")
    linked = sorted(origins)
    return "; ".join(
        (
            "default-src 'self'",
            " ".join(["script-src 'self'", *hashes]),
            " ".join(["style-src 'self'", *linked]),
            "style-src-attr 'unsafe-inline'",
            " ".join(["font-src 'self' data:", *linked]),
            "img-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        )
    )


class WebApp:
    """The files of one built directory, as the routes serve them."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def file(self, relative: str) -> Path | None:
        """The regular file at ``relative`` inside the directory, or None (also for a path
        that leads outside it)."""
        if not relative or "\\" in relative:
            return None
        candidate = (self.root / relative).resolve()
        if not candidate.is_relative_to(self.root) or not candidate.is_file():
            return None
        return candidate

    async def index(self) -> Response:
        found = self.file(INDEX)
        if found is None:
            return error_response(404, f"{INDEX} is missing from WEBAPP_ROOT ({self.root})")
        html = (await trio.to_thread.run_sync(found.read_bytes)).decode("utf-8", "replace")
        response = Response(html, content_type=_HTML)
        response.headers["Content-Security-Policy"] = page_policy(html)
        response.headers["Cache-Control"] = "no-cache"
        return response

    async def serve(self, found: Path, *, immutable: bool) -> Response:
        if found.name == INDEX and found.parent == self.root:
            return await self.index()
        body = await trio.to_thread.run_sync(found.read_bytes)
        response = Response(body, content_type=content_type(found))
        response.headers["Cache-Control"] = (
            "public, max-age=31536000, immutable" if immutable else "no-cache"
        )
        if response.mimetype == "text/html":
            # Another page of the directory: only the broker's scripts, none inline.
            response.headers["Content-Security-Policy"] = page_policy("")
        return response


def blueprint_for(root: Path) -> Blueprint:
    """The routes serving the built app in ``root`` (``/`` included: the broker's own
    dashboard is then at ``/dashboard/``)."""
    app = WebApp(root)
    blueprint = Blueprint("webapp", __name__)

    @blueprint.get("/")
    async def index() -> Response:
        return await app.index()

    @blueprint.get("/assets/<path:name>")
    async def asset(name: str) -> Response:
        found = app.file("assets/" + name)
        if found is None:
            return error_response(404, "Not Found")
        return await app.serve(found, immutable=True)

    @blueprint.get("/<path:rest>")
    async def page(rest: str) -> Response:
        if request.path.startswith(RESERVED):
            return error_response(404, "Not Found")
        found = app.file(rest)
        if found is not None:
            return await app.serve(found, immutable=False)
        return await app.index()

    return blueprint

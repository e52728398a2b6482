"""The headers every answer carries, set once for the whole app.

Every answer says ``X-Content-Type-Options: nosniff``: a browser takes it for what its
``Content-Type`` says (a JSON error that repeats a name is never read as a page). Every HTML
answer (the dashboard's page and views) also carries :data:`DASHBOARD_POLICY`: scripts and
style sheets only from the broker itself, so no inline script, event handler or style runs
even if some text reached a page unescaped; no plugin, no ``<base>``, forms only to the
broker, and no framing by another site (the buttons act on the broker). A route that sets a
policy of its own keeps it (an operator's built dashboard, :mod:`queen.http.webapp`).
"""

from __future__ import annotations

from typing import Final

from quart import Response
from quart_trio import QuartTrio

DASHBOARD_POLICY: Final = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)


def install(app: QuartTrio) -> None:
    @app.after_request
    async def protect(response: Response) -> Response:
        headers = response.headers
        headers["X-Content-Type-Options"] = "nosniff"
        if response.mimetype == "text/html" and "Content-Security-Policy" not in headers:
            headers["Content-Security-Policy"] = DASHBOARD_POLICY
        return response

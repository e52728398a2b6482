"""CORS: which browser origins may call the API (``QUEEN_CORS_ORIGINS``, none by default).

A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered
here, before the access gate, so it needs no token: 204 with the allowed methods and headers
for an allowed origin, 403 otherwise. Every other answer to an allowed origin carries
``Access-Control-Allow-Origin``. The same-origin dashboard needs none of this.
"""

from __future__ import annotations

from quart import Response, request
from quart_trio import QuartTrio

from queen.http.responses import error_response

ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type, Accept"
MAX_AGE_S = 600


def parse_origins(text: str) -> frozenset[str]:
    return frozenset(o.strip().rstrip("/") for o in text.split(",") if o.strip())


def origin_allowed(origin: str, allowed: frozenset[str]) -> bool:
    return "*" in allowed or origin.rstrip("/") in allowed


def install(app: QuartTrio, origins: str) -> None:
    """Register the preflight hook (call before the access gate's) and, when some origin is
    allowed, the answer hook (with none, no answer would carry the header)."""
    allowed = parse_origins(origins)

    def decorate(response: Response, origin: str) -> Response:
        response.headers["Access-Control-Allow-Origin"] = "*" if "*" in allowed else origin
        if "*" not in allowed:
            response.headers.add("Vary", "Origin")
        return response

    @app.before_request
    async def preflight() -> Response | None:
        if request.method != "OPTIONS":  # (first: a header lookup costs more)
            return None
        origin = request.headers.get("Origin")
        if not origin or "Access-Control-Request-Method" not in request.headers:
            return None
        if not origin_allowed(origin, allowed):
            return error_response(403, f"origin {origin} is not allowed (QUEEN_CORS_ORIGINS)")
        response = decorate(Response("", status=204), origin)
        response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
        response.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
        response.headers["Access-Control-Max-Age"] = str(MAX_AGE_S)
        return response

    if not allowed:
        return

    @app.after_request
    async def allow(response: Response) -> Response:
        origin = request.headers.get("Origin")
        if (
            origin
            and origin_allowed(origin, allowed)
            and "Access-Control-Allow-Origin" not in response.headers
        ):
            decorate(response, origin)
        return response

"""What every request's path and query string may hold: nothing PostgreSQL text cannot store.

A path segment (a queue name, a transaction id) or a query parameter (``search``, ``queue``,
``transactionId``...) reaches SQL as text, and PostgreSQL text cannot hold NUL (``%00``). One
hook refuses such a request with 400 before its route runs, whatever the route: no route has to
remember it, and nothing is read or written. URL decoding never yields an unpaired surrogate
(bytes that are not UTF-8 become U+FFFD), so NUL is the one character to refuse here.

JSON bodies are checked field by field where they are read (names by
:func:`queen.names.name_problem`, other texts by :func:`queen.consume.requests.text`): a
payload may hold NUL, as it is stored as JSON text.
"""

from __future__ import annotations

from typing import Any, cast

from quart import Request, Response, request
from quart_trio import QuartTrio

from queen.http.responses import error_response

NUL = "\x00"


def nul_problem(req: Request) -> str | None:
    """Why ``req``'s path or query string is refused, or None."""
    if NUL in req.path:
        return "the path must not contain NUL (%00)"
    query = req.query_string
    if b"%00" not in query and b"\x00" not in query:  # (the common case parses nothing)
        return None
    for key, value in req.args.items(multi=True):
        if NUL in key:
            return "a query parameter's name must not contain NUL (%00)"
        if NUL in value:
            return f"query parameter {key} must not contain NUL (%00)"
    return None


def install(app: QuartTrio) -> None:
    """Register the hook (after the access gate's: a caller without a valid token learns
    nothing from it)."""

    @app.before_request
    async def refuse_nul() -> Response | None:
        # (one look through the request proxy, werkzeug's way: each look costs more than the
        # check itself)
        problem = nul_problem(cast(Any, request)._get_current_object())
        return None if problem is None else error_response(400, problem)

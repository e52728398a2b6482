"""The access gate in the app: one before-request hook, and the caller's identity for routes.

The hook asks :class:`queen.auth.AccessGate` about every request before its route runs (so a
refused push is answered before its body is read) and turns a refusal into a JSON error. Routes
never look at tokens; the push route asks :func:`producer_sub` for the identity to stamp.

Every call of a route the access table marks ``audited`` (an operator's action: deletions,
clears, retries, seeks, maintenance switches) is logged once answered, on ``queen.audit`` at
INFO: who (the token's ``sub``, or ``anonymous``), the method, the path with its query, and
the status.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from quart import Request, Response, g, request
from quart_trio import QuartTrio

from queen.auth import ANONYMOUS, ROUTES, AccessGate, AuthFailure, Identity
from queen.http.responses import error_response

log = logging.getLogger("queen.auth")
audit = logging.getLogger("queen.audit")

_IDENTITY = "queen_identity"
_REFUSED_SUB = "queen_refused_sub"


def install(app: QuartTrio, gate: AccessGate) -> None:
    """Register the access hook (unless the gate is off: then every caller is anonymous and
    allowed, and no request pays for asking) and the audit hook."""
    app.config["QUEEN_ACCESS_GATE"] = gate

    async def check_access() -> Response | None:
        rule = request.url_rule
        try:
            identity = await gate.admit(
                request.method,
                request.path,
                rule.rule if rule is not None else None,
                request.headers.get("Authorization"),
            )
        except AuthFailure as refusal:
            log.debug("%s %s refused: %d %s", request.method, request.path, refusal.status, refusal)
            setattr(g, _REFUSED_SUB, refusal.sub)
            response = error_response(refusal.status, refusal.message, **refusal.extra)
            if refusal.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="queen"'
            return response
        setattr(g, _IDENTITY, identity)
        return None

    if gate.enabled:
        app.before_request(check_access)

    @app.after_request
    async def log_action(response: Response) -> Response:
        # (one look through the request proxy: each look costs more than the check itself)
        served = cast(Request, cast(Any, request)._get_current_object())
        rule = served.url_rule
        if rule is not None and ROUTES.audited(served.method, rule.rule):
            identity = getattr(g, _IDENTITY, None)
            sub = identity.sub if isinstance(identity, Identity) else getattr(g, _REFUSED_SUB, None)
            who = sub or "anonymous"
            query = served.query_string.decode("latin-1")
            audit.info(
                "%s %s %s%s -> %d",
                who,
                served.method,
                served.path,
                f"?{query}" if query else "",
                response.status_code,
            )
        return response


def current_identity() -> Identity:
    """The caller of the request being served (anonymous with authentication off)."""
    identity = getattr(g, _IDENTITY, None)
    return identity if isinstance(identity, Identity) else ANONYMOUS


def producer_sub() -> str | None:
    """The identity stamped on pushed messages: the validated token's ``sub``, else None."""
    return current_identity().sub

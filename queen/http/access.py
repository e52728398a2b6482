"""The access gate in the app: one before-request hook, and the caller's identity for routes.

The hook asks :class:`queen.auth.AccessGate` about every request before its route runs (so a
refused push is answered before its body is read) and turns a refusal into a JSON error. Routes
never look at tokens; the push route asks :func:`producer_sub` for the identity to stamp.
"""

from __future__ import annotations

import logging

from quart import Response, g, request
from quart_trio import QuartTrio

from queen.auth import ANONYMOUS, AccessGate, AuthFailure, Identity
from queen.http.responses import error_response

log = logging.getLogger("queen.auth")

_IDENTITY = "queen_identity"


def install(app: QuartTrio, gate: AccessGate) -> None:
    """Register the hook, unless the gate is off: then every caller is anonymous and allowed,
    and no request pays for asking."""
    app.config["QUEEN_ACCESS_GATE"] = gate
    if not gate.enabled:
        return

    @app.before_request
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
            response = error_response(refusal.status, refusal.message, **refusal.extra)
            if refusal.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="queen"'
            return response
        setattr(g, _IDENTITY, identity)
        return None


def current_identity() -> Identity:
    """The caller of the request being served (anonymous with authentication off)."""
    identity = getattr(g, _IDENTITY, None)
    return identity if isinstance(identity, Identity) else ANONYMOUS


def producer_sub() -> str | None:
    """The identity stamped on pushed messages: the validated token's ``sub``, else None."""
    return current_identity().sub

"""The access gate: one decision per HTTP request, made before the route runs.

Order: authentication off → everyone is anonymous and allowed. A public path (``JWT_SKIP_PATHS``)
→ anonymous and allowed, whatever the headers; so are, while ``/`` is public, the files and
pages of an operator's built dashboard (:data:`WEBAPP_RULES`). Otherwise a valid bearer token
is required (401), the matched route must be in the access table (403 when it is not) and the
token's roles must cover the route's (403). A request that matches no route gets past the role
check so that the 404/405 answers, but still only with a valid token.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

from queen.auth.errors import AuthFailure
from queen.auth.roles import describe_roles, satisfies
from queen.auth.routes import ROUTES, RouteTable
from queen.auth.tokens import ANONYMOUS, Identity, TokenVerifier, bearer_token

log = logging.getLogger("queen.auth")

INSUFFICIENT_PERMISSIONS = "Insufficient permissions"


def parse_skip_paths(text: str) -> tuple[str, ...]:
    """``"/health, /metrics,"`` → ``("/health", "/metrics")``."""
    return tuple(entry.strip() for entry in text.split(",") if entry.strip())


DASHBOARD_ASSETS: Final = "/dashboard/assets/"
"""Where the dashboard page's script and style sheet are served: public whenever the page is."""
DASHBOARD_PAGE: Final = "/dashboard/"
"""The dashboard's page when an operator's built dashboard is served at ``/``."""
WEBAPP_RULES: Final = frozenset({"/assets/<path:name>", "/<path:rest>"})
"""The rules serving an operator's built dashboard (``WEBAPP_ROOT``): its files and the
pages of its own router, which hold no data (every figure is an API call); public whenever
``/`` is. Paths the broker keeps for itself answer 404 there."""


def path_is_public(path: str, skip_paths: Iterable[str]) -> bool:
    """A skip entry matches its path exactly; an entry ending in ``/`` (other than ``/``
    itself) also matches every path below it, and ``/`` (the dashboard's page) the paths
    below :data:`DASHBOARD_ASSETS` (the page's script and style sheet, which hold no data
    either) and :data:`DASHBOARD_PAGE`. The query string is not part of ``path``."""
    for entry in skip_paths:
        if path == entry:
            return True
        if entry == "/" and (path == DASHBOARD_PAGE or path.startswith(DASHBOARD_ASSETS)):
            return True
        if len(entry) > 1 and entry.endswith("/") and path.startswith(entry):
            return True
    return False


class AccessGate:
    """Decides every request; see the module docstring. ``verifier`` None: auth is off."""

    def __init__(
        self,
        verifier: TokenVerifier | None,
        *,
        skip_paths: Iterable[str] = ("/health", "/metrics"),
        routes: RouteTable = ROUTES,
    ) -> None:
        self.verifier = verifier
        self.skip_paths = tuple(skip_paths)
        self.routes = routes

    @classmethod
    def disabled(cls) -> AccessGate:
        return cls(None)

    @property
    def enabled(self) -> bool:
        return self.verifier is not None

    async def admit(
        self, method: str, path: str, rule: str | None, authorization: str | None
    ) -> Identity:
        """The caller of ``method path`` (matched to URL ``rule``, or None when no route
        matched), or :class:`AuthFailure` when the request must be refused."""
        if self.verifier is None or path_is_public(path, self.skip_paths):
            return ANONYMOUS
        if rule in WEBAPP_RULES and "/" in self.skip_paths:
            return ANONYMOUS
        identity = await self.verifier.verify(bearer_token(authorization))
        if rule is None:
            return identity
        needed = self.routes.required_roles(method, rule)
        if needed is None:
            log.warning("refused %s %s: the route is not in the access table", method, rule)
            raise AuthFailure(403, INSUFFICIENT_PERMISSIONS, reason="route has no access rule")
        if not satisfies(identity.roles, needed):
            raise AuthFailure(
                403, INSUFFICIENT_PERMISSIONS, sub=identity.sub, required=describe_roles(needed)
            )
        return identity

    async def warm_up(self) -> None:
        """Fetch the JWKS once ahead of the first request (a failure is logged, not raised:
        the set is fetched again on demand)."""
        jwks = self.verifier.keys.jwks if self.verifier is not None else None
        if jwks is not None and not await jwks.refresh():
            log.warning("JWKS %s not reachable at start-up: %s", jwks.url, jwks.last_error)

    def describe(self) -> str:
        if self.verifier is None:
            return "off"
        algorithms = ", ".join(sorted(self.verifier.algorithms))
        sources = ", ".join(f"{k} from {v}" for k, v in self.verifier.keys.sources().items())
        public = ", ".join(self.skip_paths) or "none"
        return f"JWT ({algorithms}; {sources}; public paths: {public})"

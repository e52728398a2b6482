"""Authentication and access control: JWT verification, the role model, the route table.

Nothing here knows HTTP frameworks; :mod:`queen.http.access` wires :class:`AccessGate` into
the app as one before-request hook.
"""

from queen.auth.config import build_gate
from queen.auth.errors import AuthConfigError, AuthFailure
from queen.auth.gate import AccessGate
from queen.auth.roles import Role, RoleSet, roles_from_claims, satisfies
from queen.auth.routes import ROUTE_TABLE, ROUTES, RouteAccess, RouteTable
from queen.auth.tokens import ANONYMOUS, Identity, TokenVerifier

__all__ = [
    "ANONYMOUS",
    "ROUTES",
    "ROUTE_TABLE",
    "AccessGate",
    "AuthConfigError",
    "AuthFailure",
    "Identity",
    "Role",
    "RoleSet",
    "RouteAccess",
    "RouteTable",
    "TokenVerifier",
    "build_gate",
    "roles_from_claims",
    "satisfies",
]

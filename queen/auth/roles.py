"""The role model: access is a *set* of roles, not a ladder.

A token holds exactly the roles it lists. ``read`` lets a caller look (status, resources, DLQ,
messages), ``write`` lets it push, and ``admin`` lets it run system operations. A route needs a
set of roles and is allowed when the caller holds every one of them, so a write-only producer
credential can push and do nothing else.

Everything here is pure: no I/O, no Trio.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any, Final


class Role(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


RoleSet = frozenset[Role]

NO_ROLES: Final[RoleSet] = frozenset()

#: Every name a token may carry, and the roles it grants. The three role names grant
#: themselves; the hyphenated names are the levels of the older broker, so its tokens keep
#: working. ``admin`` grants everything, as it did there.
ROLE_NAMES: Final[Mapping[str, RoleSet]] = {
    "read": frozenset({Role.READ}),
    "write": frozenset({Role.WRITE}),
    "admin": frozenset({Role.READ, Role.WRITE, Role.ADMIN}),
    "read-only": frozenset({Role.READ}),
    "write-only": frozenset({Role.WRITE}),
    "read-write": frozenset({Role.READ, Role.WRITE}),
}

#: The claims roles are read from: a string (one name) or an array of names, in either one.
ROLE_CLAIMS: Final = ("role", "roles")


def expand_roles(names: Iterable[str]) -> RoleSet:
    """The roles granted by ``names``. Unknown names grant nothing (they are not an error: an
    identity provider may put roles for other services in the same claim). Names are
    case-sensitive."""
    granted: set[Role] = set()
    for name in names:
        granted |= ROLE_NAMES.get(name, NO_ROLES)
    return frozenset(granted)


def role_names_in(claims: Mapping[str, Any]) -> list[str]:
    """The role names a token's claims carry: ``role`` and ``roles``, each a string or an array
    of strings. Values of any other shape, and non-string array elements, are ignored."""
    names: list[str] = []
    for claim in ROLE_CLAIMS:
        value = claims.get(claim)
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, list):
            names.extend(v for v in value if isinstance(v, str))
    return names


def roles_from_claims(claims: Mapping[str, Any]) -> RoleSet:
    return expand_roles(role_names_in(claims))


def satisfies(held: RoleSet, needed: RoleSet) -> bool:
    """True when ``held`` contains every role in ``needed`` (an empty ``needed`` is satisfied
    by any caller)."""
    return needed <= held


def describe_roles(roles: RoleSet) -> list[str]:
    """Role names in a stable order (read, write, admin), for answers and docs."""
    return [role.value for role in Role if role in roles]

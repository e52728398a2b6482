"""The access table: which roles every HTTP route needs. This is the one place that says it.

Each entry is a method and a URL rule as the app registers it (placeholder names do not
matter: ``/lease/<lease_id>/extend`` and ``/lease/<id>/extend`` are the same entry). A rule
ending in ``/**`` is a family: the rule itself and every rule below it, for that method; an
exact entry wins over a family. A route that no entry covers is refused to every caller, so a
new route cannot be left open by accident; ``tests/test_auth_http.py`` walks the app's URL
map and fails when a route is missing here.

The table may list routes the app does not serve yet; they cost nothing.

An entry marked ``audited`` is an operator's action (it deletes, clears, retries, moves a
cursor or switches maintenance): the app logs every call of it with the caller's ``sub``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from queen.auth.roles import NO_ROLES, Role, RoleSet

PUSH: Final[RoleSet] = frozenset({Role.WRITE})
READ: Final[RoleSet] = frozenset({Role.READ})
CONSUME: Final[RoleSet] = frozenset({Role.READ, Role.WRITE})
ADMIN: Final[RoleSet] = frozenset({Role.ADMIN})

FAMILY_SUFFIX: Final = "/**"
METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True, slots=True)
class RouteAccess:
    method: str
    rule: str
    roles: RoleSet
    what: str
    audited: bool = False


def _route(
    method: str, rule: str, roles: RoleSet, what: str, *, audited: bool = False
) -> RouteAccess:
    return RouteAccess(method, rule, roles, what, audited)


ROUTE_TABLE: Final[tuple[RouteAccess, ...]] = (
    # Producing: the one route a write-only credential can call.
    _route("POST", "/api/v1/push", PUSH, "push messages"),
    # Consuming and configuring: read and write.
    _route("GET", "/api/v1/pop", CONSUME, "pop from any queue (namespace/task)"),
    _route("GET", "/api/v1/pop/queue/<queue>", CONSUME, "pop from a queue"),
    _route(
        "GET",
        "/api/v1/pop/queue/<queue>/partition/<partition>",
        CONSUME,
        "pop from one partition",
    ),
    _route("POST", "/api/v1/ack", CONSUME, "acknowledge a message"),
    _route("POST", "/api/v1/ack/batch", CONSUME, "acknowledge messages"),
    _route("POST", "/api/v1/lease/<lease_id>/extend", CONSUME, "extend a lease"),
    _route("POST", "/api/v1/transaction", CONSUME, "acks and pushes in one transaction"),
    _route("POST", "/api/v1/configure", CONSUME, "create or reconfigure a queue"),
    _route(
        "POST",
        "/api/v1/consumer-groups/<group>/subscription",
        CONSUME,
        "move a consumer group's subscription time",
        audited=True,
    ),
    _route(
        "POST",
        "/api/v1/consumer-groups/<group>/queues/<queue>/seek",
        CONSUME,
        "move a consumer group's cursor on a queue (a consumer's operation, as in the clients)",
        audited=True,
    ),
    _route(
        "POST",
        "/api/v1/consumer-groups/<group>/queues/<queue>/partitions/<partition>/seek",
        CONSUME,
        "move a consumer group's cursor on one partition to its end",
        audited=True,
    ),
    _route("POST", "/api/v1/traces", CONSUME, "record a processing trace"),
    # Streams SDK: read and write.
    _route("POST", "/streams/v1/queries", CONSUME, "register a streaming query"),
    _route("POST", "/streams/v1/cycle", CONSUME, "commit a streaming cycle"),
    _route("POST", "/streams/v1/state/get", CONSUME, "read a streaming query's state"),
    # Reading: read.
    _route("GET", "/api/v1/dlq", READ, "dead-letter messages"),
    _route("GET", "/api/v1/resources/**", READ, "queues, partitions, namespaces, depth"),
    _route("GET", "/api/v1/status/**", READ, "broker and queue status"),
    _route("GET", "/api/v1/messages/**", READ, "stored messages"),
    _route("GET", "/api/v1/consumer-groups/**", READ, "consumer groups and their lag"),
    _route("GET", "/api/v1/traces/**", READ, "processing traces"),
    _route("GET", "/api/v1/analytics/**", READ, "throughput and latency figures"),
    _route("GET", "/health", READ, "health (public while in JWT_SKIP_PATHS)"),
    _route("GET", "/metrics", READ, "Prometheus metrics (public while in JWT_SKIP_PATHS)"),
    _route("GET", "/metrics/prometheus", READ, "Prometheus metrics (public by default)"),
    _route("GET", "/", READ, "the dashboard's page (public by default; holds no data)"),
    _route("GET", "/dashboard/**", READ, "the dashboard's page and views"),
    _route(
        "GET",
        "/assets/<path:name>",
        READ,
        "an operator's built dashboard's files (WEBAPP_ROOT; public whenever / is)",
    ),
    _route(
        "GET",
        "/<path:rest>",
        READ,
        "an operator's built dashboard's pages and files (WEBAPP_ROOT; public whenever / is)",
    ),
    # System and operator actions: admin.
    _route("GET", "/api/v1/system/maintenance", ADMIN, "push maintenance mode"),
    _route(
        "POST", "/api/v1/system/maintenance", ADMIN, "switch push maintenance mode", audited=True
    ),
    _route("GET", "/api/v1/system/maintenance/pop", ADMIN, "pop maintenance mode"),
    _route(
        "POST",
        "/api/v1/system/maintenance/pop",
        ADMIN,
        "switch pop maintenance mode",
        audited=True,
    ),
    _route("DELETE", "/api/v1/resources/queues/<queue>", ADMIN, "delete a queue", audited=True),
    _route("DELETE", "/api/v1/queues/<queue>/clear", ADMIN, "clear a queue", audited=True),
    _route(
        "DELETE", "/api/v1/consumer-groups/<group>", ADMIN, "delete a consumer group", audited=True
    ),
    _route(
        "DELETE",
        "/api/v1/consumer-groups/<group>/queues/<queue>",
        ADMIN,
        "delete a consumer group's state on one queue",
        audited=True,
    ),
    _route("POST", "/api/v1/stats/refresh", ADMIN, "recompute statistics"),
    _route(
        "GET",
        "/api/v1/migration/status",
        ADMIN,
        "the original's database migration: nothing runs here (queen import instead)",
    ),
    _route(
        "POST",
        "/api/v1/migration/**",
        ADMIN,
        "the original's database migration: 501, naming queen import",
    ),
    _route(
        "DELETE",
        "/api/v1/messages/<partition_id>/<transaction_id>",
        ADMIN,
        "delete a message",
        audited=True,
    ),
    _route(
        "POST",
        "/api/v1/messages/<partition_id>/<transaction_id>/retry",
        ADMIN,
        "deliver a dead-lettered message again",
        audited=True,
    ),
    _route(
        "POST",
        "/api/v1/messages/<partition_id>/<transaction_id>/dlq",
        ADMIN,
        "move a message to a dead letter queue",
        audited=True,
    ),
    _route("POST", "/api/v1/dlq/retry", ADMIN, "deliver dead letters again", audited=True),
)

_PLACEHOLDER = re.compile(r"<[^<>]*>")


def normalize_rule(rule: str) -> str:
    """``/a/<int:x>/b/<y>`` → ``/a/<>/b/<>``: placeholder names and converters do not count."""
    return _PLACEHOLDER.sub("<>", rule)


class RouteTable:
    """Answers "which roles does (method, rule) need?" from a list of :class:`RouteAccess`.

    ``HEAD`` is looked up as ``GET``. ``OPTIONS`` (answered by the framework with the allowed
    methods, nothing else) needs no role, only a valid token. ``None`` means the route is not
    in the table and must be refused.
    """

    def __init__(self, entries: Iterable[RouteAccess]) -> None:
        self.entries = tuple(entries)
        self._exact: dict[tuple[str, str], RoleSet] = {}
        self._families: list[tuple[str, str, RoleSet]] = []
        self._audited = frozenset(
            (e.method, normalize_rule(e.rule)) for e in self.entries if e.audited
        )
        for entry in self.entries:
            if entry.method not in METHODS:
                raise ValueError(f"unknown method in the access table: {entry.method}")
            rule = normalize_rule(entry.rule)
            if rule.endswith(FAMILY_SUFFIX):
                prefix = rule.removesuffix(FAMILY_SUFFIX)
                if any(m == entry.method and p == prefix for m, p, _ in self._families):
                    raise ValueError(f"duplicate family {entry.method} {entry.rule}")
                self._families.append((entry.method, prefix, entry.roles))
            else:
                key = (entry.method, rule)
                if key in self._exact:
                    raise ValueError(f"duplicate route {entry.method} {entry.rule}")
                self._exact[key] = entry.roles
        # Longest prefix first, so the most specific family wins.
        self._families.sort(key=lambda family: len(family[1]), reverse=True)
        self._cache: dict[tuple[str, str], RoleSet | None] = {}
        self._audited_cache: dict[tuple[str, str], bool] = {}

    def __iter__(self) -> Iterator[RouteAccess]:
        return iter(self.entries)

    def audited(self, method: str, rule: str) -> bool:
        """Whether calls of (method, rule) are logged as an operator's action (asked at every
        request: remembered per method and rule, as the roles are)."""
        key = (method, rule)
        found = self._audited_cache.get(key)
        if found is None:
            found = (method.upper(), normalize_rule(rule)) in self._audited
            if len(self._audited_cache) < 4096:
                self._audited_cache[key] = found
        return found

    def required_roles(self, method: str, rule: str) -> RoleSet | None:
        key = (method, rule)
        try:
            return self._cache[key]
        except KeyError:
            pass
        found = self._find(method.upper(), normalize_rule(rule))
        if len(self._cache) < 4096:
            self._cache[key] = found
        return found

    def _find(self, method: str, rule: str) -> RoleSet | None:
        if method == "OPTIONS":
            return NO_ROLES
        if method == "HEAD":
            method = "GET"
        exact = self._exact.get((method, rule))
        if exact is not None:
            return exact
        for family_method, prefix, roles in self._families:
            if family_method == method and (rule == prefix or rule.startswith(prefix + "/")):
                return roles
        return None


ROUTES: Final = RouteTable(ROUTE_TABLE)

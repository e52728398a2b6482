"""The pure parts of authentication: role sets, the route table, skip paths, bearer headers,
time claims. No Trio, no HTTP."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from queen.auth.errors import AuthFailure
from queen.auth.gate import parse_skip_paths, path_is_public
from queen.auth.roles import (
    Role,
    describe_roles,
    expand_roles,
    role_names_in,
    roles_from_claims,
    satisfies,
)
from queen.auth.routes import (
    ADMIN,
    CONSUME,
    PUSH,
    READ,
    ROUTE_TABLE,
    ROUTES,
    RouteAccess,
    RouteTable,
    normalize_rule,
)
from queen.auth.tokens import bearer_token, check_times, refuse_algorithm

R, W, A = Role.READ, Role.WRITE, Role.ADMIN


@pytest.mark.parametrize(
    ("names", "roles"),
    [
        (["read"], {R}),
        (["write"], {W}),
        (["admin"], {R, W, A}),
        (["read-only"], {R}),
        (["write-only"], {W}),
        (["read-write"], {R, W}),
        (["read", "write"], {R, W}),
        (["write", "write-only"], {W}),
        ([], set()),
        (["superuser", "Admin", "READ"], set()),  # unknown names, and names are case-sensitive
    ],
)
def test_role_names_expand_to_exactly_the_roles_they_list(names: list[str], roles: set[Role]):
    assert expand_roles(names) == frozenset(roles)


def test_roles_come_from_the_role_string_and_the_roles_array() -> None:
    assert roles_from_claims({"role": "write-only"}) == {W}
    assert roles_from_claims({"roles": ["read"]}) == {R}
    assert roles_from_claims({"role": "read", "roles": ["write"]}) == {R, W}
    assert roles_from_claims({"role": ["read", "write"]}) == {R, W}
    assert roles_from_claims({"roles": "admin"}) == {R, W, A}
    # Shapes that carry no role names grant nothing (and do not fail).
    assert role_names_in({"roles": [1, None, {"x": "admin"}, "read"], "role": 7}) == ["read"]
    assert roles_from_claims({"sub": "x"}) == frozenset()


def test_a_route_is_allowed_only_with_every_role_it_needs() -> None:
    assert satisfies(frozenset({W}), PUSH)
    assert not satisfies(frozenset({W}), READ)
    assert not satisfies(frozenset({W}), CONSUME)
    assert not satisfies(frozenset({R}), CONSUME)
    assert satisfies(frozenset({R, W}), CONSUME)
    assert not satisfies(frozenset({R, W}), ADMIN)
    assert satisfies(expand_roles(["admin"]), ADMIN | CONSUME)
    assert satisfies(frozenset(), frozenset())
    assert describe_roles(frozenset({A, W, R})) == ["read", "write", "admin"]


# The policy of the issue, written out independently of the table: (method, rule, roles).
ISSUE_POLICY = [
    ("POST", "/api/v1/push", {W}),
    ("GET", "/api/v1/dlq", {R}),
    ("GET", "/api/v1/resources/queues", {R}),
    ("GET", "/api/v1/resources/queues/<q>", {R}),
    ("GET", "/api/v1/resources/queues/<q>/depth", {R}),
    ("GET", "/api/v1/resources/overview", {R}),
    ("GET", "/api/v1/status", {R}),
    ("GET", "/api/v1/status/queues/<q>", {R}),
    ("GET", "/api/v1/messages", {R}),
    ("GET", "/api/v1/messages/<p>/<t>", {R}),
    ("GET", "/api/v1/pop", {R, W}),
    ("GET", "/api/v1/pop/queue/<q>", {R, W}),
    ("GET", "/api/v1/pop/queue/<q>/partition/<p>", {R, W}),
    ("POST", "/api/v1/ack", {R, W}),
    ("POST", "/api/v1/ack/batch", {R, W}),
    ("POST", "/api/v1/lease/<lease_id>/extend", {R, W}),
    ("POST", "/api/v1/transaction", {R, W}),
    ("POST", "/api/v1/configure", {R, W}),
    ("POST", "/api/v1/consumer-groups/<g>/subscription", {R, W}),
    ("GET", "/api/v1/system/maintenance", {A}),
    ("POST", "/api/v1/system/maintenance", {A}),
    ("GET", "/api/v1/system/maintenance/pop", {A}),
    ("POST", "/api/v1/system/maintenance/pop", {A}),
    ("DELETE", "/api/v1/resources/queues/<q>", {A}),
    ("DELETE", "/api/v1/consumer-groups/<g>", {A}),
]


@pytest.mark.parametrize(("method", "rule", "roles"), ISSUE_POLICY)
def test_the_table_gives_every_route_of_the_issue_its_roles(
    method: str, rule: str, roles: set[Role]
) -> None:
    assert ROUTES.required_roles(method, rule) == frozenset(roles)


def test_push_is_the_one_route_a_write_only_token_can_call() -> None:
    write_only = expand_roles(["write-only"])
    callable_routes = [(e.method, e.rule) for e in ROUTE_TABLE if satisfies(write_only, e.roles)]
    assert callable_routes == [("POST", "/api/v1/push")]


def test_a_route_missing_from_the_table_is_refused() -> None:
    assert ROUTES.required_roles("POST", "/api/v1/brand-new") is None
    assert ROUTES.required_roles("PUT", "/api/v1/push") is None
    assert ROUTES.required_roles("DELETE", "/api/v1/dlq") is None
    assert ROUTES.required_roles("POST", "/api/v1/resources/queues") is None  # GET family only
    assert ROUTES.required_roles("GET", "/api/v1/resourcesX") is None  # families are by segment
    assert ROUTES.required_roles("POST", "/api/v1/system/shutdown") is None


def test_placeholder_names_do_not_matter_and_head_is_get() -> None:
    assert normalize_rule("/a/<int:x>/b/<y>") == "/a/<>/b/<>"
    assert ROUTES.required_roles("POST", "/api/v1/lease/<id>/extend") == CONSUME
    assert ROUTES.required_roles("GET", "/api/v1/pop/queue/<path:name>") == CONSUME
    assert ROUTES.required_roles("HEAD", "/api/v1/dlq") == READ
    assert ROUTES.required_roles("post", "/api/v1/push") == PUSH
    # OPTIONS only lists the allowed methods: it needs a valid token and no role.
    assert ROUTES.required_roles("OPTIONS", "/api/v1/system/maintenance") == frozenset()


def test_an_exact_entry_wins_over_a_family_and_the_longest_family_wins() -> None:
    table = RouteTable(
        [
            RouteAccess("GET", "/x/**", READ, ""),
            RouteAccess("GET", "/x/y/**", ADMIN, ""),
            RouteAccess("GET", "/x/y/<id>/z", CONSUME, ""),
        ]
    )
    assert table.required_roles("GET", "/x") == READ
    assert table.required_roles("GET", "/x/<a>") == READ
    assert table.required_roles("GET", "/x/y") == ADMIN
    assert table.required_roles("GET", "/x/y/<b>") == ADMIN
    assert table.required_roles("GET", "/x/y/<b>/z") == CONSUME


def test_the_table_refuses_duplicates_and_unknown_methods() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        RouteTable([RouteAccess("GET", "/a/<x>", READ, ""), RouteAccess("GET", "/a/<y>", READ, "")])
    with pytest.raises(ValueError, match="duplicate family"):
        RouteTable([RouteAccess("GET", "/a/**", READ, ""), RouteAccess("GET", "/a/**", PUSH, "")])
    with pytest.raises(ValueError, match="method"):
        RouteTable([RouteAccess("FETCH", "/a", READ, "")])


def test_skip_paths() -> None:
    paths = parse_skip_paths(" /health, /metrics ,,/docs/,/")
    assert paths == ("/health", "/metrics", "/docs/", "/")
    assert path_is_public("/health", paths)
    assert path_is_public("/metrics", paths)
    assert path_is_public("/docs/a/b", paths)
    assert path_is_public("/", paths)  # "/" matches itself only
    assert not path_is_public("/healthz", paths)
    assert not path_is_public("/health/x", paths)
    assert not path_is_public("/api/v1/push", paths)
    assert parse_skip_paths("") == ()


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc.def.ghi", "abc.def.ghi"), ("bearer x", "x"), ("BEARER  x ", "x")],
)
def test_bearer_token_scheme_is_case_insensitive(header: str, token: str) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "Authentication required"),
        ("", "Authentication required"),
        ("Bearer", "Authentication required"),
        ("Bearer   ", "Authentication required"),
        ("Basic dXNlcjpwYXNz", "Authorization header must be 'Bearer <token>'"),
        ("abc.def.ghi", "Authorization header must be 'Bearer <token>'"),
    ],
)
def test_bearer_token_refusals_are_401(header: str | None, message: str) -> None:
    with pytest.raises(AuthFailure) as caught:
        bearer_token(header)
    assert caught.value.status == 401
    assert caught.value.message == message


NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("claims", "now", "message"),
    [
        ({"exp": NOW - 31}, NOW, "Token has expired"),
        ({"exp": NOW - 30}, NOW, "Token has expired"),
        ({"nbf": NOW + 31}, NOW, "Token is not yet valid"),
        ({"iat": NOW + 31}, NOW, "Token is not yet valid (issued in the future)"),
        ({"exp": "tomorrow"}, NOW, "Invalid token: exp is not a number"),
        ({"nbf": True}, NOW, "Invalid token: nbf is not a number"),
        ({"iat": float("nan")}, NOW, "Invalid token: iat is not a number"),
    ],
)
def test_time_claims_refused(claims: dict[str, object], now: float, message: str) -> None:
    with pytest.raises(AuthFailure) as caught:
        check_times(claims, now, 30)
    assert (caught.value.status, caught.value.message) == (401, message)


@pytest.mark.parametrize(
    "claims",
    [
        {},
        {"exp": NOW - 29},  # inside the skew
        {"exp": NOW + 3600, "nbf": NOW + 30, "iat": NOW + 30},
        {"exp": NOW + 0.5, "nbf": NOW - 1.5},  # fractional NumericDates are fine
    ],
)
def test_time_claims_accepted(claims: dict[str, object]) -> None:
    check_times(claims, NOW, 30)


def test_algorithm_refusals_name_the_problem() -> None:
    assert refuse_algorithm("none", {"HS256"}).message == "Unsupported algorithm: none"
    assert refuse_algorithm("HS512", {"HS256"}).message == "Unsupported algorithm: HS512"
    assert refuse_algorithm("HS256", {"RS256"}).message == "Token uses HS256, expected RS256"
    assert refuse_algorithm(None, {"RS256"}).message == "Token header has no algorithm"
    assert refuse_algorithm(7, {"RS256"}).status == 401


def test_the_docs_list_the_route_table_as_it_is() -> None:
    readme = (Path(__file__).parent.parent / "docs" / "authentication.md").read_text()
    rows = re.findall(r"^\| `([A-Z]+) (\S+)` \| ([a-z +]+) \|", readme, flags=re.MULTILINE)
    documented = [(method, rule, set(roles.split(" + "))) for method, rule, roles in rows]
    actual = [(e.method, e.rule, set(describe_roles(e.roles))) for e in ROUTE_TABLE]
    assert documented == actual

"""Authentication through the app: the exact answers of every refusal, the role matrix over
every route of the URL map, the stamped producerSub, public paths, and start-up errors."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest
import trio
from quart_trio import QuartTrio
from werkzeug.routing import Rule

from queen.auth import ROUTES, Role, build_gate, satisfies
from queen.auth.gate import parse_skip_paths, path_is_public
from queen.broker import Broker
from queen.http.app import create_app
from queen.server import StartupError, serve
from queen.settings import Settings
from tests.conftest import Db
from tests.jwt_tools import (
    OTHER_SECRET,
    SECRET,
    bearer,
    claims,
    hs256,
    hs256_keyed_with,
    public_pem,
    rs256,
    rsa_key,
    unsigned,
)

PUSH = "/api/v1/push"


def auth_settings(broker: Broker, **changes: Any) -> Settings:
    return broker.settings.with_changes(**{"jwt_enabled": True, "jwt_secret": SECRET, **changes})


@pytest.fixture
def auth_app(broker: Broker) -> QuartTrio:
    return create_app(broker, gate=build_gate(auth_settings(broker)))


@pytest.fixture
def auth_client(auth_app: QuartTrio) -> Any:
    return auth_app.test_client()


def push_body(queue: str, **extra: Any) -> dict[str, Any]:
    return {"items": [{"queue": queue, "partition": "p", "payload": {"n": 1}, **extra}]}


# --- every refusal, with its exact status --------------------------------------------------


async def test_missing_token_is_401_authentication_required(auth_client: Any, queue: str):
    resp = await auth_client.post(PUSH, json=push_body(queue))
    assert resp.status_code == 401
    assert await resp.get_json() == {"error": "Authentication required"}
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (hs256(claims(roles=["write"], now=0, ttl_s=60)), "Token has expired"),
        (hs256(claims(roles=["write"], nbf=4_000_000_000)), "Token is not yet valid"),
        (hs256(claims(roles=["write"]), secret=OTHER_SECRET), "Invalid token signature"),
        (unsigned(claims(roles=["admin"])), "Unsupported algorithm: none"),
        ("not.a.token", "Malformed token"),
        ("garbage", "Malformed token"),
        ("\u00e9\u00e9.\u00e9", "Malformed token"),
    ],
)
async def test_bad_tokens_are_401_with_a_reason(
    auth_client: Any, queue: str, token: str, message: str, db: Db
) -> None:
    resp = await auth_client.post(PUSH, json=push_body(queue), headers=bearer(token))
    assert resp.status_code == 401
    assert await resp.get_json() == {"error": message}
    assert await db.count_frames(queue) == 0


async def test_wrong_issuer_and_wrong_audience_are_401(broker: Broker, queue: str) -> None:
    settings = auth_settings(broker, jwt_issuer="https://idp", jwt_audience="queen")
    client = create_app(broker, gate=build_gate(settings)).test_client()
    cases = [
        (claims(roles=["write"], iss="https://other", aud="queen"), "Invalid token issuer"),
        (claims(roles=["write"], iss="https://idp", aud="other"), "Invalid token audience"),
    ]
    for payload, message in cases:
        resp = await client.post(PUSH, json=push_body(queue), headers=bearer(hs256(payload)))
        assert resp.status_code == 401
        assert await resp.get_json() == {"error": message}
    ok = claims(roles=["write"], iss="https://idp", aud="queen")
    resp = await client.post(PUSH, json=push_body(queue), headers=bearer(hs256(ok)))
    assert resp.status_code == 201


async def test_hs256_token_signed_with_the_rs256_public_key_is_401(
    broker: Broker, queue: str, db: Db
) -> None:
    pem = public_pem(rsa_key())
    settings = auth_settings(broker, jwt_secret=None, jwt_algorithm="RS256", jwt_public_key=pem)
    client = create_app(broker, gate=build_gate(settings)).test_client()
    forged = hs256_keyed_with(claims(roles=["admin"]), pem.encode())
    resp = await client.post(PUSH, json=push_body(queue), headers=bearer(forged))
    assert resp.status_code == 401
    assert await resp.get_json() == {"error": "Token uses HS256, expected RS256"}
    real = rs256(claims(roles=["write"]))
    assert (await client.post(PUSH, json=push_body(queue), headers=bearer(real))).status_code == 201
    assert await db.count_frames(queue) == 1


async def test_a_token_without_the_role_is_403(auth_client: Any, queue: str, db: Db) -> None:
    token = hs256(claims(roles=["read-only"]))
    resp = await auth_client.post(PUSH, json=push_body(queue), headers=bearer(token))
    assert resp.status_code == 403
    assert await resp.get_json() == {"error": "Insufficient permissions", "required": ["write"]}
    no_roles = hs256(claims())
    resp = await auth_client.post(PUSH, json=push_body(queue), headers=bearer(no_roles))
    assert resp.status_code == 403
    assert await db.count_frames(queue) == 0


async def test_the_bearer_scheme_is_case_insensitive(auth_client: Any, queue: str) -> None:
    token = hs256(claims(roles=["write"]))
    for scheme in ("Bearer", "bearer", "BEARER"):
        resp = await auth_client.post(
            PUSH, json=push_body(queue), headers={"Authorization": f"{scheme} {token}"}
        )
        assert resp.status_code == 201
    resp = await auth_client.post(
        PUSH, json=push_body(queue), headers={"authorization": f"Basic {token}"}
    )
    assert resp.status_code == 401


async def test_a_refused_push_is_answered_before_its_body_is_read(
    broker: Broker, queue: str
) -> None:
    settings = auth_settings(broker, max_body_bytes=1024)
    client = create_app(broker, gate=build_gate(settings)).test_client()
    big = b'{"items": [{"queue": "q", "payload": "' + b"x" * 4096 + b'"}]}'
    resp = await client.post(PUSH, data=big, headers={"content-type": "application/json"})
    assert resp.status_code == 401  # not 413: the gate answered first


# --- public paths --------------------------------------------------------------------------


async def test_skip_paths_are_reachable_without_a_token(auth_client: Any) -> None:
    for path in ("/health", "/metrics"):
        resp = await auth_client.get(path)
        assert resp.status_code == 200, path
        # A token that fails verification does not matter on a public path.
        resp = await auth_client.get(path, headers=bearer("garbage"))
        assert resp.status_code == 200, path


async def test_skip_paths_are_configurable(broker: Broker) -> None:
    client = create_app(
        broker, gate=build_gate(auth_settings(broker, jwt_skip_paths="/health"))
    ).test_client()
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/metrics")).status_code == 401
    reader = bearer(hs256(claims(roles=["read"])))
    assert (await client.get("/metrics", headers=reader)).status_code == 200
    writer = bearer(hs256(claims(roles=["write"])))
    assert (await client.get("/metrics", headers=writer)).status_code == 403


async def test_an_unknown_path_needs_a_token_and_then_is_404(auth_client: Any) -> None:
    assert (await auth_client.get("/api/v1/nothing-here")).status_code == 401
    reader = bearer(hs256(claims(roles=["read"])))
    assert (await auth_client.get("/api/v1/nothing-here", headers=reader)).status_code == 404
    writer = bearer(hs256(claims(roles=["write"])))
    assert (await auth_client.get(PUSH, headers=writer)).status_code == 405


async def test_a_route_missing_from_the_table_is_refused_to_every_caller(broker: Broker):
    app = create_app(broker, gate=build_gate(auth_settings(broker)))

    @app.get("/api/v1/unlisted")
    async def unlisted() -> str:
        return "open"

    client = app.test_client()
    admin = bearer(hs256(claims(roles=["admin"])))
    resp = await client.get("/api/v1/unlisted", headers=admin)
    assert resp.status_code == 403
    assert (await resp.get_json())["error"] == "Insufficient permissions"
    assert (await client.get("/api/v1/unlisted")).status_code == 401


# --- the role matrix -----------------------------------------------------------------------

TOKENS: dict[str, list[str]] = {
    "write-only": ["write-only"],
    "read-only": ["read-only"],
    "read-write": ["read-write"],
    "admin": ["admin"],
}
HOLDS = {
    "write-only": frozenset({Role.WRITE}),
    "read-only": frozenset({Role.READ}),
    "read-write": frozenset({Role.READ, Role.WRITE}),
    "admin": frozenset({Role.READ, Role.WRITE, Role.ADMIN}),
}


def app_routes(app: QuartTrio) -> list[tuple[str, Rule]]:
    """Every (method, rule) the app serves, HEAD and OPTIONS aside."""
    return sorted(
        (
            (method, rule)
            for rule in app.url_map.iter_rules()
            for method in rule.methods or ()
            if method not in ("HEAD", "OPTIONS")
        ),
        key=lambda pair: (pair[1].rule, pair[0]),
    )


def sample_url(app: QuartTrio, rule: Rule, method: str) -> str:
    """A concrete URL that ``rule`` matches, with made-up values for its placeholders."""
    adapter = app.url_map.bind("localhost")
    name = f"matrix-{uuid.uuid4().hex[:8]}"
    for sample in (name, "1", str(uuid.uuid4())):
        try:
            url = adapter.build(rule.endpoint, dict.fromkeys(rule.arguments, sample), method=method)
            matched, _ = adapter.match(url.split("?")[0], method=method, return_rule=True)
        except Exception:
            continue
        if matched is rule:
            return url
    raise AssertionError(f"cannot build a URL for {method} {rule.rule}")


async def call(client: Any, method: str, url: str, headers: dict[str, str]) -> int:
    kwargs: dict[str, Any] = {"method": method, "headers": headers}
    if method in ("POST", "PUT", "PATCH"):
        kwargs["json"] = {}
    else:
        kwargs["query_string"] = {"wait": "false"}
    with trio.fail_after(30):
        resp = await client.open(url, **kwargs)
    return int(resp.status_code)


async def test_every_route_of_the_app_is_in_the_access_table(auth_app: QuartTrio) -> None:
    missing = [
        f"{method} {rule.rule}"
        for method, rule in app_routes(auth_app)
        if ROUTES.required_roles(method, rule.rule) is None
    ]
    assert missing == [], "add these routes to queen/auth/routes.py: " + ", ".join(missing)
    assert ("POST", "/api/v1/push") in {(m, r.rule) for m, r in app_routes(auth_app)}


async def test_role_matrix_over_every_route(auth_app: QuartTrio, auth_client: Any) -> None:
    """For every route the app serves: no token → 401 (unless public); each kind of token is
    allowed exactly when its roles cover the table's entry, else 403. A write-only token is
    refused everywhere but the push route."""
    skip = parse_skip_paths(Settings().jwt_skip_paths)
    seen = 0
    for method, rule in app_routes(auth_app):
        url = sample_url(auth_app, rule, method)
        path = url.split("?")[0]
        public = path_is_public(path, skip)
        needed = ROUTES.required_roles(method, rule.rule)
        assert needed is not None
        anonymous = await call(auth_client, method, url, {})
        if public:
            assert anonymous not in (401, 403), (method, rule.rule)
        else:
            assert anonymous == 401, (method, rule.rule)
        for kind, names in TOKENS.items():
            status = await call(auth_client, method, url, bearer(hs256(claims(roles=names))))
            if public or satisfies(HOLDS[kind], needed):
                assert status not in (401, 403), (kind, method, rule.rule, status)
            else:
                assert status == 403, (kind, method, rule.rule, status)
            if kind == "write-only" and not public:
                allowed = status not in (401, 403)
                assert allowed == ((method, rule.rule) == ("POST", PUSH)), (method, rule.rule)
        seen += 1
    assert seen >= 3


async def test_with_auth_off_every_route_is_open(broker: Broker, client: Any) -> None:
    app = create_app(broker)
    for method, rule in app_routes(app):
        status = await call(client, method, sample_url(app, rule, method), {})
        assert status not in (401, 403), (method, rule.rule)


# --- the stamped producerSub ---------------------------------------------------------------


async def test_producer_sub_is_the_tokens_sub_never_the_body(
    auth_client: Any, queue: str, db: Db
) -> None:
    token = hs256(claims(sub="svc-a", roles=["write-only"]))
    body = {
        "items": [
            {"queue": queue, "partition": "p", "payload": 1, "producerSub": "forged"},
            {"queue": queue, "partition": "p", "payload": 2, "producer_sub": "forged"},
        ]
    }
    resp = await auth_client.post(PUSH, json=body, headers=bearer(token))
    assert resp.status_code == 201
    assert [r["status"] for r in await resp.get_json()] == ["queued", "queued"]
    assert [f["sub"] for f in await db.frames(queue, "p")] == ["svc-a", "svc-a"]


async def test_producer_sub_pops_back_as_the_pushers_sub(auth_client: Any, queue: str) -> None:
    pusher = hs256(claims(sub="svc-a", roles=["write-only"]))
    body = {
        "items": [{"queue": queue, "partition": "p", "payload": {"n": 1}, "producerSub": "forged"}]
    }
    resp = await auth_client.post(PUSH, json=body, headers=bearer(pusher))
    assert resp.status_code == 201
    consumer = hs256(claims(sub="svc-consumer", roles=["read-write"]))
    popped = await auth_client.get(
        f"/api/v1/pop/queue/{queue}?batch=10&wait=false", headers=bearer(consumer)
    )
    assert popped.status_code == 200
    (message,) = (await popped.get_json())["messages"]
    assert message["producerSub"] == "svc-a"
    assert message["data"] == {"n": 1}


async def test_a_transaction_push_is_stamped_with_the_callers_sub(
    auth_client: Any, queue: str, db: Db
) -> None:
    caller = hs256(claims(sub="svc-tx", roles=["read-write"]))
    body = {
        "operations": [
            {
                "type": "push",
                "items": [
                    {"queue": queue, "partition": "p", "payload": 1, "producerSub": "forged"}
                ],
            }
        ]
    }
    resp = await auth_client.post("/api/v1/transaction", json=body, headers=bearer(caller))
    assert resp.status_code == 200
    assert (await resp.get_json())["success"] is True
    assert [f["sub"] for f in await db.frames(queue, "p")] == ["svc-tx"]


async def test_each_push_is_stamped_with_its_own_caller(
    auth_client: Any, queue: str, db: Db
) -> None:
    for sub in ("svc-a", "svc-b"):
        token = hs256(claims(sub=sub, roles=["read-write"]))
        resp = await auth_client.post(PUSH, json=push_body(queue), headers=bearer(token))
        assert resp.status_code == 201
    no_sub = hs256(claims(sub=None, roles=["write"]))
    resp = await auth_client.post(PUSH, json=push_body(queue), headers=bearer(no_sub))
    assert resp.status_code == 201
    assert [f["sub"] for f in await db.frames(queue, "p")] == ["svc-a", "svc-b", None]


async def test_with_auth_off_producer_sub_is_null(client: Any, queue: str, db: Db) -> None:
    token = hs256(claims(sub="svc-a", roles=["write"]))  # sent, but auth is off
    body = push_body(queue, producerSub="forged")
    resp = await client.post(PUSH, json=body, headers=bearer(token))
    assert resp.status_code == 201
    assert [f["sub"] for f in await db.frames(queue, "p")] == [None]
    popped = await client.get(f"/api/v1/pop/queue/{queue}?wait=false")
    assert [m["producerSub"] for m in (await popped.get_json())["messages"]] == [None]


# --- start-up ------------------------------------------------------------------------------


async def test_serve_with_auth_over_a_real_socket(
    settings: Settings, queue: str, db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queen.server")
    settings = settings.with_changes(host="127.0.0.1", port=0, jwt_enabled=True, jwt_secret=SECRET)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, settings)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/health")).status_code == 200
            refused = await http.post(PUSH, json=push_body(queue))
            assert refused.status_code == 401
            assert refused.json() == {"error": "Authentication required"}
            token = hs256(claims(sub="svc-socket", roles=["write-only"]))
            resp = await http.post(PUSH, json=push_body(queue), headers=bearer(token))
            assert resp.status_code == 201
        nursery.cancel_scope.cancel()
    assert [f["sub"] for f in await db.frames(queue, "p")] == ["svc-socket"]
    lines = [r.getMessage() for r in caplog.records if "authentication:" in r.getMessage()]
    assert lines == [
        "authentication: JWT (HS256; HS256 from JWT_SECRET; "
        "public paths: /health, /metrics, /metrics/prometheus, /)"
    ]


async def test_serve_refuses_to_start_with_broken_auth_settings(settings: Settings) -> None:
    for changes, variable in [
        ({"jwt_enabled": True}, "JWT_SECRET"),
        ({"jwt_enabled": True, "jwt_algorithm": "RS256"}, "JWT_PUBLIC_KEY"),
        ({"jwt_enabled": True, "jwt_algorithm": "RS256", "jwt_public_key": "x"}, "JWT_PUBLIC_KEY"),
        ({"jwt_enabled": True, "jwt_algorithm": "PS256"}, "JWT_ALGORITHM"),
    ]:
        with pytest.raises(StartupError, match=variable):
            await serve(settings.with_changes(host="127.0.0.1", port=0, **changes))


def test_queen_serve_exits_2_naming_the_variable(tmp_path: Any) -> None:
    env = {
        **os.environ,
        "JWT_ENABLED": "true",
        "JWT_ALGORITHM": "RS256",
        "FILE_BUFFER_DIR": str(tmp_path / "spool"),
        "QUEEN_PG_DATA_DIR": str(tmp_path / "pg"),
    }
    env.pop("JWT_PUBLIC_KEY", None)
    env.pop("JWT_JWKS_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "queen.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "JWT_PUBLIC_KEY" in done.stderr and "JWT_JWKS_URL" in done.stderr
    assert not (tmp_path / "pg").exists()  # stopped before starting anything

    env["JWT_ENABLED"] = "yes"
    done = subprocess.run(
        [sys.executable, "-m", "queen.cli", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "JWT_ENABLED" in done.stderr

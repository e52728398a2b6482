"""Keys from a JSON Web Key Set served by a small HTTP server inside the test: choice by kid,
rotation, the refresh interval, failures and the fetch deadline. Refresh timing runs on a fake
clock; the server is real, so the fetch really goes through a worker thread."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import trio

from queen.auth import AccessGate, AuthFailure, build_gate
from queen.auth.keys import parse_jwks
from queen.broker import Broker
from queen.http.app import create_app
from queen.settings import Settings
from tests.conftest import Db
from tests.jwt_tools import bearer, claims, ed_key, eddsa, hs256, public_jwk, rs256, rsa_key


class JwksServer:
    """Serves ``document`` at ``url``; ``status`` != 200 answers that error; ``hang`` makes
    every request wait until ``release`` is set, then answer nothing."""

    def __init__(self) -> None:
        self.document: dict[str, Any] = {"keys": []}
        self.status = 200
        self.hang = False
        self.requests = 0
        self.received = threading.Event()
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests += 1
                owner.received.set()
                if owner.hang:
                    owner.release.wait(30)
                    return  # the client gave up long ago
                if owner.status != 200:
                    self.send_error(owner.status)
                    return
                body = json.dumps(owner.document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def keys(self, *jwks: dict[str, Any]) -> None:
        self.document = {"keys": list(jwks)}


@pytest.fixture
def jwks() -> Iterator[JwksServer]:
    server = JwksServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.server.shutdown()
        server.server.server_close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def jwks_gate(server: JwksServer, clock: FakeClock, **changes: Any) -> AccessGate:
    settings = Settings(jwt_enabled=True, jwt_algorithm="auto", jwt_jwks_url=server.url, **changes)
    return build_gate(settings, monotonic=clock)


async def verify(gate: AccessGate, token: str) -> str | None:
    assert gate.verifier is not None
    return (await gate.verifier.verify(token)).sub


def last_error(gate: AccessGate) -> str:
    assert gate.verifier is not None and gate.verifier.keys.jwks is not None
    return gate.verifier.keys.jwks.last_error or ""


async def refused(gate: AccessGate, token: str) -> AuthFailure:
    with pytest.raises(AuthFailure) as caught:
        await verify(gate, token)
    return caught.value


async def test_rs256_and_eddsa_keys_chosen_by_kid(jwks: JwksServer, clock: FakeClock) -> None:
    jwks.keys(public_jwk(rsa_key("r1"), "r1"), public_jwk(ed_key("e1"), "e1"))
    gate = jwks_gate(jwks, clock)
    assert await verify(gate, rs256(claims(sub="rsa"), key="r1", kid="r1")) == "rsa"
    assert await verify(gate, eddsa(claims(sub="ed"), key="e1", kid="e1")) == "ed"
    # A kid names one key, of one algorithm.
    wrong = await refused(gate, rs256(claims(), key="r1", kid="e1"))
    assert (wrong.status, wrong.message) == (401, "Key e1 is not an RS256 key")
    # Signed by another key under a known kid.
    forged = await refused(gate, rs256(claims(), key="intruder", kid="r1"))
    assert (forged.status, forged.message) == (401, "Invalid token signature")
    assert jwks.requests == 1  # one fetch served all of it


async def test_key_rotation_by_kid(jwks: JwksServer, clock: FakeClock) -> None:
    jwks.keys(public_jwk(rsa_key("k1"), "k1"))
    gate = jwks_gate(jwks, clock)
    assert await verify(gate, rs256(claims(sub="old"), key="k1", kid="k1")) == "old"
    assert jwks.requests == 1

    jwks.keys(public_jwk(rsa_key("k1"), "k1"), public_jwk(rsa_key("k2"), "k2"))
    new_token = rs256(claims(sub="new"), key="k2", kid="k2")
    clock.now += 1  # within the unknown-kid gap: no new fetch yet
    failure = await refused(gate, new_token)
    assert (failure.status, failure.message) == (401, "Unknown key ID: k2")
    assert jwks.requests == 1

    clock.now += 5  # the gap has passed: the unknown kid triggers a refresh
    assert await verify(gate, new_token) == "new"
    assert jwks.requests == 2
    assert await verify(gate, rs256(claims(sub="old"), key="k1", kid="k1")) == "old"
    assert jwks.requests == 2


async def test_an_unknown_kid_is_401_after_one_refresh(jwks: JwksServer, clock: FakeClock):
    jwks.keys(public_jwk(rsa_key("k1"), "k1"))
    gate = jwks_gate(jwks, clock)
    await verify(gate, rs256(claims(), key="k1", kid="k1"))
    clock.now += 10
    failure = await refused(gate, rs256(claims(), key="k1", kid="nope"))
    assert (failure.status, failure.message) == (401, "Unknown key ID: nope")
    assert jwks.requests == 2


async def test_the_set_is_fetched_again_after_the_refresh_interval(
    jwks: JwksServer, clock: FakeClock
) -> None:
    jwks.keys(public_jwk(rsa_key("k1"), "k1"))
    gate = jwks_gate(jwks, clock, jwt_jwks_refresh_interval_s=60)
    token = rs256(claims(), key="k1", kid="k1")
    await verify(gate, token)
    clock.now += 59
    await verify(gate, token)
    assert jwks.requests == 1
    clock.now += 2
    await verify(gate, token)
    assert jwks.requests == 2


async def test_a_set_that_cannot_be_fetched_is_503_until_it_can(
    jwks: JwksServer, clock: FakeClock
) -> None:
    jwks.keys(public_jwk(rsa_key("k1"), "k1"))
    jwks.status = 500
    gate = jwks_gate(jwks, clock)
    token = rs256(claims(), key="k1", kid="k1")
    failure = await refused(gate, token)
    assert failure.status == 503
    assert failure.message == "Signing keys are unavailable"
    assert failure.extra == {}  # the reason is logged, not sent
    assert "HTTP 500" in last_error(gate)
    assert (await refused(gate, token)).status == 503  # no new fetch inside the gap
    assert jwks.requests == 1
    jwks.status = 200
    clock.now += 6
    assert await verify(gate, token) == "svc-a"
    assert jwks.requests == 2


async def test_a_failed_refresh_keeps_the_cached_keys(jwks: JwksServer, clock: FakeClock):
    jwks.keys(public_jwk(rsa_key("k1"), "k1"))
    gate = jwks_gate(jwks, clock, jwt_jwks_refresh_interval_s=60)
    token = rs256(claims(), key="k1", kid="k1")
    await verify(gate, token)
    jwks.status = 404
    clock.now += 120
    assert await verify(gate, token) == "svc-a"
    assert jwks.requests == 2
    assert "HTTP 404" in last_error(gate)


async def test_the_fetch_is_bounded_and_does_not_block_the_event_loop(
    jwks: JwksServer, clock: FakeClock
) -> None:
    jwks.keys(public_jwk(rsa_key("k1"), "k1"))
    jwks.hang = True
    gate = jwks_gate(jwks, clock, jwt_jwks_timeout_ms=300)
    token = rs256(claims(), key="k1", kid="k1")
    outcome: list[AuthFailure] = []

    async def attempt() -> None:
        outcome.append(await refused(gate, token))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt)
            # While the fetch hangs, this task still runs: the loop is not blocked.
            await trio.to_thread.run_sync(jwks.received.wait)
            assert not outcome
    assert outcome[0].status == 503
    assert "no answer within 0.3 s" in last_error(gate)


async def test_concurrent_first_requests_share_one_fetch(jwks: JwksServer, clock: FakeClock):
    jwks.keys(public_jwk(rsa_key("k1"), "k1"))
    gate = jwks_gate(jwks, clock)
    token = rs256(claims(), key="k1", kid="k1")
    subs: list[str | None] = []

    async def one() -> None:
        subs.append(await verify(gate, token))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
    assert subs == ["svc-a"] * 8
    assert jwks.requests == 1


async def test_a_token_without_kid_needs_a_single_key_of_its_algorithm(
    jwks: JwksServer, clock: FakeClock
) -> None:
    jwks.keys(public_jwk(rsa_key("k1"), "k1"), public_jwk(ed_key("e1"), "e1"))
    gate = jwks_gate(jwks, clock)
    assert await verify(gate, rs256(claims(sub="one"), key="k1")) == "one"
    jwks.keys(public_jwk(rsa_key("k1"), "k1"), public_jwk(rsa_key("k2"), "k2"))
    clock.now += 4000
    failure = await refused(gate, rs256(claims(), key="k1"))
    assert failure.message == "Token has no kid and no single RS256 key matches"


async def test_hmac_and_unusable_keys_in_the_set_are_never_used(
    jwks: JwksServer, clock: FakeClock
) -> None:
    oct_key = {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTEyMzQ"}
    jwks.keys(
        oct_key,
        public_jwk(rsa_key("enc"), "enc", use="enc"),
        public_jwk(rsa_key("r512"), "r512", alg="RS512"),
        public_jwk(rsa_key("k1"), "k1"),
    )
    gate = jwks_gate(jwks, clock)
    # auto with only a JWKS: HS256 is not among the algorithms at all.
    hmac_token = hs256(claims(), secret="secret-secret-secret-secret-1234", kid="hmac")
    failure = await refused(gate, hmac_token)
    assert failure.message == "Token uses HS256, expected EdDSA or RS256"
    assert (await refused(gate, rs256(claims(), key="enc", kid="enc"))).message == (
        "Unknown key ID: enc"
    )
    assert (await refused(gate, rs256(claims(), key="r512", kid="r512"))).status == 401


def test_parse_jwks_says_why_keys_are_skipped() -> None:
    document = {
        "keys": [
            public_jwk(rsa_key("k1"), "k1"),
            public_jwk(ed_key("e1"), "e1"),
            {"kty": "oct", "kid": "h", "k": "AAAA"},
            {"kty": "EC", "kid": "ec", "crv": "P-256", "x": "x", "y": "y"},
            {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
            {"kty": "RSA", "kid": 7},
            "junk",
        ]
    }
    keys, skipped = parse_jwks(json.dumps(document).encode())
    assert [(k.kid, k.algorithm) for k in keys] == [("k1", "RS256"), ("e1", "EdDSA")]
    assert len(skipped) == 5
    assert any("'h'" in reason and "oct" in reason for reason in skipped)


async def test_push_with_a_jwks_token_stamps_its_sub(
    jwks: JwksServer, clock: FakeClock, broker: Broker, queue: str, db: Db
) -> None:
    jwks.keys(public_jwk(ed_key("e1"), "e1"))
    settings = broker.settings.with_changes(
        jwt_enabled=True, jwt_algorithm="EdDSA", jwt_jwks_url=jwks.url
    )
    client = create_app(broker, gate=build_gate(settings, monotonic=clock)).test_client()
    token = eddsa(claims(sub="svc-jwks", roles=["write"]), key="e1", kid="e1")
    body = {"items": [{"queue": queue, "partition": "p", "payload": 1}]}
    resp = await client.post("/api/v1/push", json=body, headers=bearer(token))
    assert resp.status_code == 201
    assert [f["sub"] for f in await db.frames(queue, "p")] == ["svc-jwks"]

"""Token verification and authentication settings, without HTTP: every algorithm, every way a
token is refused, and every misconfiguration that must stop the server."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from queen.auth import AccessGate, AuthConfigError, AuthFailure, Identity, Role, build_gate
from queen.settings import Settings
from tests.jwt_tools import (
    OTHER_SECRET,
    SECRET,
    claims,
    ed_key,
    eddsa,
    hs256,
    hs256_keyed_with,
    private_pem,
    public_pem,
    rs256,
    rsa_key,
    unsigned,
)

NOW = 1_700_000_000.0
R, W, A = Role.READ, Role.WRITE, Role.ADMIN


def gate(**changes: Any) -> AccessGate:
    settings = Settings(jwt_enabled=True).with_changes(**changes)
    return build_gate(settings, clock=lambda: NOW)


async def verify(g: AccessGate, token: str) -> Identity:
    assert g.verifier is not None
    return await g.verifier.verify(token)


async def refused(g: AccessGate, token: str) -> AuthFailure:
    with pytest.raises(AuthFailure) as caught:
        await verify(g, token)
    return caught.value


def at_now(**extra: Any) -> dict[str, Any]:
    return claims(now=NOW, **extra)


async def test_hs256() -> None:
    g = gate(jwt_secret=SECRET)
    identity = await verify(g, hs256(at_now(sub="svc-a", roles=["write-only"])))
    assert identity == Identity(sub="svc-a", roles=frozenset({W}))


async def test_rs256_with_a_pem_public_key() -> None:
    g = gate(jwt_algorithm="RS256", jwt_public_key=public_pem(rsa_key()))
    identity = await verify(g, rs256(at_now(sub="svc-r", role="read-write")))
    assert identity == Identity(sub="svc-r", roles=frozenset({R, W}))


async def test_eddsa_with_an_ed25519_pem_key() -> None:
    g = gate(jwt_algorithm="EdDSA", jwt_public_key=public_pem(ed_key()))
    identity = await verify(g, eddsa(at_now(sub="svc-e", role="admin")))
    assert identity == Identity(sub="svc-e", roles=frozenset({R, W, A}))


async def test_a_pem_squeezed_into_one_line_and_a_certificate_are_accepted() -> None:
    folded = public_pem(rsa_key()).strip().replace("\n", "\\n")
    g = gate(jwt_algorithm="RS256", jwt_public_key=folded)
    assert (await verify(g, rs256(at_now()))).sub == "svc-a"

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer")])
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(rsa_key().public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=36500))
        .sign(rsa_key(), hashes.SHA256())
    )
    from cryptography.hazmat.primitives.serialization import Encoding

    g = gate(jwt_algorithm="RS256", jwt_public_key=cert.public_bytes(Encoding.PEM).decode())
    assert (await verify(g, rs256(at_now()))).sub == "svc-a"


async def test_a_token_without_sub_has_no_producer_identity() -> None:
    g = gate(jwt_secret=SECRET)
    assert (await verify(g, hs256(at_now(sub=None, roles=["write"])))).sub is None


async def test_auto_takes_the_algorithm_from_the_header_among_the_configured_ones() -> None:
    g = gate(jwt_algorithm="auto", jwt_secret=SECRET, jwt_public_key=public_pem(rsa_key()))
    assert g.verifier is not None and g.verifier.algorithms == {"HS256", "RS256"}
    assert (await verify(g, hs256(at_now(sub="h")))).sub == "h"
    assert (await verify(g, rs256(at_now(sub="r")))).sub == "r"
    failure = await refused(g, eddsa(at_now()))
    assert (failure.status, failure.message) == (401, "Token uses EdDSA, expected HS256 or RS256")
    # HS256 is only ever checked with JWT_SECRET, never with the public key.
    forged = hs256_keyed_with(at_now(role="admin"), public_pem(rsa_key()).encode())
    assert (await refused(g, forged)).message == "Invalid token signature"


async def test_hs256_signed_with_the_rs256_public_key_is_refused() -> None:
    g = gate(jwt_algorithm="RS256", jwt_public_key=public_pem(rsa_key()))
    forged = hs256_keyed_with(at_now(role="admin"), public_pem(rsa_key()).encode())
    failure = await refused(g, forged)
    assert (failure.status, failure.message) == (401, "Token uses HS256, expected RS256")


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
async def test_alg_none_is_refused(alg: str) -> None:
    for g in (
        gate(jwt_secret=SECRET),
        gate(jwt_algorithm="auto", jwt_secret=SECRET, jwt_public_key=public_pem(ed_key())),
    ):
        failure = await refused(g, unsigned(at_now(role="admin"), alg=alg))
        assert (failure.status, failure.message) == (401, f"Unsupported algorithm: {alg}")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (hs256(claims(now=NOW - 7200, ttl_s=3600)), "Token has expired"),
        (hs256(at_now(nbf=int(NOW) + 120)), "Token is not yet valid"),
        (hs256(at_now(), secret=OTHER_SECRET), "Invalid token signature"),
        ("garbage", "Malformed token"),
        ("a.b", "Malformed token"),
        ("eyJhbGciOiJIUzI1NiJ9.%%%.xyz", "Malformed token"),
        (hs256(at_now(sub=42)), "Invalid token subject"),
        (hs256(at_now()) + "x", "Invalid token signature"),
    ],
)
async def test_hs256_refusals(token: str, message: str) -> None:
    failure = await refused(gate(jwt_secret=SECRET), token)
    assert (failure.status, failure.message) == (401, message)


async def test_bad_signature_for_public_key_algorithms() -> None:
    rs = gate(jwt_algorithm="RS256", jwt_public_key=public_pem(rsa_key()))
    assert (await refused(rs, rs256(at_now(), key="b"))).message == "Invalid token signature"
    ed = gate(jwt_algorithm="EdDSA", jwt_public_key=public_pem(ed_key()))
    assert (await refused(ed, eddsa(at_now(), key="b"))).message == "Invalid token signature"


async def test_issuer_and_audience_are_checked_when_configured() -> None:
    g = gate(jwt_secret=SECRET, jwt_issuer="https://idp", jwt_audience="queen")
    ok = at_now(iss="https://idp", aud=["other", "queen"])
    assert (await verify(g, hs256(ok))).sub == "svc-a"
    for token, message in [
        (hs256(at_now(iss="https://evil", aud="queen")), "Invalid token issuer"),
        (hs256(at_now(aud="queen")), "Invalid token issuer"),
        (hs256(at_now(iss="https://idp", aud="other")), "Invalid token audience"),
        (hs256(at_now(iss="https://idp")), "Invalid token audience"),
    ]:
        failure = await refused(g, token)
        assert (failure.status, failure.message) == (401, message)
    # Unconfigured, neither claim is looked at.
    plain = gate(jwt_secret=SECRET)
    assert (await verify(plain, hs256(at_now(iss="anyone", aud="anything")))).sub == "svc-a"


async def test_clock_skew_is_the_configured_leeway() -> None:
    token = hs256(claims(now=NOW - 3620, ttl_s=3600))  # expired 20 s ago
    assert (await verify(gate(jwt_secret=SECRET), token)).sub == "svc-a"
    strict = gate(jwt_secret=SECRET, jwt_clock_skew_s=0)
    assert (await refused(strict, token)).message == "Token has expired"


async def test_an_ec_key_configuration_is_not_a_supported_algorithm() -> None:
    ec_pem = public_pem(ec.generate_private_key(ec.SECP256R1()))  # type: ignore[arg-type]
    with pytest.raises(AuthConfigError, match="JWT_PUBLIC_KEY"):
        gate(jwt_algorithm="auto", jwt_public_key=ec_pem)


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        ({}, "JWT_SECRET"),
        ({"jwt_algorithm": "RS256"}, "JWT_PUBLIC_KEY"),
        ({"jwt_algorithm": "EdDSA"}, "JWT_JWKS_URL"),
        ({"jwt_algorithm": "auto"}, "JWT_SECRET"),
        ({"jwt_algorithm": "HS512", "jwt_secret": SECRET}, "JWT_ALGORITHM"),
        ({"jwt_algorithm": "none", "jwt_secret": SECRET}, "JWT_ALGORITHM"),
        ({"jwt_algorithm": "RS256", "jwt_public_key": "not a pem"}, "JWT_PUBLIC_KEY"),
        ({"jwt_algorithm": "RS256", "jwt_public_key": private_pem(rsa_key())}, "JWT_PUBLIC_KEY"),
        ({"jwt_algorithm": "EdDSA", "jwt_public_key": public_pem(rsa_key())}, "JWT_PUBLIC_KEY"),
        ({"jwt_algorithm": "RS256", "jwt_jwks_url": "file:///etc/keys"}, "JWT_JWKS_URL"),
        (
            {"jwt_algorithm": "RS256", "jwt_jwks_url": "http://idp/jwks", "jwt_jwks_timeout_ms": 0},
            "JWT_JWKS_TIMEOUT_MS",
        ),
        (
            {
                "jwt_algorithm": "RS256",
                "jwt_jwks_url": "http://idp/jwks",
                "jwt_jwks_refresh_interval_s": 0,
            },
            "JWT_JWKS_REFRESH_INTERVAL",
        ),
    ],
)
def test_misconfiguration_names_the_variable(changes: dict[str, Any], variable: str) -> None:
    with pytest.raises(AuthConfigError, match=variable):
        gate(**changes)


def test_algorithm_names_are_case_insensitive_and_disabled_means_no_checks() -> None:
    g = gate(jwt_algorithm="eddsa", jwt_public_key=public_pem(ed_key()))
    assert g.verifier is not None and g.verifier.algorithms == {"EdDSA"}
    off = build_gate(Settings(jwt_enabled=False, jwt_algorithm="bogus"))
    assert not off.enabled and off.describe() == "off"

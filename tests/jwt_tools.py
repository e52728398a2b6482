"""Keys and tokens for the authentication tests: real keys, real signatures, and the hostile
tokens pyjwt refuses to make (``alg: none``, HS256 keyed with a public key)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from functools import cache
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from jwt.algorithms import OKPAlgorithm, RSAAlgorithm

SECRET = "s3cret-for-tests-0123456789abcdef-0123"  # 38 bytes: above the HS256 minimum
OTHER_SECRET = "another-secret-for-tests-0123456789abcdef"


def rsa_key(name: str = "a") -> rsa.RSAPrivateKey:
    """The RSA key called ``name`` (made once per test session)."""
    return _rsa_key(name)


def ed_key(name: str = "a") -> ed25519.Ed25519PrivateKey:
    """The Ed25519 key called ``name`` (made once per test session)."""
    return _ed_key(name)


@cache
def _rsa_key(name: str) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@cache
def _ed_key(name: str) -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def public_pem(private: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> str:
    return (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def private_pem(private: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> str:
    return private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def public_jwk(
    private: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey, kid: str, **extra: Any
) -> dict[str, Any]:
    if isinstance(private, rsa.RSAPrivateKey):
        jwk = RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
    else:
        jwk = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
    return {**jwk, "kid": kid, **extra}


def claims(
    sub: str | None = "svc-a",
    roles: Any = None,
    *,
    now: float | None = None,
    ttl_s: float = 3600,
    **extra: Any,
) -> dict[str, Any]:
    """Claims valid for an hour from ``now`` (real time by default)."""
    now = time.time() if now is None else now
    out: dict[str, Any] = {"iat": int(now) - 10, "exp": int(now + ttl_s)}
    if sub is not None:
        out["sub"] = sub
    if roles is not None:
        out["roles"] = roles
    out.update(extra)
    return {k: v for k, v in out.items() if v is not None}


def hs256(payload: dict[str, Any], secret: str = SECRET, **headers: Any) -> str:
    return jwt.encode(payload, secret, algorithm="HS256", headers=headers or None)


def rs256(payload: dict[str, Any], key: str = "a", **headers: Any) -> str:
    return jwt.encode(payload, rsa_key(key), algorithm="RS256", headers=headers or None)


def eddsa(payload: dict[str, Any], key: str = "a", **headers: Any) -> str:
    return jwt.encode(payload, ed_key(key), algorithm="EdDSA", headers=headers or None)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _segments(header: dict[str, Any], payload: dict[str, Any]) -> str:
    return _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(payload).encode())


def unsigned(payload: dict[str, Any], alg: str = "none") -> str:
    """An ``alg: none`` token: header and payload, empty signature."""
    return _segments({"alg": alg, "typ": "JWT"}, payload) + "."


def hs256_keyed_with(payload: dict[str, Any], key: bytes, **headers: Any) -> str:
    """An HS256 token whose HMAC key is ``key`` (for example an RSA public key's PEM): the
    algorithm-confusion forgery."""
    signing_input = _segments({"alg": "HS256", "typ": "JWT", **headers}, payload)
    mac = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + _b64(mac)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}

"""From :class:`~queen.settings.Settings` to an :class:`~queen.auth.gate.AccessGate`.

Every setting that cannot work raises :class:`~queen.auth.errors.AuthConfigError` naming the
variable, so ``queen serve`` stops at start-up instead of answering 500 to every request.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable

from queen.auth.errors import AuthConfigError
from queen.auth.gate import AccessGate, parse_skip_paths
from queen.auth.keys import (
    ALGORITHMS,
    EDDSA,
    HS256,
    MIN_HMAC_SECRET_BYTES,
    MIN_RSA_BITS,
    PUBLIC_KEY_ALGORITHMS,
    RS256,
    JwksKeys,
    KeyRing,
    load_pem_key,
    secret_key,
)
from queen.auth.tokens import TokenVerifier
from queen.settings import Settings

log = logging.getLogger("queen.auth")

AUTO = "auto"
_BY_LOWER = {name.lower(): name for name in (*ALGORITHMS, AUTO)}


def build_gate(
    settings: Settings,
    *,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> AccessGate:
    """The gate ``settings`` describe. Raises :class:`AuthConfigError`."""
    if not settings.jwt_enabled:
        stray = [
            env
            for env, value in (
                ("JWT_SECRET", settings.jwt_secret),
                ("JWT_PUBLIC_KEY", settings.jwt_public_key),
                ("JWT_JWKS_URL", settings.jwt_jwks_url),
            )
            if value
        ]
        if stray:
            log.warning("%s set but JWT_ENABLED is not true: authentication is off", stray)
        return AccessGate.disabled()

    algorithm = _BY_LOWER.get(settings.jwt_algorithm.strip().lower())
    if algorithm is None:
        choices = ", ".join((*ALGORITHMS, AUTO))
        raise AuthConfigError(
            f"JWT_ALGORITHM={settings.jwt_algorithm!r} is not supported; use one of {choices}"
        )
    if settings.jwt_jwks_timeout_ms <= 0:
        raise AuthConfigError("JWT_JWKS_TIMEOUT_MS must be > 0")
    if settings.jwt_jwks_refresh_interval_s <= 0:
        raise AuthConfigError("JWT_JWKS_REFRESH_INTERVAL must be > 0")

    secret = secret_key(settings.jwt_secret) if settings.jwt_secret else None
    pem = load_pem_key(settings.jwt_public_key) if settings.jwt_public_key else None
    jwks = None
    if settings.jwt_jwks_url:
        url = settings.jwt_jwks_url.strip()
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise AuthConfigError(f"JWT_JWKS_URL={url!r} is not an http(s) URL")
        jwks = JwksKeys(
            url,
            refresh_interval_s=settings.jwt_jwks_refresh_interval_s,
            timeout_s=settings.jwt_jwks_timeout_ms / 1000,
            clock=monotonic,
        )

    if algorithm == HS256:
        if secret is None:
            raise AuthConfigError("JWT_ENABLED=true with JWT_ALGORITHM=HS256 needs JWT_SECRET")
        allowed = {HS256}
    elif algorithm in PUBLIC_KEY_ALGORITHMS:
        if pem is None and jwks is None:
            raise AuthConfigError(
                f"JWT_ENABLED=true with JWT_ALGORITHM={algorithm} needs JWT_PUBLIC_KEY "
                "or JWT_JWKS_URL"
            )
        if pem is not None and pem.algorithm != algorithm:
            raise AuthConfigError(
                f"JWT_PUBLIC_KEY is a key for {pem.algorithm}, not JWT_ALGORITHM={algorithm}"
            )
        allowed = {algorithm}
    else:
        allowed = set()
        if secret is not None:
            allowed.add(HS256)
        if pem is not None:
            allowed.add(pem.algorithm)
        if jwks is not None:
            allowed |= {RS256, EDDSA}
        if not allowed:
            raise AuthConfigError(
                "JWT_ENABLED=true with JWT_ALGORITHM=auto needs JWT_SECRET, JWT_PUBLIC_KEY "
                "or JWT_JWKS_URL"
            )

    if secret is not None and HS256 in allowed and secret.weak:
        log.warning(
            "JWT_SECRET is shorter than %d bytes; HS256 secrets that short are weak",
            MIN_HMAC_SECRET_BYTES,
        )
    if pem is not None and pem.weak:
        log.warning("JWT_PUBLIC_KEY is an RSA key below %d bits", MIN_RSA_BITS)

    keys = KeyRing(
        secret=secret if HS256 in allowed else None,
        pem=pem if pem is not None and pem.algorithm in allowed else None,
        jwks=jwks,
    )
    verifier = TokenVerifier(
        keys,
        allowed,
        issuer=settings.jwt_issuer or None,
        audience=settings.jwt_audience or None,
        clock_skew_s=settings.jwt_clock_skew_s,
        clock=clock,
    )
    return AccessGate(verifier, skip_paths=parse_skip_paths(settings.jwt_skip_paths))

"""Token verification: from an ``Authorization`` header to a caller :class:`Identity`.

The algorithm is never the token's choice alone: it must be one of the configured algorithms,
and the key comes from the :class:`~queen.auth.keys.KeyRing`, which binds every key to one
algorithm. ``exp``, ``nbf`` and ``iat`` are checked here (when present) against an injectable
clock with the configured skew; ``iss`` and ``aud`` are checked by pyjwt when configured.
Every failure is an :class:`~queen.auth.errors.AuthFailure` with a short reason.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

import jwt
from jwt.exceptions import InvalidSubjectError

from queen.auth.errors import AuthFailure, clip, unauthorized
from queen.auth.keys import ALGORITHMS, KeyRing, VerificationKey
from queen.auth.roles import NO_ROLES, RoleSet, roles_from_claims

AUTHENTICATION_REQUIRED: Final = "Authentication required"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: the token's ``sub`` (the stamped producerSub) and its roles."""

    sub: str | None
    roles: RoleSet


#: The caller when authentication is off, or on a public path.
ANONYMOUS: Final = Identity(sub=None, roles=NO_ROLES)


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme in any case).

    No header, an empty one, or ``Bearer`` with nothing after it → 401 "Authentication
    required"; another scheme → 401 naming the expected form.
    """
    if header is None or not header.strip():
        raise unauthorized(AUTHENTICATION_REQUIRED)
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise unauthorized("Authorization header must be 'Bearer <token>'")
    token = token.strip()
    if not token:
        raise unauthorized(AUTHENTICATION_REQUIRED)
    return token


def _numeric_date(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise unauthorized(f"Invalid token: {name} is not a number")
    return float(value)


def check_times(claims: Mapping[str, Any], now: float, skew_s: float) -> None:
    """Check ``exp``, ``nbf`` and ``iat`` (each only when present) at ``now`` (Unix seconds),
    allowing ``skew_s`` either way. A token is expired once ``now >= exp + skew``; it is not
    yet valid while ``now < nbf - skew`` or ``now < iat - skew``."""
    expires = _numeric_date(claims, "exp")
    not_before = _numeric_date(claims, "nbf")
    issued = _numeric_date(claims, "iat")
    if expires is not None and now >= expires + skew_s:
        raise unauthorized("Token has expired")
    if not_before is not None and now < not_before - skew_s:
        raise unauthorized("Token is not yet valid")
    if issued is not None and now < issued - skew_s:
        raise unauthorized("Token is not yet valid (issued in the future)")


def refuse_algorithm(alg: object, configured: Collection[str]) -> AuthFailure:
    expected = " or ".join(sorted(configured))
    if isinstance(alg, str) and alg in ALGORITHMS:
        return unauthorized(f"Token uses {alg}, expected {expected}")
    if not isinstance(alg, str) or not alg:
        return unauthorized("Token header has no algorithm")
    return unauthorized(f"Unsupported algorithm: {clip(alg, 32)}")


class TokenVerifier:
    """Verifies tokens against ``keys`` for the ``algorithms`` allowed.

    ``clock`` gives the current Unix time for ``exp``/``nbf``/``iat`` (tests pass a fake).
    Verifying is CPU work of tens of microseconds and runs on the caller's task; only a key
    set fetch (see :class:`~queen.auth.keys.JwksKeys`) waits on I/O.
    """

    def __init__(
        self,
        keys: KeyRing,
        algorithms: Collection[str],
        *,
        issuer: str | None = None,
        audience: str | None = None,
        clock_skew_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        unknown = set(algorithms) - set(ALGORITHMS)
        if unknown or not algorithms:
            raise ValueError(f"unsupported algorithms: {sorted(unknown) or 'none given'}")
        self.keys = keys
        self.algorithms = frozenset(algorithms)
        self.issuer = issuer
        self.audience = audience
        self.clock_skew_s = clock_skew_s
        self._clock = clock
        self._jwt = jwt.PyJWT(
            {
                "verify_signature": True,
                "verify_exp": False,  # checked by check_times, on our clock
                "verify_nbf": False,
                "verify_iat": False,
                "verify_iss": issuer is not None,
                "verify_aud": audience is not None,
                "verify_sub": True,
                "verify_jti": True,
                "require": [],
            }
        )

    async def verify(self, token: str) -> Identity:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise unauthorized("Malformed token") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise refuse_algorithm(alg, self.algorithms)
        kid = header.get("kid")  # pyjwt has checked it is a string when present
        key = await self.keys.key_for(alg, kid)
        claims = self._decode(token, key)
        check_times(claims, self._clock(), self.clock_skew_s)
        sub = claims.get("sub")  # pyjwt has checked it is a string when present
        return Identity(sub=sub, roles=roles_from_claims(claims))

    def _decode(self, token: str, key: VerificationKey) -> dict[str, Any]:
        try:
            if key.weak:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", jwt.InsecureKeyLengthWarning)
                    return self._decode_with(token, key)
            return self._decode_with(token, key)
        except jwt.InvalidSignatureError:
            raise unauthorized("Invalid token signature") from None
        except jwt.InvalidIssuerError:
            raise unauthorized("Invalid token issuer") from None
        except jwt.InvalidAudienceError:
            raise unauthorized("Invalid token audience") from None
        except jwt.MissingRequiredClaimError as exc:
            if exc.claim == "iss":
                raise unauthorized("Invalid token issuer") from None
            if exc.claim == "aud":
                raise unauthorized("Invalid token audience") from None
            raise unauthorized(f"Token lacks the {clip(exc.claim, 32)} claim") from None
        except InvalidSubjectError:
            raise unauthorized("Invalid token subject") from None
        except jwt.DecodeError:
            raise unauthorized("Malformed token") from None
        except jwt.PyJWTError:
            raise unauthorized("Invalid token") from None

    def _decode_with(self, token: str, key: VerificationKey) -> dict[str, Any]:
        return self._jwt.decode(
            token,
            key.key,
            algorithms=[key.algorithm],
            issuer=self.issuer,
            audience=self.audience,
        )

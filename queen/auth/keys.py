"""Verification keys: the HS256 secret, a PEM public key, and a JWKS fetched over HTTP.

A :class:`VerificationKey` is bound to exactly one algorithm. The HS256 secret is the only key
an HS256 token is ever checked with, and public keys only ever verify RS256 or EdDSA, so a
token cannot choose how its key is interpreted (no algorithm confusion).

:class:`JwksKeys` owns a cached key set. It fetches the set on first use, again once it is
older than the refresh interval, and again when a token names a ``kid`` it does not hold (at
most once per ``unknown_kid_gap_s``, so tokens with made-up kids cannot hammer the identity
provider; a failed fetch is not retried sooner either). Fetches run in a worker thread
(``urllib`` is blocking) under a Trio deadline, one at a time; requests that need a refresh
while one is running wait for it instead of starting their own. A failed refresh keeps the
previous set.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from http.client import HTTPException
from typing import Any, Final

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed448, ed25519, rsa
from jwt import PyJWK, PyJWTError

from queen.auth.errors import AuthConfigError, AuthFailure, clip, unauthorized
from queen.errors import QueenError

log = logging.getLogger("queen.auth")

HS256: Final = "HS256"
RS256: Final = "RS256"
EDDSA: Final = "EdDSA"
#: Every algorithm the broker can verify. ``none`` and the other HMAC/RSA variants are not here.
ALGORITHMS: Final = (HS256, RS256, EDDSA)
PUBLIC_KEY_ALGORITHMS: Final = frozenset({RS256, EDDSA})

MIN_HMAC_SECRET_BYTES: Final = 32  # RFC 7518 §3.2: at least the hash size
MIN_RSA_BITS: Final = 2048
MAX_JWKS_BYTES: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class VerificationKey:
    """One key, usable for ``algorithm`` only. ``weak`` keys (short HMAC secrets, small RSA
    keys) still verify; they were warned about once when loaded."""

    algorithm: str
    key: Any  # bytes for HS256, a cryptography public key otherwise
    kid: str | None = None
    weak: bool = False


class KeysUnavailable(QueenError):
    """The key set could not be fetched or held no usable key."""


def secret_key(secret: str) -> VerificationKey:
    raw = secret.encode("utf-8")
    return VerificationKey(HS256, raw, weak=len(raw) < MIN_HMAC_SECRET_BYTES)


def algorithm_for(public_key: object) -> str | None:
    """The one algorithm a public key may verify, or None for key types we do not take."""
    if isinstance(public_key, rsa.RSAPublicKey):
        return RS256
    if isinstance(public_key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return EDDSA
    return None


def _is_weak(public_key: object) -> bool:
    return isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size < MIN_RSA_BITS


def load_pem_key(text: str, variable: str = "JWT_PUBLIC_KEY") -> VerificationKey:
    """Parse a PEM public key (or a certificate carrying one). Raises :class:`AuthConfigError`
    naming ``variable`` when it is not one. A value with literal ``\\n`` sequences and no line
    breaks (a PEM squeezed into one environment line) is unfolded first."""
    pem = text.strip()
    if "\n" not in pem and "\\n" in pem:
        pem = pem.replace("\\n", "\n")
    data = pem.encode("utf-8")
    if b"PRIVATE KEY" in data:
        raise AuthConfigError(f"{variable} holds a private key; give the public key")
    try:
        if b"BEGIN CERTIFICATE" in data:
            public_key: object = x509.load_pem_x509_certificate(data).public_key()
        else:
            public_key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise AuthConfigError(f"{variable} is not a PEM public key: {exc}") from None
    algorithm = algorithm_for(public_key)
    if algorithm is None:
        kind = type(public_key).__name__
        raise AuthConfigError(f"{variable} holds a {kind}; RSA or Ed25519/Ed448 is needed")
    return VerificationKey(algorithm, public_key, weak=_is_weak(public_key))


def parse_jwks(document: bytes) -> tuple[list[VerificationKey], list[str]]:
    """The usable keys of a JWKS document and, for the others, why each was skipped.

    A usable key is an RSA key (RS256) or an OKP Ed25519/Ed448 key (EdDSA) whose ``use`` (if
    any) is ``sig`` and whose ``alg`` (if any) is that algorithm. ``oct`` keys are never taken:
    HS256 tokens are checked only with ``JWT_SECRET``.
    """
    try:
        body = json.loads(document)
    except (ValueError, RecursionError) as exc:
        raise KeysUnavailable(f"the key set is not JSON: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("keys"), list):
        raise KeysUnavailable('the key set has no "keys" array')
    keys: list[VerificationKey] = []
    skipped: list[str] = []
    for position, jwk in enumerate(body["keys"]):
        name = f"key {position}"
        if not isinstance(jwk, dict):
            skipped.append(f"{name}: not an object")
            continue
        kid = jwk.get("kid")
        if kid is not None:
            if not isinstance(kid, str):
                skipped.append(f"{name}: kid is not a string")
                continue
            name = f"key {kid!r}"
        if jwk.get("use", "sig") != "sig":
            skipped.append(f"{name}: use is not sig")
            continue
        if jwk.get("kty") not in ("RSA", "OKP"):
            skipped.append(f"{name}: key type {clip(jwk.get('kty'))} is not used")
            continue
        try:
            parsed = PyJWK(jwk)
        except (PyJWTError, ValueError, TypeError, KeyError) as exc:
            skipped.append(f"{name}: {clip(exc, 120)}")
            continue
        public_key: object = parsed.key
        if isinstance(
            public_key, rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey
        ):
            public_key = public_key.public_key()
        algorithm = algorithm_for(public_key)
        if algorithm is None or parsed.algorithm_name != algorithm:
            skipped.append(f"{name}: algorithm {clip(parsed.algorithm_name)} is not used")
            continue
        keys.append(VerificationKey(algorithm, public_key, kid, weak=_is_weak(public_key)))
    return keys, skipped


def fetch_document(url: str, timeout_s: float) -> bytes:
    """GET ``url`` (blocking: call it from a worker thread). Raises :class:`KeysUnavailable`."""
    request = urllib.request.Request(
        url, headers={"Accept": "application/json", "User-Agent": "queen-trio"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body: bytes = response.read(MAX_JWKS_BYTES + 1)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the connection
        raise KeysUnavailable(f"HTTP {exc.code} from the key set URL") from None
    except (OSError, ValueError, HTTPException) as exc:
        raise KeysUnavailable(f"cannot fetch the key set: {exc}") from None
    if len(body) > MAX_JWKS_BYTES:
        raise KeysUnavailable(f"the key set is larger than {MAX_JWKS_BYTES} bytes")
    return body


Fetcher = Callable[[str, float], bytes]


class JwksKeys:
    """A cached JWKS; see the module docstring for when it is fetched.

    ``clock`` (monotonic seconds) decides staleness and the unknown-kid gap; tests pass a fake.
    """

    def __init__(
        self,
        url: str,
        *,
        refresh_interval_s: float = 3600.0,
        timeout_s: float = 5.0,
        unknown_kid_gap_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        fetcher: Fetcher = fetch_document,
    ) -> None:
        self.url = url
        self.refresh_interval_s = refresh_interval_s
        self.timeout_s = timeout_s
        self.unknown_kid_gap_s = unknown_kid_gap_s
        self._clock = clock
        self._fetcher = fetcher
        self._by_kid: dict[str, VerificationKey] = {}
        self._keys: list[VerificationKey] = []
        self._loaded_at: float | None = None
        self._attempted_at: float | None = None
        self._attempts = 0
        self._lock = trio.Lock()
        self.last_error: str | None = None

    @property
    def keys(self) -> Sequence[VerificationKey]:
        return tuple(self._keys)

    async def key_for(self, algorithm: str, kid: str | None) -> VerificationKey:
        """The key for a token signed with ``algorithm`` naming ``kid``. Raises
        :class:`AuthFailure`: 401 for a kid the set does not hold (after one refresh), or a key
        of another algorithm; 503 when no key set could ever be fetched."""
        if self._stale() and self._may_attempt(self.unknown_kid_gap_s):
            await self.refresh()
        if self._loaded_at is None:
            # The reason (the URL, a network error) is logged, not told to the client.
            raise AuthFailure(503, "Signing keys are unavailable")
        found = self._find(algorithm, kid)
        if found is None and self._may_attempt(self.unknown_kid_gap_s):
            await self.refresh()
            found = self._find(algorithm, kid)
        if found is None:
            if kid is None:
                raise unauthorized(f"Token has no kid and no single {algorithm} key matches")
            raise unauthorized(f"Unknown key ID: {clip(kid)}")
        return found

    def _stale(self) -> bool:
        return self._loaded_at is None or self._clock() - self._loaded_at >= self.refresh_interval_s

    def _may_attempt(self, gap_s: float) -> bool:
        return self._attempted_at is None or self._clock() - self._attempted_at >= gap_s

    def _find(self, algorithm: str, kid: str | None) -> VerificationKey | None:
        if kid is not None:
            key = self._by_kid.get(kid)
            if key is not None and key.algorithm != algorithm:
                raise unauthorized(f"Key {clip(kid)} is not an {algorithm} key")
            return key
        matching = [k for k in self._keys if k.algorithm == algorithm]
        return matching[0] if len(matching) == 1 else None

    async def refresh(self) -> bool:
        """Fetch the set now, unless another task finished a fetch while this one waited for
        its turn. True when the set in hand is fresh from this call or that one."""
        attempts_seen = self._attempts
        async with self._lock:
            if self._attempts != attempts_seen:
                return self.last_error is None
            try:
                keys = await self._fetch()
            except KeysUnavailable as exc:
                self.last_error = str(exc)
                log.warning("JWKS %s: %s; keeping %d cached keys", self.url, exc, len(self._keys))
                return False
            finally:
                self._attempted_at = self._clock()
                self._attempts += 1
            self._install(keys)
            return True

    async def _fetch(self) -> list[VerificationKey]:
        fetch = partial(self._fetcher, self.url, self.timeout_s)
        with trio.move_on_after(self.timeout_s) as deadline:
            document = await trio.to_thread.run_sync(fetch, abandon_on_cancel=True)
        if deadline.cancelled_caught:
            raise KeysUnavailable(f"no answer within {self.timeout_s:g} s")
        keys, skipped = parse_jwks(document)
        for reason in skipped:
            log.info("JWKS %s: skipped %s", self.url, reason)
        if not keys:
            raise KeysUnavailable("the key set holds no usable RS256 or EdDSA key")
        return keys

    def _install(self, keys: list[VerificationKey]) -> None:
        by_kid: dict[str, VerificationKey] = {}
        for key in keys:
            if key.kid is not None:
                by_kid.setdefault(key.kid, key)
            if key.weak:
                log.warning("JWKS %s: key %r is below %d bits", self.url, key.kid, MIN_RSA_BITS)
        self._keys = keys
        self._by_kid = by_kid
        self._loaded_at = self._clock()
        self.last_error = None


class KeyRing:
    """Every key the broker holds, and the rule that picks one for a token.

    HS256 → the secret, always. RS256/EdDSA → a token with a ``kid`` is looked up in the JWKS
    (when one is configured); otherwise the PEM key, when it is of that algorithm; otherwise
    the JWKS's single key of that algorithm.
    """

    def __init__(
        self,
        *,
        secret: VerificationKey | None = None,
        pem: VerificationKey | None = None,
        jwks: JwksKeys | None = None,
    ) -> None:
        self.secret = secret
        self.pem = pem
        self.jwks = jwks

    async def key_for(self, algorithm: str, kid: str | None) -> VerificationKey:
        if algorithm == HS256:
            if self.secret is None:
                raise unauthorized("Token uses HS256, which is not configured")
            return self.secret
        if self.jwks is not None and (kid is not None or not self._pem_fits(algorithm)):
            return await self.jwks.key_for(algorithm, kid)
        if self.pem is not None and self.pem.algorithm == algorithm:
            return self.pem
        raise unauthorized(f"No {algorithm} key is configured")

    def _pem_fits(self, algorithm: str) -> bool:
        return self.pem is not None and self.pem.algorithm == algorithm

    def sources(self) -> Mapping[str, str]:
        """What is configured, for the start-up log line."""
        out: dict[str, str] = {}
        if self.secret is not None:
            out["HS256"] = "JWT_SECRET"
        if self.pem is not None:
            out[self.pem.algorithm] = "JWT_PUBLIC_KEY"
        if self.jwks is not None:
            out["JWKS"] = self.jwks.url
        return out

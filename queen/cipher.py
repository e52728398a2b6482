"""Payload encryption at rest: AES-256-GCM, and the envelope an encrypted payload is stored in.

Pure: no I/O, no Trio. :class:`PayloadCipher` seals one payload (its compact JSON text) into an
**envelope** and opens it again; :func:`open_payload` is the one function every read path
(pop, dead letter queue, message browsing) calls on a stored payload.

The envelope is itself a JSON text, so it is valid wherever a stored payload is read as JSON:
a JSON string ``"\\/qenc1:<key id>:<base64 of nonce, ciphertext and tag>"``. It starts with the
escape ``\\/``, which the broker's JSON encoder never writes, so a stored plaintext payload can
never be taken for an envelope: a reader decides by looking at the text alone, and a queue's
history may mix both (encryption switched on or off while it had messages).

- The key id is the first 8 hex digits of SHA-256 over the key: it tells a wrong key apart
  from damaged data in the error, and says nothing useful about the key.
- The message id (16 bytes) is the associated data: an envelope copied onto another message
  does not open.
- Nonces are 96 bits: a random start per cipher, then a counter, so one process never repeats
  one, and two processes collide only if their random ranges overlap.
"""

from __future__ import annotations

import binascii
import hashlib
import os
import threading

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from queen.errors import QueenError

KEY_HEX_CHARS = 64
PREFIX = '"\\/qenc1:'
_PREFIX_BYTES = PREFIX.encode()
_NONCE_BYTES = 12
_NONCE_SPACE = 1 << (8 * _NONCE_BYTES)


class PayloadUnreadable(QueenError):
    """A stored payload is encrypted and cannot be decrypted here (no key, another key, or
    damaged). The text says which, in words an operator can act on."""


def parse_key(text: str) -> bytes:
    """The 32-byte key of ``QUEEN_ENCRYPTION_KEY`` (64 hex digits); ValueError naming the
    variable otherwise. The key itself never appears in the message."""
    value = text.strip()
    if len(value) != KEY_HEX_CHARS:
        raise ValueError(
            f"QUEEN_ENCRYPTION_KEY must be 32 bytes written as {KEY_HEX_CHARS} hex "
            f"characters, got {len(value)} characters"
        )
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ValueError(
            "QUEEN_ENCRYPTION_KEY must be 32 bytes written as 64 hex characters "
            "(0-9, a-f): it holds another character"
        ) from None


def key_id(key: bytes) -> str:
    """A short public name of ``key``: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(key).hexdigest()[:8]


def is_sealed(stored: str) -> bool:
    """Whether a stored payload text is an envelope."""
    return stored.startswith(PREFIX)


def _associated(message_id: str) -> bytes:
    return bytes.fromhex(message_id.replace("-", ""))


class PayloadCipher:
    """Seals and opens payloads with one AES-256-GCM key. Safe to share between tasks and
    threads (the nonce counter is taken under a lock)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("an AES-256 key is 32 bytes")
        self._aead = AESGCM(key)
        self.key_id = key_id(key)
        self._head = _PREFIX_BYTES + self.key_id.encode() + b":"
        self._nonce = int.from_bytes(os.urandom(_NONCE_BYTES), "big")
        self._lock = threading.Lock()

    def seal_many(self, payloads: list[bytes], message_ids: list[str]) -> list[bytes]:
        """The envelopes of ``payloads`` (JSON texts), each bound to its message id."""
        count = len(payloads)
        with self._lock:
            first = self._nonce
            self._nonce = (first + count) % _NONCE_SPACE
        encrypt = self._aead.encrypt
        head = self._head
        out: list[bytes] = []
        for i, (payload, message_id) in enumerate(zip(payloads, message_ids, strict=True)):
            nonce = ((first + i) % _NONCE_SPACE).to_bytes(_NONCE_BYTES, "big")
            sealed = encrypt(nonce, payload, _associated(message_id))
            out.append(head + binascii.b2a_base64(nonce + sealed, newline=False) + b'"')
        return out

    def seal(self, payload: bytes, message_id: str) -> bytes:
        return self.seal_many([payload], [message_id])[0]

    def seal_bound(self, payload: bytes, associated: bytes) -> bytes:
        """The envelope of ``payload`` bound to ``associated`` (not a message id: a trace)."""
        with self._lock:
            counter = self._nonce
            self._nonce = (counter + 1) % _NONCE_SPACE
        nonce = counter.to_bytes(_NONCE_BYTES, "big")
        sealed = self._aead.encrypt(nonce, payload, associated)
        return self._head + binascii.b2a_base64(nonce + sealed, newline=False) + b'"'

    def open(self, stored: str, message_id: str) -> str:
        """The JSON text inside the envelope ``stored``; :class:`PayloadUnreadable` if this key
        cannot open it."""
        return self.open_bound(stored, _associated(message_id), f"message {message_id}")

    def open_bound(self, stored: str, associated: bytes, what: str) -> str:
        """:meth:`open` for an envelope bound to ``associated``; ``what`` names its owner in
        errors ("message ...", "a trace of ...")."""
        body = stored[len(PREFIX) : -1]
        stored_id, sep, data = body.partition(":")
        if not sep or not stored.endswith('"'):
            raise PayloadUnreadable(f"the encrypted payload of {what} is damaged")
        if stored_id != self.key_id:
            raise PayloadUnreadable(
                f"{what} was encrypted with key {stored_id}, and "
                f"QUEEN_ENCRYPTION_KEY is key {self.key_id}"
            )
        try:
            raw = binascii.a2b_base64(data, strict_mode=True)
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], associated)
        except (binascii.Error, ValueError, InvalidTag):
            raise PayloadUnreadable(
                f"the encrypted payload of {what} does not authenticate with "
                f"key {self.key_id}: it is damaged or was not sealed for {what}"
            ) from None
        return plain.decode("utf-8")


def trace_associated(partition_id: int, transaction_id: str) -> bytes:
    """What a trace's envelope is bound to: its message (partition and transaction id), so
    an envelope moved to another message's trace does not open."""
    return b"trace\x00" + partition_id.to_bytes(8, "big") + transaction_id.encode("utf-8")


def open_payload(cipher: PayloadCipher | None, stored: str, message_id: str) -> str:
    """The JSON text of a stored payload: ``stored`` itself when it is plaintext, else what
    its envelope holds. Raises :class:`PayloadUnreadable` when it is encrypted and ``cipher``
    (None: no key configured) cannot open it."""
    if not stored.startswith(PREFIX):
        return stored
    if cipher is None:
        raise PayloadUnreadable(
            f"message {message_id} is encrypted and QUEEN_ENCRYPTION_KEY is not set"
        )
    return cipher.open(stored, message_id)

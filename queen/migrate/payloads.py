"""What an imported payload is stored as (pure).

The original seals a payload of a queue with encryption on as a JSON object
``{"encrypted": ..., "iv": ..., "authTag": ...}`` (base64 of AES-256-GCM ciphertext, 12-byte
nonce and tag, no associated data) under ``QUEEN_ENCRYPTION_KEY``; this broker reads the same
variable. An imported payload is opened with that key and, when its queue is encrypted here
and a key is set, sealed again in this broker's envelope (:mod:`queen.cipher`), bound to its
message id; otherwise it is stored as the JSON text the original held.
"""

from __future__ import annotations

import base64
import binascii
import json

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from queen.cipher import PayloadCipher
from queen.errors import QueenError


class OriginalPayloadUnreadable(QueenError):
    """An encrypted payload of the original cannot be opened with the key given."""


def open_original(stored: str, key: bytes | None, message_id: str) -> str:
    """The JSON text inside an envelope of the original."""
    if key is None:
        raise OriginalPayloadUnreadable(
            f"message {message_id} is encrypted; set QUEEN_ENCRYPTION_KEY to the original's key"
        )
    try:
        envelope = json.loads(stored)
        data = base64.b64decode(envelope["encrypted"], validate=True)
        nonce = base64.b64decode(envelope["iv"], validate=True)
        tag = base64.b64decode(envelope["authTag"], validate=True)
        return AESGCM(key).decrypt(nonce, data + tag, None).decode("utf-8")
    except (ValueError, KeyError, TypeError, binascii.Error, InvalidTag):
        raise OriginalPayloadUnreadable(
            f"the encrypted payload of message {message_id} does not open with "
            "QUEEN_ENCRYPTION_KEY: is it the original's key?"
        ) from None


def stored_payload(
    payload: str,
    *,
    encrypted: bool,
    message_id: str,
    original_key: bytes | None,
    cipher: PayloadCipher | None,
) -> str:
    """The text to store for one imported payload; ``cipher`` is set when its queue is
    encrypted here and a key is configured."""
    text = open_original(payload, original_key, message_id) if encrypted else payload
    if cipher is None:
        return text
    return cipher.seal(text.encode("utf-8"), message_id).decode("ascii")

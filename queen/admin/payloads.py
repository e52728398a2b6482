"""How a stored payload becomes the JSON value the admin API and the dashboard show.

Every place that shows a message's payload (the message viewer, ``GET /api/v1/messages/...``)
calls :func:`decode_payload`, so how payloads are stored (plaintext JSON, or an envelope of an
encrypted queue) is dealt with here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from queen.cipher import PREFIX, PayloadUnreadable
from queen.encryption import QueueEncryption
from queen.intake import decode_json
from queen.model import InvalidPush


@dataclass(frozen=True, slots=True)
class Shown:
    value: Any  # the JSON value; None when it cannot be read
    encrypted: bool  # stored encrypted
    error: str | None  # why it cannot be shown


def decode_payload(stored: str, message_id: str, encryption: QueueEncryption) -> Shown:
    """The JSON value of a stored payload, opened with the broker's key if it is encrypted."""
    encrypted = stored.startswith(PREFIX)
    try:
        plain = encryption.open(stored, message_id)
    except PayloadUnreadable as exc:
        return Shown(None, encrypted, str(exc))
    try:
        return Shown(decode_json(plain.encode()), encrypted, None)
    except InvalidPush:
        return Shown(plain, encrypted, None)

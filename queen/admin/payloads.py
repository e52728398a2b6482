"""How a stored payload becomes the JSON value the admin API and the dashboard show.

Every place that shows a message's payload (the message viewer, ``GET /api/v1/messages/...``)
calls :func:`decode_payload`, so a change in how payloads are stored (an encoding, encryption)
is made here once.
"""

from __future__ import annotations

from typing import Any

from queen.intake import decode_json
from queen.model import InvalidPush


def decode_payload(stored: str) -> Any:
    """The JSON value of a stored payload; the raw text if it cannot be read as JSON."""
    try:
        return decode_json(stored.encode())
    except InvalidPush:
        return stored

"""JSON answers and bodies. Every error the HTTP layer produces is ``{"error": "<text>"}``."""

from __future__ import annotations

from typing import Any

import orjson
from quart import Response, request

from queen.consume.errors import InvalidRequest
from queen.intake import decode_json
from queen.model import InvalidPush

JSON = "application/json"


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, content_type=JSON)


def error_response(status: int, message: str, **extra: Any) -> Response:
    return json_response({"error": message, **extra}, status=status)


async def json_body(*, allow_empty: bool = False) -> Any:
    """The request's JSON body; ``None`` for an empty one when ``allow_empty`` (clients send
    no body at all for ``{}``). Raises :class:`InvalidRequest` for anything unreadable."""
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    if allow_empty and not raw.strip():
        return None
    try:
        return decode_json(raw)
    except InvalidPush as exc:
        raise InvalidRequest(str(exc)) from None

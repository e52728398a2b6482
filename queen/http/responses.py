"""JSON answers. Every error the HTTP layer produces is ``{"error": "<text>"}``."""

from __future__ import annotations

from typing import Any

import orjson
from quart import Response

JSON = "application/json"


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, content_type=JSON)


def error_response(status: int, message: str, **extra: Any) -> Response:
    return json_response({"error": message, **extra}, status=status)

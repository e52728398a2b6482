"""JSON answers and bodies. Every error the HTTP layer produces is ``{"error": "<text>"}``."""

from __future__ import annotations

import math
from typing import Any

import orjson
import trio
from quart import Response, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from queen.consume.errors import InvalidRequest
from queen.http.asgi import arrived_body
from queen.intake import decode_json
from queen.model import InvalidPush

JSON = "application/json"


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, content_type=JSON)


def error_response(status: int, message: str, **extra: Any) -> Response:
    return json_response({"error": message, **extra}, status=status)


async def read_body() -> bytearray:
    """The request body in one buffer, read as it arrives (413 over ``MAX_CONTENT_LENGTH``,
    408 after ``BODY_TIMEOUT``).

    With a ``Content-Length`` the buffer is allocated once at that size and filled in place:
    the body is held once, not once by the framework and once more as a copy. A body that has
    all arrived when the route reads it (a small one comes with its request's head) is taken
    as it is, with no wait.
    """
    declared = request.content_length
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    if declared is not None and limit is not None and declared > limit:
        raise RequestEntityTooLarge()
    whole = arrived_body(request.body)
    if whole is not None:
        if limit is not None and len(whole) > limit:
            raise RequestEntityTooLarge()
        return whole
    timeout = current_app.config["BODY_TIMEOUT"]
    with trio.move_on_after(math.inf if timeout is None else timeout):
        if declared is None:
            buffer = bytearray()
            async for chunk in request.body:
                buffer += chunk
                if limit is not None and len(buffer) > limit:
                    # (the framework only counts what is waiting to be read)
                    raise RequestEntityTooLarge()
            return buffer
        buffer = bytearray(declared)
        filled = 0
        with memoryview(buffer) as view:
            async for chunk in request.body:
                view[filled : filled + len(chunk)] = chunk
                filled += len(chunk)
        return buffer
    raise RequestTimeout()


async def json_body(*, allow_empty: bool = False) -> Any:
    """The request's JSON body; ``None`` for an empty one when ``allow_empty`` (clients send
    no body at all for ``{}``). Raises :class:`InvalidRequest` for anything unreadable."""
    raw = await read_body()
    if allow_empty and (not raw or raw.isspace()):
        return None
    try:
        return decode_json(raw)
    except InvalidPush as exc:
        raise InvalidRequest(str(exc)) from None

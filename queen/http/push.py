"""``POST /api/v1/push``: parse the body, hand it to the broker, answer 201 with one result per
item. No rule of the push lives here beyond reading JSON: validation is in :mod:`queen.intake`,
the work in :class:`queen.push.PushService`. Access (``write``) was checked before the route runs;
the producer identity stamped on every message is the validated token's ``sub``, never a
field of the body."""

from __future__ import annotations

from quart import Blueprint, Response, current_app, request

from queen.broker import Broker
from queen.http import render
from queen.http.access import producer_sub
from queen.http.responses import error_response, json_response, read_body
from queen.intake import decode_json, plain_json_strings, prepare_push
from queen.model import InvalidPush

blueprint = Blueprint("push", __name__)

_BINARY_PUSH_TYPES = ("application/x-queen-push", "application/octet-stream")


@blueprint.post("/api/v1/push")
async def push() -> Response:
    content_type = (request.content_type or "").split(";")[0].strip().lower()
    if content_type in _BINARY_PUSH_TYPES:
        return error_response(400, "binary push bodies are not supported; send JSON")
    broker: Broker = current_app.config["QUEEN_BROKER"]
    raw = await read_body()
    try:
        body = decode_json(raw)
        if type(body) is not dict:
            raise InvalidPush("body must be a JSON object with an items array")
        prepared = prepare_push(body.get("items"), plain_strings=plain_json_strings(raw))
    except InvalidPush as exc:
        return error_response(400, str(exc))
    # The prepared push holds everything the broker needs: the raw and decoded body go now,
    # not when the answer has been sent.
    del raw, body
    if prepared.count == 0:
        return json_response([], status=201)
    answer = await broker.push_service.push_prepared(prepared, producer_sub=producer_sub())
    return json_response(render.push_answer(answer), status=201)

"""Queue, DLQ and pop-maintenance routes.

Thin: validate with :mod:`queen.consume.requests`, call the broker, render the answer
(:mod:`queen.http.render`).
"""

from __future__ import annotations

from quart import Blueprint, Response, current_app, request

from queen.broker import Broker
from queen.consume import requests
from queen.consume.errors import InvalidRequest
from queen.consume.options import parse_options
from queen.http import render
from queen.http.responses import json_body, json_response

blueprint = Blueprint("admin", __name__)


def _broker() -> Broker:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    return broker


@blueprint.post("/api/v1/configure")
async def configure() -> Response:
    body = await json_body()
    if type(body) is not dict:
        raise InvalidRequest("body must be a JSON object")
    queue = body.get("queue")
    if type(queue) is not str or not queue:
        raise InvalidRequest("queue is required")
    answer = await _broker().consume.configure(
        queue, body.get("namespace"), body.get("task"), parse_options(body.get("options"))
    )
    return json_response(render.configured(answer))


@blueprint.delete("/api/v1/resources/queues/<path:queue>")
async def delete_queue(queue: str) -> Response:
    return json_response(render.queue_deleted(await _broker().consume.delete_queue(queue)))


@blueprint.get("/api/v1/dlq")
async def dlq() -> Response:
    page = await _broker().consume.dlq(requests.dlq_query(request.args))
    return json_response(render.dlq_page(page))


@blueprint.get("/api/v1/system/maintenance/pop")
async def pop_maintenance() -> Response:
    return json_response(render.pop_maintenance(await _broker().consume.pop_maintenance()))


@blueprint.post("/api/v1/system/maintenance/pop")
async def set_pop_maintenance() -> Response:
    enabled = requests.enabled_flag(await json_body(allow_empty=True))
    answer = await _broker().consume.set_pop_maintenance(enabled)
    return json_response(render.pop_maintenance(answer))

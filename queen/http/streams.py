"""The routes of the official Streams SDK: ``/streams/v1/queries``, ``/cycle``, ``/state/get``.

Thin: validate with :mod:`queen.streams.requests`, call the broker's streams service, render
the answer (:mod:`queen.http.render`). A
changed config hash answers 409, an unknown query id 404; a cycle refused by its lease
answers 200 with ``success: false`` (the SDK reads it), like the transaction route.
"""

from __future__ import annotations

from quart import Blueprint, Response, current_app

from queen.broker import Broker
from queen.http import render
from queen.http.access import producer_sub
from queen.http.responses import error_response, json_body, json_response
from queen.streams.requests import cycle_request, register_request, state_query
from queen.streams.service import QueryConflict, UnknownQuery

blueprint = Blueprint("streams", __name__)


def _broker() -> Broker:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    return broker


@blueprint.errorhandler(QueryConflict)
async def conflict(exc: QueryConflict) -> Response:
    return json_response(render.query_conflict(exc), status=409)


@blueprint.errorhandler(UnknownQuery)
async def unknown(exc: UnknownQuery) -> Response:
    return error_response(404, str(exc))


@blueprint.post("/streams/v1/queries")
async def register() -> Response:
    request = register_request(await json_body())
    return json_response(render.query_registered(await _broker().streams.register(request)))


@blueprint.post("/streams/v1/cycle")
async def cycle() -> Response:
    request = cycle_request(await json_body())
    return json_response(render.cycle(await _broker().streams.cycle(request, producer_sub())))


@blueprint.post("/streams/v1/state/get")
async def state_get() -> Response:
    query = state_query(await json_body())
    return json_response(render.state_rows(await _broker().streams.state(query)))

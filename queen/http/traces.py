"""Trace routes: record a processing trace, read them back by message or by name.

Thin: :attr:`queen.consume.service.ConsumeService.traces` validates and answers; the bodies
are rendered by :mod:`queen.http.render`. A message is
named by its numeric ``partitionId`` and its ``transactionId`` (which may hold ``/``, left
unquoted by the official clients), so ``/traces/by-name/...`` and ``/traces/names`` can never
be read as a message.
"""

from __future__ import annotations

from quart import Blueprint, Response, current_app, request

from queen.broker import Broker
from queen.http import render
from queen.http.responses import json_body, json_response

blueprint = Blueprint("traces", __name__)


def _broker() -> Broker:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    return broker


@blueprint.post("/api/v1/traces")
async def record_trace() -> Response:
    recorded = await _broker().consume.traces.record(await json_body())
    return json_response(render.trace_recorded(recorded), status=201)


@blueprint.get("/api/v1/traces/<int:partition_id>/<path:transaction_id>")
async def message_traces(partition_id: int, transaction_id: str) -> Response:
    found = await _broker().consume.traces.for_message(partition_id, transaction_id)
    return json_response(render.trace_page(found))


@blueprint.get("/api/v1/traces/by-name/<path:name>")
async def traces_by_name(name: str) -> Response:
    return json_response(
        render.trace_page(await _broker().consume.traces.by_name(name, request.args))
    )


@blueprint.get("/api/v1/traces/names")
async def trace_names() -> Response:
    return json_response(render.trace_names(await _broker().consume.traces.names(request.args)))

"""``GET /health`` and ``GET /metrics``: public, never behind authentication."""

from __future__ import annotations

import os

from quart import Blueprint, Response, current_app

from queen.broker import Broker
from queen.http.responses import json_response

blueprint = Blueprint("health", __name__)


@blueprint.get("/health")
async def health() -> Response:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    healthy, body = await broker.health()
    return json_response(body, status=200 if healthy else 503)


@blueprint.get("/metrics")
async def metrics() -> Response:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    # Counters are per process: the process id tells apart the workers behind one port.
    text = broker.metrics.render_prometheus({"process_id": os.getpid()})
    return Response(text, status=200, content_type="text/plain; version=0.0.4")

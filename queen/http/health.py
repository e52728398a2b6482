"""``GET /health``, ``GET /metrics`` and ``GET /metrics/prometheus``: public unless removed
from ``JWT_SKIP_PATHS``.

``/metrics`` is the Prometheus text (the service's counters and gauges, every worker of
``--workers N`` together, and per-queue gauges) unless the client asks for
``application/json``: then the original broker's JSON figures.
"""

from __future__ import annotations

from quart import Blueprint, Response, current_app, request

from queen.admin.service import AdminService
from queen.broker import Broker
from queen.consume.errors import ConsumeUnavailable
from queen.errors import StoreError
from queen.http import render, render_admin
from queen.http.responses import json_response
from queen.metrics import render_labelled_gauges

blueprint = Blueprint("health", __name__)

PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


@blueprint.get("/health")
async def health() -> Response:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    report = await broker.ops.health()
    return json_response(render.health(report), status=200 if report.healthy else 503)


def _wants_json() -> bool:
    """JSON when the client's Accept names ``application/json`` (anywhere in the list, as the
    original's dashboard sends it: ``application/json, text/plain, */*``) and does not rank
    ``text/plain`` above it. Prometheus names neither and gets the text."""
    listed: dict[str, float] = {}
    for value, quality in request.accept_mimetypes:
        kind = value.split(";", 1)[0].strip().lower()
        listed[kind] = max(quality, listed.get(kind, 0.0))
    json_q = listed.get("application/json", 0.0)
    return json_q > 0 and json_q >= listed.get("text/plain", 0.0)


async def _prometheus() -> Response:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    admin: AdminService = current_app.config["QUEEN_ADMIN"]
    text = broker.ops.prometheus_text()
    gauges = None  # with the database away, the process figures still answer at once
    if broker.ops.db_health.up:
        try:
            gauges = await admin.gauges.read()
        except (StoreError, ConsumeUnavailable):
            gauges = None
    if gauges is not None:
        text += render_labelled_gauges(
            render_admin.queue_gauges(gauges), render_admin.QUEUE_GAUGE_HELP
        )
    return Response(text, status=200, content_type=PROMETHEUS)


@blueprint.get("/metrics")
async def metrics() -> Response:
    if _wants_json():
        admin: AdminService = current_app.config["QUEEN_ADMIN"]
        return json_response(render_admin.metrics(admin.system.metrics_json()))
    return await _prometheus()


@blueprint.get("/metrics/prometheus")
async def prometheus() -> Response:
    return await _prometheus()

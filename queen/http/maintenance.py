"""``GET/POST /api/v1/system/maintenance``: the push maintenance switch (the answer also says
how the pop switch stands)."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, current_app

from queen.broker import Broker
from queen.errors import StoreError
from queen.http import render
from queen.http.responses import error_response, json_response, read_body
from queen.intake import decode_json
from queen.model import InvalidPush

blueprint = Blueprint("maintenance", __name__)


def _state(broker: Broker) -> dict[str, Any]:
    ops = broker.ops
    return render.maintenance(
        ops.maintenance.enabled,
        ops.spool_state(),
        pop_enabled=ops.maintenance.pop_enabled,
        database_up=ops.db_health.up,
    )


@blueprint.get("/api/v1/system/maintenance")
async def get_maintenance() -> Response:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    return json_response(_state(broker))


@blueprint.post("/api/v1/system/maintenance")
async def set_maintenance() -> Response:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    try:
        body = decode_json(await read_body())
    except InvalidPush:
        body = None
    enabled = body.get("enabled") if isinstance(body, dict) else None
    if type(enabled) is not bool:
        return error_response(400, "enabled (boolean) is required")
    try:
        await broker.ops.set_maintenance(enabled)
    except StoreError as exc:
        return error_response(503, f"maintenance mode not changed: {exc}")
    return json_response(_state(broker) | render.maintenance_switched(enabled))

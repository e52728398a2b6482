"""``GET /api/v1/resources/queues/{queue}``: what a queue holds (read role)."""

from __future__ import annotations

from quart import Blueprint, Response, current_app

from queen.broker import Broker
from queen.http.responses import error_response, json_response

blueprint = Blueprint("resources", __name__)


@blueprint.get("/api/v1/resources/queues/<queue>")
async def queue_resources(queue: str) -> Response:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    holdings = await broker.queue_holdings(queue)
    if holdings is None:
        return error_response(404, f"queue {queue!r} does not exist")
    return json_response(holdings)

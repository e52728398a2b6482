"""Consumer-group routes: delete a group everywhere or on one queue, move its
subscription, seek it on a queue or a partition.

Thin: validate with :mod:`queen.consume.requests`, call the broker, render the answer
(:mod:`queen.http.render`).

A group name may hold ``/`` (the official clients leave it unquoted in the path), so these
routes take it with :class:`GroupName`, which spans segments but never a segment ``queues``:
``/consumer-groups/<g>/queues/<q>`` therefore always reaches the per-queue routes, and no rule
here matches another rule's path. A ``/`` sent as ``%2F`` stays inside its segment
(:mod:`queen.http.paths`); the queue and partition names here take one segment, ``%2F`` for
a ``/`` in them.
"""

from __future__ import annotations

from quart import Blueprint, Response, current_app, request
from werkzeug.routing import BaseConverter

from queen.broker import Broker
from queen.consume import requests
from queen.http import render
from queen.http.paths import spanning, unescape
from queen.http.responses import json_body, json_response

blueprint = Blueprint("groups", __name__)

GROUPS = "/api/v1/consumer-groups/<group:group>"


class GroupName(BaseConverter):
    """One or more path segments, none of them ``queues``."""

    part_isolating = False
    regex = spanning("queues")

    def to_python(self, value: str) -> str:
        return unescape(value)


def _broker() -> Broker:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    return broker


def _metadata() -> bool:
    return requests.flag(request.args.get("deleteMetadata"), "deleteMetadata", True)


@blueprint.delete(GROUPS)
async def delete_consumer_group(group: str) -> Response:
    checked = requests.name(group, "consumer group")
    assert checked is not None
    answer = await _broker().consume.delete_consumer_group(checked, _metadata())
    return json_response(render.group_deleted(answer))


@blueprint.delete(f"{GROUPS}/queues/<queue>")
async def delete_consumer_group_on_queue(group: str, queue: str) -> Response:
    metadata = _metadata()
    answer = await _broker().consume.delete_consumer_group_on_queue(group, queue, metadata)
    return json_response(render.group_deleted_on_queue(answer))


@blueprint.post(f"{GROUPS}/subscription")
async def set_subscription(group: str) -> Response:
    checked = requests.name(group, "consumer group")
    assert checked is not None
    at = requests.subscription_timestamp(await json_body(allow_empty=True))
    answer = await _broker().consume.set_subscription(checked, at)
    return json_response(render.subscription_moved(answer))


@blueprint.post(f"{GROUPS}/queues/<queue>/seek")
async def seek(group: str, queue: str) -> Response:
    target = requests.seek_target(await json_body(allow_empty=True))
    return json_response(render.seek(await _broker().consume.seek(group, queue, target)))


@blueprint.post(f"{GROUPS}/queues/<queue>/partitions/<partition>/seek")
async def seek_partition(group: str, queue: str, partition: str) -> Response:
    target = requests.seek_target(await json_body(allow_empty=True), empty_means_end=True)
    answer = await _broker().consume.seek(group, queue, target, partition)
    return json_response(render.seek(answer))

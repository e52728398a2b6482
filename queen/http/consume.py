"""Consume routes: pop, ack, lease extension, transaction.

Thin: read the request, validate it with :mod:`queen.consume.requests`, call the broker's
consume service, render the answer (:mod:`queen.http.render`). An empty pop answers 204. A
pop's answer stays charged to the process's byte budget, at the size of its body, until it
has been sent. Path parameters arrive percent-decoded; the queue and partition names of the
pop routes may span segments (:class:`queen.http.paths.QueueName`: the official clients leave
them unquoted). A waiting pop stops waiting when the client ends its side of the connection
(it closed it, or half-closed it and may still read): it answers 204 at once rather than take
a lease for a client that may be gone.
"""

from __future__ import annotations

import orjson
from quart import Blueprint, Response, current_app, request

from queen.broker import Broker
from queen.consume import requests
from queen.consume.results import PopResult
from queen.http import render
from queen.http.access import producer_sub
from queen.http.asgi import release_when_sent
from queen.http.responses import JSON, json_body, json_response
from queen.records import PopRequest
from queen.serving import client_end

blueprint = Blueprint("consume", __name__)


def _broker() -> Broker:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    return broker


async def _pop(pop: PopRequest) -> Response:
    end = client_end(request.scope) if pop.wait else None
    if end is None:
        result: PopResult | None = await _broker().consume.pop(pop)
    else:
        result = None
        with end.cancels():  # (the wait is cancelled, never a database call)
            result = await _broker().consume.pop(pop)
    if result is not None:
        release_when_sent(result.charge)
    if not result:
        return Response(b"", status=204)
    body = orjson.dumps(render.pop(result))
    result.charge.resize(len(body))
    return Response(body, status=200, content_type=JSON)


def _pop_request(queue: str | None, partition: str | None = None) -> PopRequest:
    return requests.pop_request(request.args, queue=queue, partition=partition)


@blueprint.get("/api/v1/pop/queue/<queue:queue>")
async def pop_queue(queue: str) -> Response:
    return await _pop(_pop_request(queue))


@blueprint.get("/api/v1/pop/queue/<queue:queue>/partition/<path:partition>")
async def pop_partition(queue: str, partition: str) -> Response:
    return await _pop(_pop_request(queue, partition))


@blueprint.get("/api/v1/pop")
async def pop_filtered() -> Response:
    return await _pop(_pop_request(None))


@blueprint.post("/api/v1/ack")
async def ack() -> Response:
    body = await json_body()
    item = requests.ack_item(body, default_status="completed")
    return json_response(render.acks(await _broker().consume.ack([item])))


@blueprint.post("/api/v1/ack/batch")
async def ack_batch() -> Response:
    items = requests.ack_batch(await json_body())
    return json_response(render.acks(await _broker().consume.ack(items)))


@blueprint.post("/api/v1/lease/<lease>/extend")
async def extend_lease(lease: str) -> Response:
    seconds = requests.lease_seconds(await json_body(allow_empty=True))
    answer = await _broker().consume.extend_lease(lease, seconds)
    return json_response([render.lease_extension(answer)])


@blueprint.post("/api/v1/transaction")
async def transaction() -> Response:
    tx = requests.transaction_request(await json_body())
    return json_response(
        render.transaction(await _broker().consume.transaction(tx, producer_sub()))
    )

"""The floor of the HTTP server the broker runs on (``python -m bench.hypercorn_floor``): a bare
ASGI callable on Hypercorn's Trio worker with Hypercorn's defaults, answering a push as
:mod:`bench.http_ceiling` does, without Quart or our serving layer."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from queen.ids import mint_ids
from queen.model import DEFAULT_PARTITION
from queen.server import listen_socket
from queen.settings import Settings
from queen.supervision import stop_signals


async def _answer(send: ASGISendCallable, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def push_results(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The broker's answer to a push of ``items``, every item ``queued``."""
    results = []
    for index, (item, message_id) in enumerate(zip(items, mint_ids(len(items)), strict=True)):
        transaction_id = item.get("transactionId") or message_id
        result = {
            "index": index,
            "message_id": message_id,
            "messageId": message_id,
            "transaction_id": transaction_id,
            "transactionId": transaction_id,
            "queueName": item.get("queue"),
            "partition": item.get("partition", DEFAULT_PARTITION),
            "status": "queued",
        }
        results.append(result)
    return results


async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client left
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    if scope["method"] == "POST" and scope["path"] == "/api/v1/push":
        try:
            body = orjson.loads(b"".join(chunks))
            await _answer(send, 201, orjson.dumps(push_results(body.get("items") or [])))
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            await _answer(send, 400, b'{"error":"bad push body"}')
    elif scope["path"] == "/health":
        await _answer(send, 200, b'{"status":"healthy"}')
    else:
        await _answer(send, 404, b'{"error":"not found"}')


async def serve(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM on a socket other processes may share."""
    sock = listen_socket(settings.host, settings.port, reuse_port=True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    with stop_signals() as stop:
        await hypercorn_serve(app, config, shutdown_trigger=stop.wait)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    trio.run(serve, Settings.from_env())

"""The HTTP ceiling (``python -m bench.http_ceiling``): ``queen serve``'s application class,
serving loop, configuration and socket, with a push route that decodes the body and answers the
broker's answer shape, without the broker (no database, validation, re-encoding or grouping).

``QUEEN_BENCH_HOLD_MS``: the push route waits that long before answering, as a push waits for
its transaction (``python -m bench.held``)."""

from __future__ import annotations

import logging
import os

import orjson
import trio
from quart import Response, request

from bench.hypercorn_floor import push_results
from queen.gctune import tune_gc
from queen.http.asgi import App
from queen.http.responses import error_response, json_response
from queen.server import listen_socket
from queen.serving import serve_app
from queen.settings import Settings
from queen.supervision import stop_signals

HOLD_ENV = "QUEEN_BENCH_HOLD_MS"


def create_app(max_body_bytes: int, hold_s: float = 0.0) -> App:
    """The stack's app; its push route answers ``hold_s`` seconds after reading the body."""
    app = App("queen-http-ceiling")  # queen serve's app class
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes

    @app.post("/api/v1/push")
    async def push() -> Response:
        raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"malformed JSON: {exc}")
        if hold_s > 0:
            await trio.sleep(hold_s)
        return json_response(push_results(body.get("items") or []), status=201)

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "healthy"})

    return app


async def serve(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM, as :func:`queen.server.serve` does (without a broker)."""
    app = create_app(settings.max_body_bytes, float(os.environ.get(HOLD_ENV, "0")) / 1000)
    sock = listen_socket(settings.host, settings.port, reuse_port=True)
    with stop_signals() as stop:
        await serve_app(app, settings, sock, shutdown_trigger=stop.wait)


if __name__ == "__main__":
    settings = Settings.from_env()
    logging.basicConfig(level=logging.WARNING)
    tune_gc(settings.gc_gen0_threshold)  # the same process settings as queen serve
    trio.run(serve, settings)

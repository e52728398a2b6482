"""The Quart-Trio application: a thin HTTP layer over one :class:`queen.broker.Broker`.

No SQL and no concurrency logic live here. Routes parse, call the broker, shape the answer;
every error is a JSON ``{"error": ...}`` with a 4xx/5xx status, and no input can produce a 500.
Access control is one before-request hook (:mod:`queen.http.access`) over the gate of
:mod:`queen.auth`; a new route must be added to :data:`queen.auth.ROUTE_TABLE`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from quart import Response
from werkzeug.exceptions import HTTPException

from queen.auth import AccessGate, build_gate
from queen.broker import Broker
from queen.cipher import PayloadUnreadable
from queen.consume.errors import AnswersBusy, ConsumeUnavailable, InvalidRequest, NotFound
from queen.errors import StoreUnavailable
from queen.http import (
    access,
    admin,
    admin_api,
    consume,
    cors,
    dashboard,
    groups,
    headers,
    health,
    inputs,
    maintenance,
    migration,
    paths,
    push,
    streams,
    traces,
    webapp,
)
from queen.http.asgi import App
from queen.http.responses import error_response
from queen.push import BrokerClosed, PartitionsBusy

log = logging.getLogger("queen.http")


def create_app(broker: Broker, *, gate: AccessGate | None = None) -> App:
    """The app over ``broker``. ``gate`` decides access; without one it is built from the
    broker's settings (raising :class:`queen.auth.AuthConfigError` if they cannot work)."""
    # No static files of Quart's: every route of the app is one of ours, and in the access
    # table (an operator's built dashboard too: queen.http.webapp).
    app = App("queen", static_folder=None)
    app.config["QUEEN_BROKER"] = broker
    # The push route must answer 413 itself at QUEEN_MAX_BODY_BYTES; Quart's own limit
    # (16 MiB by default) must not answer first.
    app.config["MAX_CONTENT_LENGTH"] = broker.settings.max_body_bytes
    app.config["JSON_SORT_KEYS"] = False
    app.url_map.converters.update(paths.CONVERTERS)
    app.url_map.converters["group"] = groups.GroupName
    app.url_map.converters["group_detail"] = admin_api.GroupDetailName
    app.config["QUEEN_ADMIN"] = broker.admin
    headers.install(app)  # nosniff on every answer, the dashboard's policy on HTML ones
    cors.install(app, broker.settings.cors_origins)  # preflights are answered before the gate
    access.install(app, gate if gate is not None else build_gate(broker.settings))
    inputs.install(app)  # no NUL in a path or a query string, for every route
    app.register_blueprint(push.blueprint)
    app.register_blueprint(health.blueprint)
    app.register_blueprint(maintenance.blueprint)
    app.register_blueprint(migration.blueprint)
    app.register_blueprint(consume.blueprint)
    app.register_blueprint(admin.blueprint)
    app.register_blueprint(groups.blueprint)
    app.register_blueprint(traces.blueprint)
    app.register_blueprint(admin_api.blueprint)
    app.register_blueprint(dashboard.blueprint)
    if broker.settings.webapp_root is None:
        app.add_url_rule("/", "dashboard_home", dashboard.shell, methods=["GET"])
    else:
        # An operator's built dashboard at / and /assets/ (and its pages' paths), as the
        # original broker serves its app; ours stays at /dashboard/.
        app.register_blueprint(webapp.blueprint_for(Path(broker.settings.webapp_root)))
    app.register_blueprint(streams.blueprint)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        if code == 413:
            limit = broker.settings.max_body_bytes
            return error_response(413, f"request body is larger than {limit} bytes")
        return error_response(code, exc.name)

    @app.errorhandler(BrokerClosed)
    async def closing(exc: BrokerClosed) -> Response:
        return error_response(503, str(exc))

    @app.errorhandler(PartitionsBusy)
    async def busy(exc: PartitionsBusy) -> Response:
        response = error_response(503, str(exc))
        response.headers["Retry-After"] = "1"
        return response

    @app.errorhandler(AnswersBusy)
    async def answers_busy(exc: AnswersBusy) -> Response:
        response = error_response(503, str(exc))
        response.headers["Retry-After"] = "1"
        return response

    @app.errorhandler(InvalidRequest)
    async def invalid(exc: InvalidRequest) -> Response:
        return error_response(400, str(exc))

    @app.errorhandler(NotFound)
    async def not_found(exc: NotFound) -> Response:
        return error_response(404, str(exc))

    @app.errorhandler(ConsumeUnavailable)
    async def no_consume(exc: ConsumeUnavailable) -> Response:
        return error_response(501, str(exc))

    @app.errorhandler(PayloadUnreadable)
    async def unreadable(exc: PayloadUnreadable) -> Response:
        # The broker's key does not open what is stored: a server-side condition, retryable
        # once the key is right. The messages stay stored.
        return error_response(503, str(exc), code="decryption_failed")

    @app.errorhandler(StoreUnavailable)
    async def database_down(exc: StoreUnavailable) -> Response:
        # "connection" in the text: the official client's consume loop then waits and retries
        return error_response(503, "PostgreSQL connection unavailable; retry later")

    @app.errorhandler(Exception)
    async def internal(exc: Exception) -> Response:
        log.exception("unhandled error in %s", type(exc).__name__)
        return error_response(500, "internal error")

    return app

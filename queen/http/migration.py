"""``/api/v1/migration/*``: the original broker's dashboard moves that broker's database to
another PostgreSQL server from its Migration page (a ``pg_dump`` piped into ``pg_restore``).
This broker does not copy its database from the dashboard: the actions answer 501 with a
message saying what to do instead, the status route answers that nothing is running.

Bringing an original broker's database into this one is ``queen import`` (a command, run by
the operator: docs/importing.md); moving this broker's own database is PostgreSQL's
``pg_dump`` and ``pg_restore`` with the broker stopped.
"""

from __future__ import annotations

from typing import Final

from quart import Blueprint, Response

from queen.http.responses import error_response, json_response

blueprint = Blueprint("migration", __name__)

NOT_HERE: Final = (
    "this broker does not copy databases from the dashboard: to bring in an original Queen "
    "broker's database run `queen import --from postgresql://.../queen` (docs/importing.md); "
    "to move this broker's database to another PostgreSQL server, stop the broker and copy "
    "it with pg_dump and pg_restore"
)


@blueprint.get("/api/v1/migration/status")
async def status() -> Response:
    """Nothing runs here: the original's idle answer, and why."""
    return json_response(
        {
            "status": "idle",
            "currentStep": "",
            "elapsedSeconds": 0,
            "supported": False,
            "message": NOT_HERE,
        }
    )


def _refused() -> Response:
    return error_response(501, NOT_HERE, supported=False)


@blueprint.post("/api/v1/migration/test-connection")
async def test_connection() -> Response:
    return _refused()


@blueprint.post("/api/v1/migration/start")
async def start() -> Response:
    return _refused()


@blueprint.post("/api/v1/migration/validate")
async def validate() -> Response:
    return _refused()


@blueprint.post("/api/v1/migration/reset")
async def reset() -> Response:
    return _refused()

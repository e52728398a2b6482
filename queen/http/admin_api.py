"""The admin and observability routes (the original broker's paths and shapes).

Thin: the query string goes to :class:`queen.admin.service.AdminService`, which validates it
(400 on bad input) and answers typed values; :mod:`queen.http.render_admin` writes them as
JSON. Unknown queues, groups and messages are 404.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from quart import Blueprint, Response, current_app, request

from queen.admin import params
from queen.admin.service import AdminService, check_name
from queen.http import render_admin as render
from queen.http.access import current_identity
from queen.http.groups import GroupName
from queen.http.responses import error_response, json_body, json_response

blueprint = Blueprint("admin_api", __name__)


class GroupDetailName(GroupName):
    """A group name as :class:`GroupName` takes it, except ``lagging`` alone: that path is the
    list of lagging groups (a group of that name is still listed by the other routes)."""

    regex = r"(?!lagging(?![^/]))" + GroupName.regex


def admin() -> AdminService:
    service: AdminService = current_app.config["QUEEN_ADMIN"]
    return service


T = TypeVar("T")

DELETION_STATUS = {"deleted": 200, "leased": 409, "missing": 404}


def _found(answer: T | None, rendered: Callable[[T], Any], what: str) -> Response:
    if answer is None:
        return error_response(404, f"{what} not found")
    return json_response(rendered(answer))


# --- resources -------------------------------------------------------------------------------


@blueprint.get("/api/v1/resources/queues")
async def list_queues() -> Response:
    return json_response(render.queue_page(await admin().queues(request.args)))


@blueprint.get("/api/v1/resources/queues/<path:queue>")
async def queue_resources(queue: str) -> Response:
    name = check_name(queue, "queue")
    return _found(
        await admin().queue_resources(name, request.args),
        render.queue_resources,
        f"queue {name!r}",
    )


@blueprint.get("/api/v1/resources/namespaces")
async def namespaces() -> Response:
    return json_response(render.groupings(await admin().namespaces()))


@blueprint.get("/api/v1/resources/tasks")
async def tasks() -> Response:
    return json_response(render.groupings(await admin().tasks()))


@blueprint.get("/api/v1/resources/overview")
async def overview() -> Response:
    return json_response(render.overview(await admin().overview()))


# --- messages --------------------------------------------------------------------------------


@blueprint.get("/api/v1/messages")
async def messages() -> Response:
    return json_response(render.message_page(await admin().messages(request.args)))


@blueprint.get("/api/v1/messages/<partition_id>/<path:transaction_id>")
async def message(partition_id: str, transaction_id: str) -> Response:
    return _found(
        await admin().message(partition_id, transaction_id), render.message_detail, "Message"
    )


@blueprint.delete("/api/v1/messages/<partition_id>/<path:transaction_id>")
async def delete_message(partition_id: str, transaction_id: str) -> Response:
    deletion = await admin().delete_message(partition_id, transaction_id)
    return json_response(render.message_deleted(deletion), DELETION_STATUS[deletion.outcome])


# --- actions on dead letters and queues (admin role) -------------------------------------------


@blueprint.post("/api/v1/messages/<partition_id>/<path:transaction_id>/retry")
async def retry_message(partition_id: str, transaction_id: str) -> Response:
    checked = params.partition_id(partition_id)
    await json_body(allow_empty=True)  # no body is expected; a broken one is still a 400
    retried = await admin().actions.retry_message(
        checked, transaction_id, by=current_identity().sub
    )
    return json_response(render.message_retried(retried))


@blueprint.post("/api/v1/messages/<partition_id>/<path:transaction_id>/dlq")
async def dead_letter_message(partition_id: str, transaction_id: str) -> Response:
    checked = params.partition_id(partition_id)
    wanted = params.dead_letter_request(await json_body(allow_empty=True))
    done = await admin().actions.dead_letter(
        checked, transaction_id, wanted, by=current_identity().sub
    )
    body, status = render.message_dead_lettered(done)
    return json_response(body, status)


@blueprint.post("/api/v1/dlq/retry")
async def retry_dead_letters() -> Response:
    scope = params.retry_filter(await json_body())
    return json_response(
        render.bulk_retried(await admin().actions.retry_many(scope, by=current_identity().sub))
    )


@blueprint.delete("/api/v1/queues/<path:queue>/clear")
async def clear_queue(queue: str) -> Response:
    name = check_name(queue, "queue")
    partition = params.optional_name(request.args, "partition")
    cleared = await admin().actions.clear(name, partition, by=current_identity().sub)
    return json_response(render.queue_cleared(cleared))


# --- status and analytics --------------------------------------------------------------------


@blueprint.get("/api/v1/status")
async def status() -> Response:
    return json_response(render.status(await admin().status(request.args)))


@blueprint.get("/api/v1/status/queues")
async def status_queues() -> Response:
    return json_response(render.queue_page(await admin().queues(request.args)))


@blueprint.get("/api/v1/status/queues/<queue>")
async def status_queue(queue: str) -> Response:
    name = check_name(queue, "queue")
    return _found(
        await admin().queue_status(name, request.args, every_partition=True),
        render.queue_status,
        f"queue {name!r}",
    )


@blueprint.get("/api/v1/status/queues/<queue>/messages")
async def status_queue_messages(queue: str) -> Response:
    name = check_name(queue, "queue")
    return json_response(render.message_page(await admin().messages(request.args, queue=name)))


@blueprint.get("/api/v1/status/analytics")
async def status_analytics() -> Response:
    return json_response(render.analytics(await admin().analytics(request.args)))


@blueprint.get("/api/v1/analytics/worker-metrics")
async def worker_metrics() -> Response:
    return json_response(render.worker_metrics(await admin().worker_metrics(request.args)))


@blueprint.get("/api/v1/analytics/system-metrics")
async def system_metrics() -> Response:
    return json_response(render.system_metrics(await admin().system_metrics(request.args)))


@blueprint.get("/api/v1/analytics/queue-lag")
async def queue_lag() -> Response:
    return json_response(render.queue_lag(await admin().queue_flow(request.args, popped_only=True)))


@blueprint.get("/api/v1/analytics/queue-ops")
async def queue_ops() -> Response:
    return json_response(render.queue_ops(await admin().queue_flow(request.args)))


@blueprint.get("/api/v1/analytics/queue-parked-replicas")
async def queue_parked_replicas() -> Response:
    return json_response(render.parked_replicas(await admin().queue_flow(request.args)))


@blueprint.get("/api/v1/analytics/retention")
async def retention() -> Response:
    return json_response(render.retention(await admin().retention(request.args)))


@blueprint.get("/api/v1/analytics/postgres-stats")
async def postgres_stats() -> Response:
    return json_response(render.postgres(await admin().postgres()))


# --- consumer groups -------------------------------------------------------------------------


@blueprint.get("/api/v1/consumer-groups")
async def consumer_groups() -> Response:
    return json_response(
        render.group_standings(await admin().consumer_groups.standings(request.args))
    )


@blueprint.get("/api/v1/consumer-groups/lagging")
async def lagging() -> Response:
    return json_response(render.lagging(await admin().consumer_groups.lagging(request.args)))


@blueprint.get("/api/v1/consumer-groups/<group_detail:group>")
async def consumer_group(group: str) -> Response:
    name = check_name(group, "consumer group")
    return _found(
        await admin().consumer_groups.detail(name, request.args),
        render.group_detail,
        f"consumer group {name!r}",
    )


@blueprint.post("/api/v1/stats/refresh")
async def refresh() -> Response:
    await admin().refresh()
    return json_response(render.refreshed())

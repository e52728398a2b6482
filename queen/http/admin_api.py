"""The admin and observability routes (the original broker's paths and shapes).

Thin: the path and the query string are parsed once into the typed queries of
:mod:`queen.admin` (400 on bad input), the parts of :class:`queen.admin.service.AdminService`
answer typed values, and :mod:`queen.http.render_admin` writes them as JSON. Unknown queues,
groups and messages are 404.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from quart import Blueprint, Response, current_app, request

from queen.admin import params
from queen.admin.actions import dead_letter_request, retry_filter
from queen.admin.groups import group_detail_query, group_query, lagging_query
from queen.admin.messages import message_query
from queen.admin.queues import partition_query, queue_query
from queen.admin.service import AdminService
from queen.admin.system import (
    QueueFlowSeries,
    flow_query,
    series_query,
    series_window,
    status_query,
)
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


def _found(answer: T | None, rendered: Callable[[T], Any], what: str) -> Response:
    if answer is None:
        return error_response(404, f"{what} not found")
    return json_response(rendered(answer))


# --- resources -------------------------------------------------------------------------------


@blueprint.get("/api/v1/resources/queues")
async def list_queues() -> Response:
    query = queue_query(request.args)
    return json_response(render.queue_page(await admin().queues.page(query)))


@blueprint.get("/api/v1/resources/queues/<path:queue>")
async def queue_resources(queue: str) -> Response:
    name = params.name_in_path(queue, "queue")
    query = partition_query(request.args)
    return _found(
        await admin().queues.resources(name, query), render.queue_resources, f"queue {name!r}"
    )


@blueprint.get("/api/v1/resources/namespaces")
async def namespaces() -> Response:
    return json_response(render.groupings(await admin().queues.namespaces()))


@blueprint.get("/api/v1/resources/tasks")
async def tasks() -> Response:
    return json_response(render.groupings(await admin().queues.tasks()))


@blueprint.get("/api/v1/resources/overview")
async def overview() -> Response:
    return json_response(render.overview(await admin().system.overview()))


# --- messages --------------------------------------------------------------------------------


@blueprint.get("/api/v1/messages")
async def messages() -> Response:
    query = message_query(request.args)
    return json_response(render.message_page(await admin().messages.page(query)))


@blueprint.get("/api/v1/messages/<partition_id>/<path:transaction_id>")
async def message(partition_id: str, transaction_id: str) -> Response:
    checked = params.partition_id(partition_id)
    return _found(
        await admin().messages.detail(checked, transaction_id), render.message_detail, "Message"
    )


@blueprint.delete("/api/v1/messages/<partition_id>/<path:transaction_id>")
async def delete_message(partition_id: str, transaction_id: str) -> Response:
    checked = params.partition_id(partition_id)
    body, status = render.message_deleted(await admin().messages.delete(checked, transaction_id))
    return json_response(body, status)


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
    wanted = dead_letter_request(await json_body(allow_empty=True))
    done = await admin().actions.dead_letter(
        checked, transaction_id, wanted, by=current_identity().sub
    )
    body, status = render.message_dead_lettered(done)
    return json_response(body, status)


@blueprint.post("/api/v1/dlq/retry")
async def retry_dead_letters() -> Response:
    scope = retry_filter(await json_body())
    return json_response(
        render.bulk_retried(await admin().actions.retry_many(scope, by=current_identity().sub))
    )


@blueprint.delete("/api/v1/queues/<path:queue>/clear")
async def clear_queue(queue: str) -> Response:
    name = params.name_in_path(queue, "queue")
    partition = params.optional_name(request.args, "partition")
    cleared = await admin().actions.clear(name, partition, by=current_identity().sub)
    return json_response(render.queue_cleared(cleared))


# --- status and analytics --------------------------------------------------------------------


@blueprint.get("/api/v1/status")
async def status() -> Response:
    query = status_query(request.args)
    return json_response(render.status(await admin().system.status(query)))


@blueprint.get("/api/v1/status/queues")
async def status_queues() -> Response:
    query = queue_query(request.args)
    return json_response(render.queue_page(await admin().queues.page(query), leased_pending=True))


@blueprint.get("/api/v1/status/queues/<queue>")
async def status_queue(queue: str) -> Response:
    name = params.name_in_path(queue, "queue")
    query = partition_query(request.args)
    return _found(
        await admin().queues.status(name, query, every_partition=True),
        render.queue_status,
        f"queue {name!r}",
    )


@blueprint.get("/api/v1/status/queues/<queue>/messages")
async def status_queue_messages(queue: str) -> Response:
    name = params.name_in_path(queue, "queue")
    query = message_query(request.args, queue=name)
    return json_response(render.queue_messages(await admin().messages.page(query)))


@blueprint.get("/api/v1/status/analytics")
async def status_analytics() -> Response:
    query = series_query(request.args)
    return json_response(render.analytics(await admin().system.series(query)))


@blueprint.get("/api/v1/analytics/worker-metrics")
async def worker_metrics() -> Response:
    query = series_query(request.args)
    return json_response(render.worker_metrics(await admin().system.series(query)))


@blueprint.get("/api/v1/analytics/system-metrics")
async def system_metrics() -> Response:
    query = series_query(request.args)
    return json_response(render.system_metrics(await admin().system.series(query)))


FLOW_SCOPE_HEADER = "X-Queen-Flow-Scope"


def _flow_response(series: QueueFlowSeries, body: Any) -> Response:
    """``body`` with whose flow it is: ``every-process`` (every broker process on the
    database) or ``this-process`` (the database did not answer, or there is none)."""
    response = json_response(body)
    response.headers[FLOW_SCOPE_HEADER] = (
        "every-process" if series.every_process else "this-process"
    )
    return response


@blueprint.get("/api/v1/analytics/queue-lag")
async def queue_lag() -> Response:
    series = await admin().system.queue_flow(flow_query(request.args), popped_only=True)
    return _flow_response(series, render.queue_lag(series))


@blueprint.get("/api/v1/analytics/queue-ops")
async def queue_ops() -> Response:
    series = await admin().system.queue_flow(flow_query(request.args))
    return _flow_response(series, render.queue_ops(series))


@blueprint.get("/api/v1/analytics/queue-parked-replicas")
async def queue_parked_replicas() -> Response:
    series = await admin().system.queue_flow(flow_query(request.args))
    return _flow_response(series, render.parked_replicas(series))


@blueprint.get("/api/v1/analytics/retention")
async def retention() -> Response:
    window = series_window(request.args)
    return json_response(render.retention(await admin().system.retention(window)))


@blueprint.get("/api/v1/analytics/postgres-stats")
async def postgres_stats() -> Response:
    return json_response(render.postgres(await admin().database.stats()))


# --- consumer groups -------------------------------------------------------------------------


@blueprint.get("/api/v1/consumer-groups")
async def consumer_groups() -> Response:
    query = group_query(request.args)
    return json_response(render.group_standings(await admin().consumer_groups.standings(query)))


@blueprint.get("/api/v1/consumer-groups/lagging")
async def lagging() -> Response:
    query = lagging_query(request.args)
    return json_response(render.lagging(await admin().consumer_groups.lagging(query)))


@blueprint.get("/api/v1/consumer-groups/<group_detail:group>")
async def consumer_group(group: str) -> Response:
    name = params.name_in_path(group, "consumer group")
    query = group_detail_query(request.args)
    return _found(
        await admin().consumer_groups.detail(name, query),
        render.group_detail,
        f"consumer group {name!r}",
    )


@blueprint.post("/api/v1/stats/refresh")
async def refresh() -> Response:
    admin().system.refresh()
    return json_response(render.refreshed())

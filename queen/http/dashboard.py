"""The dashboard: ``GET /`` (or ``/dashboard/``) serves one page (no data in it, public by
default) whose script (``static/dashboard.js``, served with its style sheet under
``/dashboard/assets/``, public whenever the page is) asks for a token when the broker wants
one, then loads the views below with it and refreshes them every few seconds without
reloading the page. No page holds an inline script, event handler or style: their
Content-Security-Policy (:mod:`queen.http.headers`) lets none run.

Each view (``GET /dashboard/view/...``, read role) is HTML rendered here from the answers of
:class:`queen.admin.service.AdminService` (its query string parsed once into the typed query
of the view's subject) with the templates in ``templates/``: the templates
read the API's JSON shapes (:mod:`queen.http.render_admin`), so a view shows what the API
answers; charts are SVG drawn by :mod:`queen.admin.charts` from the typed values. Actions
(delete, seek, maintenance switches) are buttons that call the API itself after a
confirmation, so the API's access table decides who may. Everything a page shows is escaped
(Jinja's autoescape, and :func:`_missing` for the short answers); a name in a URL the page
builds goes through the ``segment`` filter, which encodes ``/`` too.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from markupsafe import escape
from quart import Blueprint, Response, current_app, render_template, request

from queen.admin import charts, params
from queen.admin.groups import GROUP_PARTITION_ORDERS, group_detail_query, group_query
from queen.admin.messages import message_query
from queen.admin.queues import PARTITION_ORDERS, partition_query, queue_query
from queen.admin.service import AdminService
from queen.admin.system import SERIES_WINDOW
from queen.broker import Broker
from queen.consume import requests
from queen.consume.errors import ConsumeUnavailable
from queen.errors import StoreUnavailable
from queen.http import render, render_admin

blueprint = Blueprint("dashboard", __name__, template_folder="templates")

REFRESH_MS = 5000
HTML = "text/html; charset=utf-8"
REMEMBERED_PAGES = 64
ASSET_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def _assets() -> dict[str, tuple[bytes, str, str]]:
    """The files of ``static/`` by name: content, content type, entity tag."""
    found = {}
    for path in sorted((Path(__file__).parent / "static").iterdir()):
        if path.suffix in ASSET_TYPES:
            body = path.read_bytes()
            tag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            found[path.name] = (body, ASSET_TYPES[path.suffix], tag)
    return found


ASSETS = _assets()


@blueprint.app_template_filter("segment")
def segment(value: object) -> str:
    """A value as one URL path segment (or query value): every reserved character encoded,
    ``/`` included, so that a name holding one stays one segment."""
    return quote(str(value), safe="")


class PageMemory:
    """The last page each view showed (by path and query), kept in this process so that a view
    the database cannot answer shows it again, marked with its age; the oldest go first."""

    def __init__(self, size: int = REMEMBERED_PAGES) -> None:
        self._size = size
        self._pages: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def keep(self, key: str, html: str) -> None:
        self._pages[key] = (time.time(), html)
        self._pages.move_to_end(key)
        while len(self._pages) > self._size:
            self._pages.popitem(last=False)

    def recall(self, key: str) -> tuple[float, str] | None:
        return self._pages.get(key)


View = Callable[..., Awaitable[Response]]


def remembered(*, standing: bool = False) -> Callable[[View], View]:
    """Keep what the view shows; while the database is away, show the outage banner, this
    process's own state (``standing``: the overview and system views) and the page as it was
    last seen."""

    def wrap(view: View) -> View:
        @functools.wraps(view)
        async def run(**kwargs: Any) -> Response:
            key = request.full_path
            if _broker().ops.db_health.up:
                try:
                    response = await view(**kwargs)
                except StoreUnavailable:
                    return await _outage(key, standing)
                if response.status_code == 200:
                    _memory().keep(key, await response.get_data(as_text=True))
                return response
            return await _outage(key, standing)

        return run

    return wrap


def _memory() -> PageMemory:
    memory = current_app.config.get("QUEEN_DASHBOARD_PAGES")
    if memory is None:
        memory = current_app.config["QUEEN_DASHBOARD_PAGES"] = PageMemory()
    return memory


async def _outage(key: str, with_standing: bool) -> Response:
    standing = await _admin().system.standing()
    kept = _memory().recall(key)
    down = standing.database_down_since
    now = time.time()
    series = _admin().history.series()[-90:]
    return await _page(
        "outage.html",
        st=render_admin.standing(standing),
        down_for=now - down.timestamp() if down is not None else None,
        with_standing=with_standing,
        kept=kept[1] if kept else None,
        kept_age=now - kept[0] if kept else None,
        kept_at=datetime.fromtimestamp(kept[0], UTC).isoformat(timespec="seconds")
        if kept
        else None,
        rates_chart=_rates_chart(series) if with_standing else "",
    )


def _rates_chart(series: list[Any]) -> str:
    return charts.line_chart(
        [
            ("push", [p.rates.ingested_per_s for p in series]),
            ("pop", [p.rates.pop_per_s for p in series]),
            ("ack", [p.rates.processed_per_s for p in series]),
        ],
        unit="/s",
        title="messages per second, this process (10 s samples)",
        times=[p.at for p in series],
    )


def _admin() -> AdminService:
    service: AdminService = current_app.config["QUEEN_ADMIN"]
    return service


def _broker() -> Broker:
    broker: Broker = current_app.config["QUEEN_BROKER"]
    return broker


async def _page(template: str, status: int = 200, **context: Any) -> Response:
    html = await render_template(template, args=request.args, **context)
    return Response(html, status=status, content_type=HTML)


def _extra(*keys: str) -> str:
    """The filters of the current view, to carry over to its next page."""
    kept = {k: request.args[k] for k in keys if request.args.get(k)}
    return "&" + urlencode(kept) if kept else ""


def _missing(message: str) -> Response:
    """A view's 404: the message (which may repeat what the URL named), escaped."""
    body = f'<div class="error-box">{escape(message)}</div>'
    return Response(body, status=404, content_type=HTML)


@blueprint.get("/dashboard/")
async def shell() -> Response:
    """The page, at ``/dashboard/`` always, and at ``/`` unless an operator's built dashboard
    (``WEBAPP_ROOT``) is served there (:func:`queen.http.app.create_app` adds that rule)."""
    return await _page("dashboard.html", refresh_ms=REFRESH_MS)


@blueprint.get("/dashboard/assets/<name>")
async def asset(name: str) -> Response:
    """The page's script and style sheet (public whenever ``/`` is: see
    :func:`queen.auth.gate.path_is_public`); revalidated at each load of the page."""
    found = ASSETS.get(name)
    if found is None:
        return _missing(f"no asset {name}")
    body, content_type, tag = found
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if request.headers.get("If-None-Match") == tag:
        return Response(b"", status=304, headers=headers)
    return Response(body, content_type=content_type, headers=headers)


@blueprint.get("/dashboard/view/overview")
@remembered(standing=True)
async def overview() -> Response:
    admin = _admin()
    query = queue_query(request.args)
    overview = await admin.system.overview()
    queues = await admin.queues.page(query)
    alerts = await admin.consumer_groups.alerts()
    rates = _rates_chart(admin.history.series()[-90:])
    top = sorted(queues.queues, key=lambda q: q.messages.depth, reverse=True)[:8]
    depth = charts.bar_chart(
        [(q.name, q.messages.depth) for q in top],
        title="deepest queues (pending + processing)",
    )
    return await _page(
        "overview.html",
        o=render_admin.overview(overview),
        queues=render_admin.queue_page(queues),
        alerts=alerts,
        alerted=[(render_admin.group_standing(g), g.stuck) for g in alerts.shown],
        rates_chart=rates,
        depth_chart=depth,
    )


@blueprint.get("/dashboard/view/queue/<path:queue>")
@remembered()
async def queue(queue: str) -> Response:
    name = params.name_in_path(queue, "queue")
    query = partition_query(request.args)
    status = await _admin().queues.status(name, query)
    if status is None:
        return _missing(f"queue {name} does not exist")
    return await _page(
        "queue.html",
        s=render_admin.queue_status(status),
        page=query.page,
        sort=query.order,
        sorts=PARTITION_ORDERS,
        search=query.search or "",
        extra=_extra("sort", "partition"),
        search_extra=_extra("partition"),
    )


@blueprint.get("/dashboard/view/messages")
@remembered()
async def messages() -> Response:
    query = message_query(request.args)
    found = await _admin().messages.page(query)
    return await _page(
        "messages.html",
        m=render_admin.message_page(found),
        page=query.page,
        extra=_extra("queue", "partition", "transactionId", "status", "from", "to"),
    )


@blueprint.get("/dashboard/view/message/<partition_id>/<path:transaction_id>")
@remembered()
async def message(partition_id: str, transaction_id: str) -> Response:
    checked = params.partition_id(partition_id)
    found = await _admin().messages.detail(checked, transaction_id)
    if found is None:
        return _missing("message not found")
    pretty = orjson.dumps(found.payload.value, option=orjson.OPT_INDENT_2).decode()
    traces = await _broker().consume.traces.for_message(found.message.partition_id, transaction_id)
    return await _page(
        "message.html",
        x=render_admin.message_detail(found),
        pretty=pretty,
        traces=render.trace_page(traces),
    )


@blueprint.get("/dashboard/view/dlq")
@remembered()
async def dlq() -> Response:
    query = requests.dlq_query(request.args)
    found = await _broker().consume.dlq(query)
    return await _page(
        "dlq.html",
        d=render.dlq_page(found),
        page=params.Page(query.limit, query.offset),
        extra=_extra("queue", "consumerGroup", "from", "to"),
    )


@blueprint.get("/dashboard/view/groups")
@remembered()
async def groups() -> Response:
    group = params.optional_name(request.args, "group")
    listed = await _admin().consumer_groups.standings(group_query(request.args))
    if group is not None:
        listed = [g for g in listed if g.name == group]
    top = sorted(listed, key=lambda g: g.lag, reverse=True)[:8]
    lag = charts.bar_chart(
        [(f"{g.name} · {g.queue}", g.lag) for g in top],
        title="largest lag (messages behind)",
    )
    return await _page(
        "groups.html",
        groups=render_admin.group_standings(listed),
        lag_chart=lag,
        page=params.page(request.args),
        extra=_extra("queue", "group"),
    )


@blueprint.get("/dashboard/view/group/<path:group>")
@remembered()
async def group(group: str) -> Response:
    name = params.name_in_path(group, "group")
    query = group_detail_query(request.args)
    groups = _admin().consumer_groups
    found = await groups.detail(name, query)
    if found is None:
        return _missing(f"consumer group {name} does not exist")
    lag_charts = {}
    for g in found:
        samples = groups.lag_history.series(name, g.standing.queue)
        lag_charts[g.standing.queue] = charts.line_chart(
            [("lag", [float(lag) for _, lag in samples])],
            title=f"lag of {name} on {g.standing.queue} (messages, 30 s samples)",
            times=[at for at, _ in samples],
        )
    return await _page(
        "group.html",
        name=name,
        detail=render_admin.group_detail(found),
        stuck={g.standing.queue: g.standing.stuck for g in found},
        lag_charts=lag_charts,
        page=query.page,
        sort=query.order,
        sorts=GROUP_PARTITION_ORDERS,
        extra=_extra("sort"),
    )


@blueprint.get("/dashboard/view/traces")
@remembered()
async def traces() -> Response:
    tracing = _broker().consume.traces
    name = request.args.get("name") or None
    found = render.trace_page(await tracing.by_name(name, request.args)) if name else None
    names = render.trace_names(await tracing.names({"limit": "100"}))
    return await _page(
        "traces.html",
        found=found,
        names=names,
        page=params.page(request.args, default_limit=100),
        extra=_extra("name"),
    )


@blueprint.get("/dashboard/view/system")
@remembered(standing=True)
async def system() -> Response:
    admin = _admin()
    broker = _broker()
    try:
        pop_on = (await broker.consume.pop_maintenance()).enabled
    except ConsumeUnavailable:
        pop_on = False
    series = admin.history.series()[-90:]
    cpu = charts.line_chart(
        [("cpu %", [p.cpu_percent for p in series])],
        unit="%",
        title="CPU of this process",
        times=[p.at for p in series],
        width=460,
    )
    overview = await admin.system.overview()
    last_hour = params.window({}, default=SERIES_WINDOW)
    return await _page(
        "system.html",
        push_on=broker.ops.maintenance.enabled,
        pop_on=pop_on,
        p=render_admin.process(overview.process),
        pg=render_admin.postgres(await admin.database.stats()),
        ret=render_admin.retention(await admin.system.retention(last_hour)),
        cpu_chart=cpu,
        now=datetime.now(UTC),
    )

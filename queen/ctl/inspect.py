"""Read-only commands: ``status``, ``ping``, ``version``, ``lag``, ``traces``, ``metrics``."""

from __future__ import annotations

import time
from typing import Any

import click

from queen.ctl.client import CtlError, Exit, segment
from queen.ctl.options import Ctl, broker_command, group
from queen.ctl.output import emit_json, emit_pairs, seconds
from queen.ctl.views import partition_table, queue_row, queue_table

_PAGE = 1000


def _health(ctl: Ctl) -> dict[str, Any]:
    body = ctl.client.call("GET", "/health", accept=frozenset({503})).body
    return body if isinstance(body, dict) else {}


def _healthy(health: dict[str, Any]) -> bool:
    return health.get("status") == "healthy" and health.get("database") in (None, "", "connected")


def _unhealthy(ctl: Ctl, health: dict[str, Any]) -> CtlError:
    return CtlError(
        f"broker at {ctl.client.url} is not healthy: status={health.get('status', '?')} "
        f"database={health.get('database', '?')}",
        Exit.BROKER,
    )


def all_queues(ctl: Ctl, namespace: str | None, task: str | None) -> list[dict[str, Any]]:
    """Every queue of ``GET /api/v1/resources/queues``, page by page."""
    found: list[dict[str, Any]] = []
    while True:
        page = ctl.client.get(
            "/api/v1/resources/queues",
            {"namespace": namespace, "task": task, "limit": _PAGE, "offset": len(found)},
        )
        batch = page.get("queues", [])
        found.extend(batch)
        if not batch or len(found) >= page.get("total", 0):
            return found


@click.command()
@click.argument("queue", required=False)
@click.option("--namespace", default=None, help="only the queues of this namespace")
@click.option("--task", default=None, help="only the queues of this task")
@click.option("--partitions", "with_partitions", is_flag=True, help="with QUEUE: its partitions")
@broker_command
def status(
    ctl: Ctl,
    *,
    queue: str | None,
    namespace: str | None,
    task: str | None,
    with_partitions: bool,
) -> int:
    """The broker's health and figures; with QUEUE, that queue's depth and lag.

    Exits 2 when the broker answers but is not healthy (database unreachable, a background
    loop failing). With -o, the queues as rows (queue, namespace, task, pending,
    processing, completed, failed, dlq, partitions, lagSeconds), as queenctl prints them."""
    if queue is not None:
        detail = ctl.client.get(f"/api/v1/resources/queues/{segment(queue)}", {"limit": _PAGE})
        row = queue_row(detail)

        def one() -> None:
            queue_table(ctl, [row], lag=True)
            if with_partitions:
                click.echo()
                partition_table(ctl, detail.get("partitions", []))

        ctl.out.show(document=[row], rows=[row], table=one, broker=detail)
        return Exit.OK
    health = _health(ctl)
    if ctl.out.tables:
        _status_pairs(ctl, health, ctl.client.get("/api/v1/status"))
        if namespace is not None or task is not None:
            click.echo()
            queue_table(ctl, [queue_row(q) for q in all_queues(ctl, namespace, task)], lag=True)
    elif ctl.out.mode == "broker":
        emit_json({"health": health, "status": ctl.client.get("/api/v1/status")})
    else:
        rows = [queue_row(q) for q in all_queues(ctl, namespace, task)]
        ctl.out.render(rows, rows)
    if not _healthy(health):
        raise _unhealthy(ctl, health)
    return Exit.OK


def _status_pairs(ctl: Ctl, health: dict[str, Any], figures: dict[str, Any]) -> None:
    spool = health.get("spool") or {}
    messages = figures.get("messages", {})
    totals = figures.get("totals") or {}
    emit_pairs(
        [
            (
                "broker",
                f"{ctl.client.url} ({health.get('server', '?')} {health.get('version', '')})",
            ),
            ("status", health.get("status")),
            ("database", health.get("database")),
            ("push maintenance", health.get("maintenanceMode")),
            ("spool", f"{spool.get('pendingItems', 0)} items in {spool.get('files', 0)} files"),
            ("queues", f"{totals.get('queues', 0)} ({totals.get('partitions', 0)} partitions)"),
            (
                "messages",
                "since start: "  # the service's counters (GET /api/v1/status)
                + ", ".join(
                    f"{k} {messages.get(k, 0)}"
                    for k in ("total", "pending", "processing", "completed", "deadLetter")
                ),
            ),
            ("active leases", figures.get("leases", {}).get("active")),
            ("dead letters", figures.get("deadLetterQueue", {}).get("total")),
        ]
    )
    if spool.get("healthy") is False:
        click.echo(f"spool problem     {spool.get('problem') or 'not healthy'}")
    failing = [
        name for name, loop in (health.get("loops") or {}).items() if loop.get("state") != "ok"
    ]
    if failing:
        click.echo(f"failing loops     {', '.join(failing)}")


def _latency(elapsed_s: float) -> str:
    """As queenctl prints it (a Go duration rounded to the millisecond)."""
    if elapsed_s < 1:
        return f"{round(elapsed_s * 1000)}ms"
    return f"{elapsed_s:.3f}".rstrip("0").rstrip(".") + "s"


@click.command()
@broker_command(timeout_s=5.0)
def ping(ctl: Ctl) -> int:
    """Check the broker's health: exit 0 when it is healthy (database connected), 2 when it
    is not or does not answer (--timeout, 5 s by default)."""
    started = time.monotonic()
    health = _health(ctl)
    latency = _latency(time.monotonic() - started)
    if not _healthy(health):
        raise _unhealthy(ctl, health)
    row = {
        "status": health.get("status"),
        "database": health.get("database"),
        "version": health.get("version"),
        "latency": latency,
    }
    ctl.out.show(
        document=row,
        table=lambda: ctl.out.table(
            ["status", "database", "version", "latency"], [list(row.values())], empty=""
        ),
        broker=health,
    )
    return Exit.OK


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as of

    try:
        return of("queen-trio")
    except PackageNotFoundError:
        return "unknown"


@click.command()
@click.option("--short", is_flag=True, help="only this command's version; ask no broker")
@broker_command(timeout_s=5.0)
def version(ctl: Ctl, *, short: bool) -> int:
    """This command's version, then the broker's (version, status, database)."""
    click.echo(f"queen {package_version()}")
    if short:
        return Exit.OK
    health = _health(ctl)
    emit_pairs(
        [
            ("server", f"{health.get('server', '-')} {health.get('version', '-')}"),
            ("status", health.get("status")),
            ("database", health.get("database")),
            ("broker", ctl.client.url),
        ]
    )
    return Exit.OK


@click.command()
@click.option("--group", "--cg", "group_name", default=None, help="only this consumer group")
@click.option("--queue", "queue", default=None, help="only this queue")
@click.option("--min-lag", type=click.IntRange(min=0), default=0, help="hide partitions with less")
@click.option(
    "--min-seconds",
    type=click.IntRange(min=0),
    default=0,
    help="only partitions whose oldest unconsumed message is at least this old",
)
@broker_command
def lag(
    ctl: Ctl, *, group_name: str | None, queue: str | None, min_lag: int, min_seconds: int
) -> int:
    """Consumer lag per group and partition, the largest first.

    Lag is counted in messages (``offsetLag``: stored but not yet consumed by the group) and in
    seconds (the age of the oldest of them). Queue mode is the group ``__QUEUE_MODE__``. With
    -o, queenctl's rows: the groups (``GET /api/v1/consumer-groups``), or with --min-seconds
    the lagging partitions (``GET /api/v1/consumer-groups/lagging``)."""
    if not ctl.out.tables and ctl.out.mode != "broker":
        if min_seconds > 0:
            rows = ctl.client.get("/api/v1/consumer-groups/lagging", {"minLagSeconds": min_seconds})
        else:
            rows = ctl.client.get("/api/v1/consumer-groups")
        rows = [
            r
            for r in rows
            if (group_name is None or r.get("name") == group_name)
            and (queue is None or r.get("queueName") == queue)
            and (r.get("offsetLag", r.get("lagMessages")) or 0) >= min_lag
        ]
        ctl.out.render(rows, rows)
        return Exit.OK

    def shown(r: dict[str, Any]) -> bool:
        behind = r.get("offsetLag") or 0
        if behind < min_lag:
            return False
        return not min_seconds or (behind > 0 and (r.get("timeLagSeconds") or 0) >= min_seconds)

    rows = [r for r in partition_lag(ctl, group_name, queue) if shown(r)]
    if ctl.out.mode == "broker":
        emit_json(rows)
        return Exit.OK
    ctl.out.table(
        ["group", "queue", "partition", "lag", "time lag", "consumed", "next", "leased"],
        (
            [
                r["consumerGroup"],
                r["queue"],
                r.get("partition"),
                r.get("offsetLag"),
                seconds(r.get("timeLagSeconds")) if r.get("offsetLag") else "-",
                r.get("offset"),
                r.get("nextOffset"),
                r.get("leaseActive"),
            ]
            for r in rows
        ),
        empty="no consumer group lag to show",
    )
    return Exit.OK


def partition_lag(ctl: Ctl, group_name: str | None, queue: str | None) -> list[dict[str, Any]]:
    """Every partition row of every group (or ``group_name``), most behind first."""
    if group_name is not None:
        names = [group_name]
    else:
        listed = ctl.client.get("/api/v1/consumer-groups")
        names = sorted({g["name"] for g in listed if queue is None or g["queueName"] == queue})
    rows: list[dict[str, Any]] = []
    for name in names:
        for queue_name, partition in group_partitions(ctl, name):
            if queue is None or queue_name == queue:
                rows.append({"consumerGroup": name, "queue": queue_name, **partition})
    rows.sort(
        key=lambda r: (
            -r.get("offsetLag", 0),
            -(r.get("timeLagSeconds") or 0.0),
            r["consumerGroup"],
            r["queue"],
            r.get("partition", ""),
        )
    )
    return rows


def group_partitions(ctl: Ctl, name: str) -> list[tuple[str, dict[str, Any]]]:
    """Every (queue, partition figures) of group ``name``, page by page."""
    found: list[tuple[str, dict[str, Any]]] = []
    offset = 0
    while True:
        detail = ctl.client.get(
            f"/api/v1/consumer-groups/{segment(name)}", {"limit": _PAGE, "offset": offset}
        )
        if not isinstance(detail, dict):
            raise CtlError(
                f"consumer group {name!r} cannot be looked up: "
                f"/api/v1/consumer-groups/{name} is another route",
                Exit.BROKER,
            )
        more = False
        for queue_name, entry in detail.items():
            page = entry.get("partitions", [])
            found.extend((queue_name, p) for p in page)
            more = more or offset + len(page) < entry.get("partitionCount", 0)
        if not more:
            return found
        offset += _PAGE


@group(aliases={"by-message": "message", "by-name": "name", "list": "names", "ls": "names"})
def traces() -> None:
    """Processing traces: of one message, by name, or the names in use."""


@traces.command("message")
@click.argument("partition_id")
@click.argument("transaction_id")
@broker_command
def traces_message(ctl: Ctl, *, partition_id: str, transaction_id: str) -> int:
    """The traces recorded for one message (PARTITION_ID as pops give it), oldest first."""
    page = ctl.client.get(f"/api/v1/traces/{segment(partition_id)}/{segment(transaction_id)}")
    return trace_page(ctl, page)


@traces.command("name")
@click.argument("name")
@click.option("--limit", type=click.IntRange(0, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def traces_name(ctl: Ctl, *, name: str, limit: int, offset: int) -> int:
    """The traces carrying NAME, oldest first."""
    page = ctl.client.get(
        f"/api/v1/traces/by-name/{segment(name)}", {"limit": limit or None, "offset": offset}
    )
    return trace_page(ctl, page)


@traces.command("names")
@click.option("--limit", type=click.IntRange(0, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def traces_names(ctl: Ctl, *, limit: int, offset: int) -> int:
    """The trace names in use, with their counts."""
    page = ctl.client.get("/api/v1/traces/names", {"limit": limit or None, "offset": offset})
    names = page.get("trace_names", [])
    ctl.out.show(
        document=page,
        rows=names,
        table=lambda: ctl.out.table(
            ["name", "traces", "messages", "last"],
            (
                [
                    n.get("trace_name"),
                    n.get("trace_count"),
                    n.get("message_count"),
                    n.get("last_seen"),
                ]
                for n in names
            ),
            empty="no trace names",
        ),
    )
    return Exit.OK


def trace_page(ctl: Ctl, page: Any) -> int:
    found = page.get("traces", [])
    ctl.out.show(
        document=page,
        rows=found,
        table=lambda: ctl.out.table(
            ["time", "group", "event", "names", "queue", "partition", "transaction id", "data"],
            (
                [
                    t.get("created_at"),
                    t.get("consumer_group"),
                    t.get("event_type"),
                    ",".join(t.get("trace_names") or []),
                    t.get("queue_name"),
                    t.get("partition_name"),
                    t.get("transaction_id"),
                    t.get("data"),
                ]
                for t in found
            ),
            empty="no traces",
        ),
    )
    return Exit.OK


@click.command()
@click.option("--prometheus", is_flag=True, help="print the Prometheus text as the broker gives it")
@broker_command
def metrics(ctl: Ctl, *, prometheus: bool) -> int:
    """The counters of the broker process that answers (``/metrics``)."""
    if prometheus:
        click.echo(ctl.client.get("/metrics").rstrip("\n"))
        return Exit.OK
    figures = ctl.client.get("/metrics", headers={"Accept": "application/json"})
    ctl.out.show(
        document=figures,
        table=lambda: emit_pairs(
            [
                ("process", figures.get("processId")),
                ("uptime", seconds(figures.get("uptime"))),
                ("rss bytes", figures.get("memory", {}).get("rss")),
                ("cpu seconds", figures.get("cpu", {}).get("seconds")),
                *sorted((figures.get("counters") or {}).items()),
            ]
        ),
    )
    return Exit.OK

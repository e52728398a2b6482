"""Read-only commands: ``status``, ``lag``, ``traces``, ``metrics``."""

from __future__ import annotations

from typing import Any

import click

from queen.ctl.client import CtlError, Exit, segment
from queen.ctl.options import Ctl, broker_command
from queen.ctl.output import emit_json, emit_pairs, emit_table, seconds


@click.command()
@broker_command
def status(ctl: Ctl) -> int:
    """The broker's health and its figures: database, maintenance, spool, queues, messages.

    Exits 0 when the broker reports itself healthy, 1 when it answers but is not (database
    unreachable, a background loop failing)."""
    health = ctl.client.call("GET", "/health", accept=frozenset({503})).body
    figures = ctl.client.get("/api/v1/status")
    healthy = isinstance(health, dict) and health.get("status") == "healthy"
    if ctl.json:
        emit_json({"health": health, "status": figures})
        return Exit.OK if healthy else Exit.FAILED
    health = health if isinstance(health, dict) else {}
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
                ", ".join(
                    f"{k} {messages.get(k, 0)}"
                    for k in ("total", "pending", "processing", "completed", "deadLetter")
                ),
            ),
            ("active leases", figures.get("leases", {}).get("active")),
            ("dead letters", figures.get("deadLetterQueue", {}).get("total")),
        ]
    )
    failing = [
        name for name, loop in (health.get("loops") or {}).items() if loop.get("state") != "ok"
    ]
    if failing:
        click.echo(f"failing loops     {', '.join(failing)}")
    return Exit.OK if healthy else Exit.FAILED


@click.command()
@click.option("--group", "group", default=None, help="only this consumer group")
@click.option("--queue", "queue", default=None, help="only this queue")
@click.option("--min-lag", type=click.IntRange(min=0), default=0, help="hide partitions with less")
@broker_command
def lag(ctl: Ctl, *, group: str | None, queue: str | None, min_lag: int) -> int:
    """Consumer lag per group and partition, the largest first.

    Lag is counted in messages (``offsetLag``: stored but not yet consumed by the group) and in
    seconds (the age of the oldest of them). Queue mode is the group ``__QUEUE_MODE__``."""
    if group is not None:
        names = [group]
    else:
        listed = ctl.client.get("/api/v1/consumer-groups")
        names = sorted({g["name"] for g in listed if queue is None or g["queueName"] == queue})
    rows: list[dict[str, Any]] = []
    for name in names:
        for queue_name, partition in _group_partitions(ctl, name):
            if queue is not None and queue_name != queue:
                continue
            if partition.get("offsetLag", 0) >= min_lag:
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
    if ctl.json:
        emit_json(rows)
        return Exit.OK
    emit_table(
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


_PAGE = 1000


def _group_partitions(ctl: Ctl, name: str) -> list[tuple[str, dict[str, Any]]]:
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
                Exit.FAILED,
            )
        more = False
        for queue_name, entry in detail.items():
            page = entry.get("partitions", [])
            found.extend((queue_name, p) for p in page)
            more = more or offset + len(page) < entry.get("partitionCount", 0)
        if not more:
            return found
        offset += _PAGE


@click.group()
def traces() -> None:
    """Processing traces: of one message, by name, or the names in use."""


@traces.command("message")
@click.argument("partition_id")
@click.argument("transaction_id")
@broker_command
def traces_message(ctl: Ctl, *, partition_id: str, transaction_id: str) -> int:
    """The traces recorded for one message (PARTITION_ID as pops give it), oldest first."""
    page = ctl.client.get(f"/api/v1/traces/{segment(partition_id)}/{segment(transaction_id)}")
    return _trace_page(ctl, page)


@traces.command("name")
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def traces_name(ctl: Ctl, *, name: str, limit: int, offset: int) -> int:
    """The traces carrying NAME, oldest first."""
    page = ctl.client.get(
        f"/api/v1/traces/by-name/{segment(name)}", {"limit": limit, "offset": offset}
    )
    return _trace_page(ctl, page)


@traces.command("names")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def traces_names(ctl: Ctl, *, limit: int, offset: int) -> int:
    """The trace names in use, with their counts."""
    page = ctl.client.get("/api/v1/traces/names", {"limit": limit, "offset": offset})
    if ctl.json:
        emit_json(page)
        return Exit.OK
    emit_table(
        ["name", "traces", "messages", "last"],
        (
            [n.get("trace_name"), n.get("trace_count"), n.get("message_count"), n.get("last_seen")]
            for n in page.get("trace_names", [])
        ),
        empty="no trace names",
    )
    return Exit.OK


def _trace_page(ctl: Ctl, page: Any) -> int:
    if ctl.json:
        emit_json(page)
        return Exit.OK
    emit_table(
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
            for t in page.get("traces", [])
        ),
        empty="no traces",
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
    if ctl.json:
        emit_json(figures)
        return Exit.OK
    emit_pairs(
        [
            ("process", figures.get("processId")),
            ("uptime", seconds(figures.get("uptime"))),
            ("rss bytes", figures.get("memory", {}).get("rss")),
            ("cpu seconds", figures.get("cpu", {}).get("seconds")),
            *sorted((figures.get("counters") or {}).items()),
        ]
    )
    return Exit.OK

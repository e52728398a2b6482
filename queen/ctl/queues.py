"""Commands that look at or change queues and a group's position: ``queues``, ``seek``."""

from __future__ import annotations

from typing import Any

import click

from queen.ctl.client import CtlError, Exit, segment, usage
from queen.ctl.options import Ctl, broker_command, confirm, json_value
from queen.ctl.output import emit_json, emit_pairs, emit_table, seconds


@click.group()
def queues() -> None:
    """List, describe, configure and delete queues."""


@queues.command("list")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def queues_list(ctl: Ctl, *, limit: int, offset: int) -> int:
    """The queues, by name, with their message counts."""
    page = ctl.client.get("/api/v1/resources/queues", {"limit": limit, "offset": offset})
    if ctl.json:
        emit_json(page)
        return Exit.OK
    emit_table(
        [
            "queue",
            "namespace",
            "task",
            "partitions",
            "total",
            "pending",
            "processing",
            "completed",
            "dead letter",
            "oldest pending",
        ],
        (
            [
                q["name"],
                q.get("namespace") or "-",
                q.get("task") or "-",
                q.get("partitions"),
                *(
                    q["messages"].get(k)
                    for k in ("total", "pending", "processing", "completed", "deadLetter")
                ),
                seconds(q.get("oldestPendingAgeSeconds")) if q.get("oldestPendingAt") else "-",
            ]
            for q in page.get("queues", [])
        ),
        empty="no queues",
    )
    total = page.get("total", 0)
    if total > offset + len(page.get("queues", [])):
        click.echo(f"({total} queues; more with --offset {offset + limit})")
    return Exit.OK


@queues.command("describe")
@click.argument("queue")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="partitions to show",
)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def queues_describe(ctl: Ctl, *, queue: str, limit: int, offset: int) -> int:
    """One queue: its options, totals and partitions (a missing queue exits 1)."""
    q = ctl.client.get(
        f"/api/v1/resources/queues/{segment(queue)}", {"limit": limit, "offset": offset}
    )
    if ctl.json:
        emit_json(q)
        return Exit.OK
    totals = q.get("totals", {})
    emit_pairs(
        [
            ("queue", q.get("name")),
            ("namespace / task", f"{q.get('namespace') or '-'} / {q.get('task') or '-'}"),
            ("created", q.get("createdAt")),
            ("partitions", q.get("partitionCount")),
            ("messages", ", ".join(f"{k} {v}" for k, v in totals.items())),
            ("segments", q.get("segments")),
            ("options", q.get("options")),
        ]
    )
    click.echo()
    emit_table(
        [
            "partition",
            "id",
            "total",
            "pending",
            "processing",
            "completed",
            "dead letter",
            "offsets low/next",
            "oldest pending",
            "lease until",
        ],
        (
            [
                p.get("name"),
                p.get("id"),
                *(
                    p["messages"].get(k)
                    for k in ("total", "pending", "processing", "completed", "deadLetter")
                ),
                f"{p['offsets'].get('low')}/{p['offsets'].get('next')}",
                seconds(p.get("oldestPendingAgeSeconds")) if p.get("oldestPendingAt") else "-",
                p.get("leaseExpiresAt"),
            ]
            for p in q.get("partitions", [])
        ),
        empty="no partitions",
    )
    return Exit.OK


@queues.command("configure")
@click.argument("queue")
@click.option("--namespace", default=None)
@click.option("--task", default=None)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="OPTION=VALUE",
    help="a queue option, e.g. leaseTime=60 (the value is read as JSON when it "
    "parses, else as text); repeat for several",
)
@click.option(
    "--options", "options_json", default=None, metavar="JSON", help="the options as one JSON object"
)
@broker_command
def queues_configure(
    ctl: Ctl,
    *,
    queue: str,
    namespace: str | None,
    task: str | None,
    settings: tuple[str, ...],
    options_json: str | None,
) -> int:
    """Create QUEUE or set its options. As with POST /api/v1/configure, an option not given
    goes back to its default."""
    options: dict[str, Any] = {}
    if options_json is not None:
        parsed = json_value(options_json, "--options")
        if not isinstance(parsed, dict):
            raise usage("--options must be a JSON object")
        options.update(parsed)
    for item in settings:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise usage(f"--set takes OPTION=VALUE, got {item!r}")
        try:
            options[key] = json_value(raw, key)
        except CtlError:
            options[key] = raw
    body: dict[str, Any] = {"queue": queue, "options": options}
    if namespace is not None:
        body["namespace"] = namespace
    if task is not None:
        body["task"] = task
    answer = ctl.client.post("/api/v1/configure", body)
    if ctl.json:
        emit_json(answer)
        return Exit.OK
    click.echo(f"configured {answer.get('queue')}")
    emit_pairs(sorted((answer.get("options") or {}).items()))
    if answer.get("warning"):
        click.echo(f"warning: {answer['warning']}")
    return Exit.OK


@queues.command("delete")
@click.argument("queue")
@click.option("--yes", is_flag=True, help="do not ask for a confirmation")
@broker_command
def queues_delete(ctl: Ctl, *, queue: str, yes: bool) -> int:
    """Delete QUEUE with its partitions, messages, groups' positions and dead letters.
    Exits 1 when there was no such queue."""
    confirm(yes, f"delete queue {queue!r} and every message in it")
    answer = ctl.client.delete(f"/api/v1/resources/queues/{segment(queue)}")
    if ctl.json:
        emit_json(answer)
    else:
        click.echo(f"deleted queue {queue}" if answer.get("existed") else f"no queue {queue}")
    return Exit.OK if answer.get("existed") else Exit.FAILED


@click.command()
@click.argument("group")
@click.argument("queue")
@click.option(
    "--to",
    "timestamp",
    default=None,
    metavar="ISO-8601",
    help="re-read what was stored from this time on",
)
@click.option("--to-end", is_flag=True, help="skip everything stored so far")
@click.option("--partition", default=None, help="only this partition (default: every one)")
@broker_command
def seek(
    ctl: Ctl, *, group: str, queue: str, timestamp: str | None, to_end: bool, partition: str | None
) -> int:
    """Move consumer GROUP's position on QUEUE (its leases there are released)."""
    if (timestamp is None) == (not to_end):
        raise usage("give exactly one of --to TIMESTAMP and --to-end")
    body = {"toEnd": True} if to_end else {"timestamp": timestamp}
    path = f"/api/v1/consumer-groups/{segment(group)}/queues/{segment(queue)}"
    if partition is not None:
        path += f"/partitions/{segment(partition)}"
    answer = ctl.client.post(path + "/seek", body)
    if ctl.json:
        emit_json(answer)
        return Exit.OK
    where = "the end" if to_end else answer.get("targetTimestamp")
    click.echo(f"moved {group} on {queue} to {where}: {answer.get('partitionsUpdated')} partitions")
    return Exit.OK

"""Commands that look at or change queues and groups: ``queues``, ``seek``, ``dlq``,
``maintenance``."""

from __future__ import annotations

import sys
from typing import Any

import click

from queen.ctl.client import CtlError, Exit, segment, usage
from queen.ctl.options import Ctl, broker_command, json_value
from queen.ctl.output import emit_json, emit_pairs, emit_table, seconds


def _confirm(yes: bool, what: str) -> None:
    """Destructive commands need ``--yes``, or a ``y`` typed at a terminal."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise usage(f"refusing to {what} without --yes")
    if not click.confirm(f"{what}?", default=False):
        raise CtlError("not confirmed; nothing changed", Exit.FAILED)


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
    _confirm(yes, f"delete queue {queue!r} and every message in it")
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


@click.group()
def dlq() -> None:
    """Dead letters: list them, retry them, delete them."""


@dlq.command("list")
@click.option("--queue", default=None)
@click.option("--group", "group", default=None, help="consumer group (__QUEUE_MODE__ too)")
@click.option("--partition", default=None)
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def dlq_list(
    ctl: Ctl,
    *,
    queue: str | None,
    group: str | None,
    partition: str | None,
    limit: int,
    offset: int,
) -> int:
    """Dead-lettered messages, newest first."""
    page = ctl.client.get(
        "/api/v1/dlq",
        {
            "queue": queue,
            "consumerGroup": group,
            "partition": partition,
            "limit": limit,
            "offset": offset,
        },
    )
    if ctl.json:
        emit_json(page)
        return Exit.OK
    emit_table(
        [
            "failed at",
            "queue",
            "partition",
            "group",
            "partition id",
            "transaction id",
            "retries",
            "error",
        ],
        (
            [
                m.get("failedAt"),
                m.get("queue"),
                m.get("partition"),
                m.get("consumerGroup"),
                m.get("partitionId"),
                m.get("transactionId"),
                m.get("retryCount"),
                m.get("errorMessage"),
            ]
            for m in page.get("messages", [])
        ),
        empty="no dead letters",
    )
    return Exit.OK


@dlq.command("retry")
@click.argument("partition_id", required=False)
@click.argument("transaction_id", required=False)
@click.option("--queue", default=None, help="retry every dead letter of this queue")
@click.option("--group", "group", default=None, help="with --queue: of this group only")
@click.option("--partition", default=None, help="with --queue: of this partition only")
@broker_command
def dlq_retry(
    ctl: Ctl,
    *,
    partition_id: str | None,
    transaction_id: str | None,
    queue: str | None,
    group: str | None,
    partition: str | None,
) -> int:
    """Deliver dead letters again: one message (PARTITION_ID TRANSACTION_ID), or all of a
    queue (--queue, narrowed by --group and --partition). Exits 1 when nothing was retried."""
    if queue is None:
        if partition_id is None or transaction_id is None or group or partition:
            raise usage("give PARTITION_ID TRANSACTION_ID, or --queue [--group] [--partition]")
        answer = ctl.client.post(
            f"/api/v1/messages/{segment(partition_id)}/{segment(transaction_id)}/retry"
        )
        done = answer.get("retried") is True
        text = f"retried {transaction_id}" if done else f"{transaction_id} was not retried"
    else:
        if partition_id is not None:
            raise usage("give either PARTITION_ID TRANSACTION_ID or --queue, not both")
        body: dict[str, Any] = {"queue": queue}
        if group is not None:
            body["consumerGroup"] = group
        if partition is not None:
            body["partition"] = partition
        answer = ctl.client.post("/api/v1/dlq/retry", body)
        count = answer.get("retried", 0)
        done = isinstance(count, int) and count > 0
        text = f"retried {count} dead letters of {queue}"
    if ctl.json:
        emit_json(answer)
    else:
        click.echo(text)
    return Exit.OK if done else Exit.FAILED


@dlq.command("delete")
@click.argument("partition_id")
@click.argument("transaction_id")
@click.option("--yes", is_flag=True, help="do not ask for a confirmation")
@broker_command
def dlq_delete(ctl: Ctl, *, partition_id: str, transaction_id: str, yes: bool) -> int:
    """Delete a message (and its dead letters) for good. A message under a live lease is
    refused (exit 1)."""
    _confirm(yes, f"delete message {transaction_id} of partition {partition_id}")
    answer = ctl.client.delete(
        f"/api/v1/messages/{segment(partition_id)}/{segment(transaction_id)}"
    )
    if ctl.json:
        emit_json(answer)
    else:
        click.echo(f"deleted {transaction_id}")
    return Exit.OK


_SWITCHES = {
    "push": ("/api/v1/system/maintenance", "maintenanceMode"),
    "pop": ("/api/v1/system/maintenance/pop", "popMaintenanceMode"),
}


def _which(pop: bool, both: bool) -> list[str]:
    if pop and both:
        raise usage("give --pop or --both, not both")
    return ["push", "pop"] if both else ["pop"] if pop else ["push"]


@click.group()
def maintenance() -> None:
    """Maintenance mode: push (pushes go to the spool) and pop (every pop answers empty)."""


@maintenance.command("status")
@broker_command
def maintenance_status(ctl: Ctl) -> int:
    """Both switches (needs the admin role)."""
    answers = {name: ctl.client.get(path) for name, (path, _) in _SWITCHES.items()}
    if ctl.json:
        emit_json(answers)
        return Exit.OK
    emit_pairs(
        [
            (f"{name} maintenance", "on" if answers[name].get(key) else "off")
            for name, (_, key) in _SWITCHES.items()
        ]
    )
    buffered = answers["push"].get("bufferedMessages")
    if buffered:
        click.echo(f"spooled items     {buffered}")
    return Exit.OK


def _switch(ctl: Ctl, names: list[str], enabled: bool) -> int:
    answers = {name: ctl.client.post(_SWITCHES[name][0], {"enabled": enabled}) for name in names}
    if ctl.json:
        emit_json(answers)
        return Exit.OK
    for name in names:
        state = answers[name].get(_SWITCHES[name][1])
        click.echo(f"{name} maintenance {'on' if state else 'off'}")
    return Exit.OK


@maintenance.command("on")
@click.option("--pop", is_flag=True, help="the pop switch instead of the push switch")
@click.option("--both", is_flag=True, help="push and pop")
@broker_command
def maintenance_on(ctl: Ctl, *, pop: bool, both: bool) -> int:
    """Turn maintenance on (push by default) in every broker process."""
    return _switch(ctl, _which(pop, both), True)


@maintenance.command("off")
@click.option("--pop", is_flag=True, help="the pop switch instead of the push switch")
@click.option("--both", is_flag=True, help="push and pop")
@broker_command
def maintenance_off(ctl: Ctl, *, pop: bool, both: bool) -> int:
    """Turn maintenance off (push by default)."""
    return _switch(ctl, _which(pop, both), False)

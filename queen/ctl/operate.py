"""Operator actions: dead letters (``dlq``) and the maintenance switches (``maintenance``)."""

from __future__ import annotations

from typing import Any

import click

from queen.ctl.client import Exit, segment, usage
from queen.ctl.options import Ctl, broker_command, confirm
from queen.ctl.output import emit_json, emit_pairs, emit_table


@click.group()
def dlq() -> None:
    """Dead letters: list them, retry them, delete them."""


@dlq.command("list")
@click.option("--queue", default=None)
@click.option("--group", "group", default=None, help="consumer group (__QUEUE_MODE__ too)")
@click.option("--partition", default=None)
@click.option("--from", "since", default=None, metavar="ISO-8601", help="failed at or after")
@click.option("--to", "until", default=None, metavar="ISO-8601", help="failed at or before")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def dlq_list(
    ctl: Ctl,
    *,
    queue: str | None,
    group: str | None,
    partition: str | None,
    since: str | None,
    until: str | None,
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
            "from": since,
            "to": until,
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
@click.option(
    "--from", "since", default=None, metavar="ISO-8601", help="with --queue: failed at or after"
)
@click.option(
    "--to", "until", default=None, metavar="ISO-8601", help="with --queue: failed at or before"
)
@broker_command
def dlq_retry(
    ctl: Ctl,
    *,
    partition_id: str | None,
    transaction_id: str | None,
    queue: str | None,
    group: str | None,
    partition: str | None,
    since: str | None,
    until: str | None,
) -> int:
    """Deliver dead letters again: one message (PARTITION_ID TRANSACTION_ID), or all of a
    queue (--queue, narrowed by --group, --partition, --from and --to). Exits 1 when nothing
    was retried."""
    if queue is None:
        filters = (group, partition, since, until)
        if partition_id is None or transaction_id is None or any(f is not None for f in filters):
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
        if since is not None:
            body["from"] = since
        if until is not None:
            body["to"] = until
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
    confirm(yes, f"delete message {transaction_id} of partition {partition_id}")
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

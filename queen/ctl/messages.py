"""Stored messages (``messages``, queenctl's ``messages``/``msg``) and consumer groups
(``groups``, queenctl's ``cg``)."""

from __future__ import annotations

import click

from queen.ctl.client import Exit, segment
from queen.ctl.inspect import lag, traces_message
from queen.ctl.options import Ctl, broker_command, confirm, group
from queen.ctl.output import emit_pairs
from queen.ctl.queues import LIST_ALIASES, seek
from queen.ctl.views import message_table


@group(aliases={"ls": "list", "describe": "get", "show": "get", "rm": "delete"})
def messages() -> None:
    """Stored messages: list them, show one, delete one, its traces."""


@messages.command("list")
@click.option("--queue", default=None)
@click.option("--partition", default=None)
@click.option(
    "--status",
    default=None,
    help="pending, processing, completed or dead_letter (dlq)",
)
@click.option(
    "--group", "--cg", "group_name", default=None, help="as this consumer group sees them"
)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def messages_list(
    ctl: Ctl,
    *,
    queue: str | None,
    partition: str | None,
    status: str | None,
    group_name: str | None,
    limit: int,
    offset: int,
) -> int:
    """Stored messages, newest first (``GET /api/v1/messages``)."""
    page = ctl.client.get(
        "/api/v1/messages",
        {
            "queue": queue,
            "partition": partition,
            "status": status,
            "consumerGroup": group_name,
            "limit": limit,
            "offset": offset,
        },
    )
    found = page.get("messages", [])
    ctl.out.show(document=page, rows=found, table=lambda: message_table(ctl, found))
    return Exit.OK


@messages.command("get")
@click.argument("partition_id")
@click.argument("transaction_id")
@broker_command
def messages_get(ctl: Ctl, *, partition_id: str, transaction_id: str) -> int:
    """One message with its payload and its state in every group (a missing one exits 2)."""
    m = ctl.client.get(f"/api/v1/messages/{segment(partition_id)}/{segment(transaction_id)}")
    ctl.out.show(document=m, table=lambda: emit_pairs(sorted(m.items())))
    return Exit.OK


@messages.command("delete")
@click.argument("partition_id")
@click.argument("transaction_id")
@click.option("--yes", is_flag=True, help="do not ask for a confirmation")
@broker_command
def messages_delete(ctl: Ctl, *, partition_id: str, transaction_id: str, yes: bool) -> int:
    """Delete a message (and its dead letters) for good. A message under a live lease is
    refused (exit 2), a missing one too."""
    confirm(yes, f"delete message {transaction_id} of partition {partition_id}")
    answer = ctl.client.delete(
        f"/api/v1/messages/{segment(partition_id)}/{segment(transaction_id)}"
    )
    ctl.out.done(f"deleted {transaction_id}", answer)
    return Exit.OK


messages.add_command(traces_message, "traces")


@group(
    aliases={
        **LIST_ALIASES,
        "get": "describe",
        "refresh": "refresh-stats",
    }
)
def groups() -> None:
    """Consumer groups: list, describe, lag, seek, delete."""


@groups.command("list")
@broker_command
def groups_list(ctl: Ctl) -> int:
    """Every consumer group on every queue, with its lag (``GET /api/v1/consumer-groups``)."""
    found = ctl.client.get("/api/v1/consumer-groups")
    ctl.out.show(
        document=found,
        rows=found,
        table=lambda: ctl.out.table(
            [
                "group",
                "queue",
                "partitions",
                "lag",
                "oldest unconsumed",
                "state",
                "subscription",
                "last consumed",
            ],
            (
                [
                    g.get("name"),
                    g.get("queueName"),
                    g.get("partitions"),
                    g.get("lagMessages"),
                    g.get("oldestPendingAt"),
                    g.get("state"),
                    g.get("subscriptionMode"),
                    g.get("lastConsumedAt"),
                ]
                for g in found
            ),
            empty="no consumer groups",
        ),
    )
    return Exit.OK


@groups.command("describe")
@click.argument("name")
@broker_command
def groups_describe(ctl: Ctl, *, name: str) -> int:
    """One group on each of its queues, with its partitions (a missing one exits 2)."""
    detail = ctl.client.get(f"/api/v1/consumer-groups/{segment(name)}", {"limit": 1000})

    def table() -> None:
        for queue, g in detail.items():
            emit_pairs(
                [
                    ("group", f"{name} on {queue}"),
                    ("state", g.get("state")),
                    ("lag", f"{g.get('lagMessages')} messages"),
                    ("subscription", g.get("subscriptionMode")),
                    ("last consumed", g.get("lastConsumedAt")),
                ]
            )
            ctl.out.table(
                ["partition", "id", "lag", "consumed", "next", "leased", "lease until"],
                (
                    [
                        p.get("partition"),
                        p.get("partitionId"),
                        p.get("offsetLag"),
                        p.get("offset"),
                        p.get("nextOffset"),
                        p.get("leaseActive"),
                        p.get("leaseExpiresAt"),
                    ]
                    for p in g.get("partitions", [])
                ),
                empty="no partitions",
            )
            click.echo()

    ctl.out.show(document=detail, table=table)
    return Exit.OK


@groups.command("delete")
@click.argument("name")
@click.option("--queue", default=None, help="only its state on this queue")
@click.option(
    "--metadata/--keep-metadata",
    default=False,
    help="also delete its subscription record (queenctl's --metadata) [default: keep it]",
)
@click.option("--yes", is_flag=True, help="do not ask for a confirmation")
@broker_command
def groups_delete(ctl: Ctl, *, name: str, queue: str | None, metadata: bool, yes: bool) -> int:
    """Delete a consumer group's positions (on every queue, or on --queue). Exits 4 when it
    had none there."""
    confirm(yes, f"delete consumer group {name!r}" + (f" on {queue!r}" if queue else ""))
    path = f"/api/v1/consumer-groups/{segment(name)}"
    if queue is not None:
        path += f"/queues/{segment(queue)}"
    answer = ctl.client.delete(path, {"deleteMetadata": metadata})
    gone = answer.get("deletedPartitions") or 0
    where = f" on {queue}" if queue else ""
    if gone or answer.get("metadataDeleted"):
        ctl.out.done(f"deleted cg={name}{where}: {gone} partitions", answer)
        return Exit.OK
    ctl.out.done(f"consumer group {name} had no position{where}: nothing deleted", answer)
    return Exit.EMPTY


@groups.command("refresh-stats")
@broker_command
def groups_refresh(ctl: Ctl) -> int:
    """Recompute the statistics (``POST /api/v1/stats/refresh``)."""
    answer = ctl.client.post("/api/v1/stats/refresh")
    ctl.out.done("refreshed", answer)
    return Exit.OK


groups.add_command(seek, "seek")
groups.add_command(lag, "lag")

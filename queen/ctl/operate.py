"""Operator actions: dead letters (``dlq``) and the maintenance switches (``maintenance``)."""

from __future__ import annotations

from typing import Any

import click

from queen.ctl.client import CtlError, Exit, segment, usage
from queen.ctl.messages import messages_delete, messages_get
from queen.ctl.options import Ctl, broker_command, confirm, group
from queen.ctl.output import emit_pairs
from queen.ctl.times import iso_moment


@group(aliases={"ls": "list", "get": "describe", "requeue": "retry", "rm": "delete"})
def dlq() -> None:
    """Dead letters: list them, look at one, retry them, delete them, drain them."""


def _filters(
    queue: str | None,
    group_name: str | None,
    partition: str | None,
    since: str | None,
    until: str | None,
) -> dict[str, Any]:
    return {
        "queue": queue,
        "consumerGroup": group_name,
        "partition": partition,
        "from": iso_moment(since, "--from") if since else None,
        "to": iso_moment(until, "--to") if until else None,
    }


_dlq_filters = (
    click.option("--queue", default=None),
    click.option(
        "--group", "--cg", "group_name", default=None, help="consumer group (__QUEUE_MODE__ too)"
    ),
    click.option("--partition", default=None),
    click.option(
        "--from",
        "since",
        default=None,
        metavar="TIME",
        help="failed at or after (ISO-8601, a date, '2h ago')",
    ),
    click.option("--to", "until", default=None, metavar="TIME", help="failed at or before"),
)


def dlq_filters(f: Any) -> Any:
    for option in reversed(_dlq_filters):
        f = option(f)
    return f


@dlq.command("list")
@dlq_filters
@click.option("--limit", type=click.IntRange(0, 10_000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def dlq_list(
    ctl: Ctl,
    *,
    queue: str | None,
    group_name: str | None,
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
            **_filters(queue, group_name, partition, since, until),
            "limit": limit or 100,
            "offset": offset,
        },
    )
    found = page.get("messages", [])
    ctl.out.show(document=page, rows=found, table=lambda: _dlq_table(ctl, found))
    return Exit.OK


def _dlq_table(ctl: Ctl, found: list[dict[str, Any]]) -> None:
    ctl.out.table(
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
            for m in found
        ),
        empty="no dead letters",
    )


dlq.add_command(messages_get, "describe")


@dlq.command("retry")
@click.argument("partition_id", required=False)
@click.argument("transaction_id", required=False)
@dlq_filters
@broker_command
def dlq_retry(
    ctl: Ctl,
    *,
    partition_id: str | None,
    transaction_id: str | None,
    queue: str | None,
    group_name: str | None,
    partition: str | None,
    since: str | None,
    until: str | None,
) -> int:
    """Deliver dead letters again: one message (PARTITION_ID TRANSACTION_ID), or all of a
    queue (--queue, narrowed by --group, --partition, --from and --to). Exits 4 when nothing
    was retried."""
    if queue is None:
        filters = (group_name, partition, since, until)
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
        body = {
            k: v
            for k, v in _filters(queue, group_name, partition, since, until).items()
            if v is not None
        }
        answer = ctl.client.post("/api/v1/dlq/retry", body)
        count = answer.get("retried", 0)
        done = isinstance(count, int) and count > 0
        text = f"retried {count} dead letters of {queue}"
    ctl.out.done(text, answer)
    return Exit.OK if done else Exit.EMPTY


dlq.add_command(messages_delete, "delete")


@dlq.command("drain")
@dlq_filters
@click.option("--limit", type=click.IntRange(0, 10_000), default=200, help="page size")
@click.option("--offset", type=click.IntRange(min=0), default=0, hidden=True)
@click.option("--dry-run", is_flag=True, help="list what would be deleted, delete nothing")
@click.option("--yes", is_flag=True, help="do not ask for a confirmation")
@broker_command
def dlq_drain(
    ctl: Ctl,
    *,
    queue: str | None,
    group_name: str | None,
    partition: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    offset: int,
    dry_run: bool,
    yes: bool,
) -> int:
    """Delete every dead letter the filters match, for good (each message with
    ``DELETE /api/v1/messages/{partitionId}/{transactionId}``). ``--dry-run`` lists them
    instead. Prints ``processed=N errors=N``; exits 4 when none matched, 2 when one could not
    be deleted (e.g. leased meanwhile)."""
    if not dry_run:
        confirm(yes, "delete every dead letter the filters match")
    filters = _filters(queue, group_name, partition, since, until)
    page_size = limit or 200
    seen: set[tuple[str, str]] = set()
    processed = errors = 0
    skip = offset
    while True:
        page = ctl.client.get("/api/v1/dlq", {**filters, "limit": page_size, "offset": skip})
        found = page.get("messages", [])
        fresh = 0
        for m in found:
            key = (str(m.get("partitionId")), str(m.get("transactionId")))
            if key in seen:
                continue
            seen.add(key)
            fresh += 1
            if dry_run:
                click.echo(f"[dry-run] delete {key[0]} {key[1]}")
                processed += 1
                continue
            try:
                ctl.client.delete(f"/api/v1/messages/{segment(key[0])}/{segment(key[1])}")
                processed += 1
            except CtlError as exc:
                if exc.code != Exit.BROKER:
                    raise
                errors += 1
                click.echo(f"error: {key[0]}/{key[1]}: {exc.message}", err=True)
        if len(found) < page_size or not fresh:
            break
        # what was deleted left the list: the next page starts where the errors are
        skip = offset + errors if not dry_run else skip + page_size
    ctl.out.say(f"processed={processed} errors={errors}")
    if errors:
        return Exit.BROKER
    return Exit.OK if processed else Exit.EMPTY


_SWITCHES = {
    "push": ("/api/v1/system/maintenance", "maintenanceMode"),
    "pop": ("/api/v1/system/maintenance/pop", "popMaintenanceMode"),
}


def _which(pop: bool, both: bool) -> list[str]:
    if pop and both:
        raise usage("give --pop or --both, not both")
    return ["push", "pop"] if both else ["pop"] if pop else ["push"]


@group(aliases={"get": "status"})
def maintenance() -> None:
    """Maintenance mode: push (pushes go to the spool) and pop (every pop answers empty)."""


@maintenance.command("status")
@click.option("--pop", is_flag=True, help="only the pop switch (queenctl's get --pop)")
@broker_command
def maintenance_status(ctl: Ctl, *, pop: bool) -> int:
    """Both switches (needs the admin role). With -o, the push switch's answer (``GET
    /api/v1/system/maintenance``), or with --pop the pop switch's, as queenctl prints it."""
    names = ["pop"] if pop else list(_SWITCHES)
    answers = {name: ctl.client.get(_SWITCHES[name][0]) for name in names}

    def table() -> None:
        emit_pairs(
            [
                (f"{name} maintenance", "on" if answers[name].get(_SWITCHES[name][1]) else "off")
                for name in names
            ]
        )
        buffered = answers.get("push", {}).get("bufferedMessages")
        if buffered:
            click.echo(f"spooled items     {buffered}")

    ctl.out.show(document=answers[names[0]], table=table, broker=answers)
    return Exit.OK


def _switch(ctl: Ctl, names: list[str], enabled: bool) -> int:
    answers = {name: ctl.client.post(_SWITCHES[name][0], {"enabled": enabled}) for name in names}
    lines = [
        f"{name} maintenance {'on' if answers[name].get(_SWITCHES[name][1]) else 'off'}"
        for name in names
    ]
    ctl.out.done("\n".join(lines), answers)
    return Exit.OK


_switch_options = (
    click.option("--pop", is_flag=True, help="the pop switch instead of the push switch"),
    click.option("--both", is_flag=True, help="push and pop"),
    click.option("--yes", is_flag=True, hidden=True, help="(queenctl asks for it; not needed)"),
)


def switch_options(f: Any) -> Any:
    for option in reversed(_switch_options):
        f = option(f)
    return f


@maintenance.command("on")
@switch_options
@broker_command
def maintenance_on(ctl: Ctl, *, pop: bool, both: bool, yes: bool) -> int:
    """Turn maintenance on (push by default) in every broker process."""
    return _switch(ctl, _which(pop, both), True)


@maintenance.command("off")
@switch_options
@broker_command
def maintenance_off(ctl: Ctl, *, pop: bool, both: bool, yes: bool) -> int:
    """Turn maintenance off (push by default)."""
    return _switch(ctl, _which(pop, both), False)

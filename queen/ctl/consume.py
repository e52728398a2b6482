"""Commands that consume: ``pop``, ``tail``, ``ack``.

Messages are printed as JSON lines, one message per line as the broker delivers it (with its
``partitionId``, ``transactionId``, ``leaseId`` and ``consumerGroup``), so ``queen pop q |
queen ack`` acknowledges what was popped. Acknowledgments read from input are checked whole
before any is sent.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from queen.ctl.client import CtlError, Exit, segment, usage
from queen.ctl.options import Ctl, broker_command, read_values
from queen.ctl.output import emit_json, emit_line, emit_table

QUEUE_MODE = "__QUEUE_MODE__"
MAX_WAIT_S = 3600  # the broker's long-poll limit (MAX_TIMEOUT_MS)


def _pop_path(queue: str, partition: str | None) -> str:
    path = f"/api/v1/pop/queue/{segment(queue)}"
    return path + f"/partition/{segment(partition)}" if partition is not None else path


def _pop(
    ctl: Ctl, path: str, *, group: str | None, batch: int, wait_s: float, subscription: str | None
) -> list[dict[str, Any]]:
    params: dict[str, Any] = {
        "batch": batch,
        "consumerGroup": group,
        "subscriptionMode": subscription,
    }
    if wait_s > 0:
        params.update(wait=True, timeout=int(wait_s * 1000))
    answer = ctl.client.call("GET", path, params=params, wait_s=wait_s)
    if answer.body is None:
        return []
    messages: list[dict[str, Any]] = answer.body.get("messages", [])
    return messages


def _ack(
    ctl: Ctl, messages: list[dict[str, Any]], status: str = "completed", error: str | None = None
) -> list[dict[str, Any]]:
    """Acknowledge ``messages`` (one request per consumer group); the broker's answers."""
    by_group: dict[str | None, list[dict[str, Any]]] = {}
    for m in messages:
        group = m.get("consumerGroup")
        by_group.setdefault(None if group in (None, QUEUE_MODE) else group, []).append(m)
    answers: list[dict[str, Any]] = []
    for group, members in by_group.items():
        acks = [
            {
                "transactionId": m.get("transactionId"),
                "partitionId": m.get("partitionId"),
                "leaseId": m.get("leaseId"),
                "status": status,
                "error": error,
            }
            for m in members
        ]
        answers.extend(
            ctl.client.post("/api/v1/ack/batch", {"acknowledgments": acks, "consumerGroup": group})
        )
    return answers


def _refused(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in answers if not a.get("success")]


_consume_options = (
    click.option("--partition", default=None, help="only this partition"),
    click.option(
        "--group",
        "group",
        default=None,
        help="consumer group (default: queue mode, one copy for all consumers)",
    ),
    click.option(
        "--subscription-mode",
        type=click.Choice(["all", "new"]),
        default=None,
        help="where a new consumer group starts",
    ),
    click.option(
        "--ack",
        "ack_them",
        is_flag=True,
        help="acknowledge (completed) each batch once it is printed",
    ),
)


def consume_options(f: Any) -> Any:
    for option in reversed(_consume_options):
        f = option(f)
    return f


@click.command()
@click.argument("queue")
@consume_options
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0, MAX_WAIT_S),
    default=0.0,
    help="seconds to wait for a message when none is there (default: do not wait)",
)
@broker_command
def pop(
    ctl: Ctl,
    *,
    queue: str,
    partition: str | None,
    group: str | None,
    subscription_mode: str | None,
    ack_them: bool,
    batch: int,
    wait_s: float,
) -> int:
    """Pop up to --batch messages from QUEUE and print them as JSON lines (nothing when there
    is none: exit 0). Without --ack the messages stay leased until acknowledged (queen ack)
    or until the lease runs out."""
    messages = _pop(
        ctl,
        _pop_path(queue, partition),
        group=group,
        batch=batch,
        wait_s=wait_s,
        subscription=subscription_mode,
    )
    for m in messages:
        emit_line(m)
    if ack_them and messages:
        refused = _refused(_ack(ctl, messages))
        if refused:
            raise CtlError(f"ack refused: {refused[0].get('error')}", Exit.FAILED)
    return Exit.OK


@click.command()
@click.argument("queue")
@consume_options
@click.option(
    "--batch", type=click.IntRange(min=1), default=100, show_default=True, help="messages per pop"
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="stop after this many messages"
)
@click.option(
    "--idle",
    "idle_s",
    type=click.FloatRange(min=0.1),
    default=None,
    help="stop after this many seconds without a message (default: follow)",
)
@broker_command
def tail(
    ctl: Ctl,
    *,
    queue: str,
    partition: str | None,
    group: str | None,
    subscription_mode: str | None,
    ack_them: bool,
    batch: int,
    limit: int | None,
    idle_s: float | None,
) -> int:
    """Follow QUEUE (or one consumer group of it) and print its messages as JSON lines, until
    Ctrl-C, --limit or --idle. With --ack each batch is acknowledged after it is printed;
    without it, popped partitions stay leased until their lease runs out."""
    path = _pop_path(queue, partition)
    seen = 0
    try:
        while limit is None or seen < limit:
            wait = 30.0 if idle_s is None else idle_s
            take = batch if limit is None else min(batch, limit - seen)
            messages = _pop(
                ctl, path, group=group, batch=take, wait_s=wait, subscription=subscription_mode
            )
            if not messages:
                if idle_s is not None:
                    break
                continue
            for m in messages:
                emit_line(m)
            sys.stdout.flush()
            seen += len(messages)
            if ack_them:
                refused = _refused(_ack(ctl, messages))
                if refused:
                    raise CtlError(f"ack refused: {refused[0].get('error')}", Exit.FAILED)
    except KeyboardInterrupt:
        pass
    return Exit.OK


@click.command()
@click.argument("partition_id", required=False)
@click.argument("transaction_id", required=False)
@click.argument("lease_id", required=False)
@click.option(
    "--status",
    type=click.Choice(["completed", "failed", "retry", "dlq"]),
    default="completed",
    show_default=True,
)
@click.option("--group", "group", default=None, help="consumer group (default: queue mode)")
@click.option("--error", default=None, help="why it failed (with failed or dlq)")
@click.option(
    "--file",
    "file",
    default=None,
    metavar="PATH",
    help="acknowledge the messages of PATH (- for stdin), as pop prints them",
)
@broker_command
def ack(
    ctl: Ctl,
    *,
    partition_id: str | None,
    transaction_id: str | None,
    lease_id: str | None,
    status: str,
    group: str | None,
    error: str | None,
    file: str | None,
) -> int:
    """Acknowledge one message (PARTITION_ID TRANSACTION_ID LEASE_ID, as pop prints them), or
    every message of --file or stdin (JSON lines, e.g. from queen pop). Exits 1 when the
    broker refused one (a stale or foreign lease)."""
    given = [v for v in (partition_id, transaction_id, lease_id) if v is not None]
    if given:
        if len(given) != 3 or file is not None:
            raise usage("give PARTITION_ID TRANSACTION_ID LEASE_ID, or messages on stdin/--file")
        messages = [
            {
                "partitionId": partition_id,
                "transactionId": transaction_id,
                "leaseId": lease_id,
                "consumerGroup": group,
            }
        ]
    else:
        messages = read_values((), file)
        for number, m in enumerate(messages, start=1):
            if not isinstance(m, dict) or not all(
                isinstance(m.get(k), str) for k in ("partitionId", "transactionId", "leaseId")
            ):
                raise usage(f"message {number} needs partitionId, transactionId and leaseId")
            if group is not None:
                m["consumerGroup"] = group
        if not messages:
            raise usage("nothing to acknowledge")
    answers = _ack(ctl, messages, status, error)
    refused = _refused(answers)
    if ctl.json:
        emit_json(answers)
    else:
        emit_table(
            ["transaction id", "acknowledged", "error"],
            ([a.get("transactionId"), a.get("success"), a.get("error")] for a in answers),
            empty="nothing acknowledged",
        )
    return Exit.FAILED if refused else Exit.OK

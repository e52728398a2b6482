"""Commands that consume: ``pop``, ``tail``, ``ack``, ``lease extend``.

Messages are printed as JSON lines, one message per line as the broker delivers it (with its
``partitionId``, ``transactionId``, ``leaseId`` and ``consumerGroup``), so ``queen pop q |
queen ack`` acknowledges what was popped. Acknowledgments read from input are checked whole
before any is sent.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from queen.ctl.client import CtlError, Exit, require_queue, segment, usage
from queen.ctl.options import Ctl, broker_command, group, read_values
from queen.ctl.output import emit_line
from queen.ctl.times import duration_s, iso_moment

QUEUE_MODE = "__QUEUE_MODE__"
TAIL_GROUP = "queenctl-tail"  # queenctl's own group for tail, so tail never takes from others
MAX_WAIT_S = 3600  # the broker's long-poll limit (MAX_TIMEOUT_MS)
QUEENCTL_WAIT_S = 10.0  # queenctl's pop --timeout default: how long a bare --wait waits


def _pop_path(queue: str | None, partition: str | None) -> str:
    if queue is None:
        return "/api/v1/pop"
    path = f"/api/v1/pop/queue/{segment(queue)}"
    return path + f"/partition/{segment(partition)}" if partition is not None else path


def _subscription_from(since: str | None) -> str | None:
    if since is None:
        return None
    return "now" if since.strip().lower() == "now" else iso_moment(since, "--since")


def _pop(
    ctl: Ctl,
    path: str,
    *,
    group_name: str | None,
    batch: int,
    wait_s: float,
    subscription: str | None = None,
    since: str | None = None,
    partitions: int | None = None,
    auto_ack: bool = False,
    namespace: str | None = None,
    task: str | None = None,
) -> list[dict[str, Any]]:
    params: dict[str, Any] = {
        "batch": batch,
        "consumerGroup": group_name,
        "subscriptionMode": subscription,
        "subscriptionFrom": _subscription_from(since),
        "partitions": partitions if partitions and partitions > 1 else None,
        "autoAck": True if auto_ack else None,
        "namespace": namespace,
        "task": task,
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
        name = m.get("consumerGroup")
        by_group.setdefault(None if name in (None, "", QUEUE_MODE) else name, []).append(m)
    answers: list[dict[str, Any]] = []
    for name, members in by_group.items():
        acks = [
            {
                "transactionId": m.get("transactionId"),
                "partitionId": m.get("partitionId"),
                "leaseId": m.get("leaseId") or None,
                "status": status,
                "error": error,
            }
            for m in members
        ]
        answers.extend(
            ctl.client.post("/api/v1/ack/batch", {"acknowledgments": acks, "consumerGroup": name})
        )
    return answers


def _refused(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in answers if not a.get("success")]


def _check_acks(answers: list[dict[str, Any]]) -> None:
    refused = _refused(answers)
    if refused:
        raise CtlError(
            f"ack refused for {len(refused)} of {len(answers)}: {refused[0].get('error')}",
            Exit.REFUSED,
        )


_consume_options = (
    click.option("--partition", default=None, help="only this partition"),
    click.option(
        "--subscription-mode",
        "--from-mode",
        "subscription_mode",
        type=click.Choice(["all", "new", "new-only"]),
        default=None,
        help="where a new consumer group starts",
    ),
    click.option(
        "--since",
        default=None,
        metavar="TIME",
        help="where a new consumer group starts: now, ISO-8601, '5m ago'",
    ),
    click.option(
        "--ack",
        "ack_them",
        is_flag=True,
        help="acknowledge (completed) each batch once it is printed",
    ),
    click.option(
        "--max-partitions",
        type=click.IntRange(1, 100),
        default=1,
        help="take up to N partitions in one pop",
    ),
)


def consume_options(f: Any) -> Any:
    for option in reversed(_consume_options):
        f = option(f)
    return f


def _wait_s(ctl: Ctl, wait: str | None) -> float:
    """``--wait``: seconds or a duration; bare or ``true``: as long as ``--timeout`` when it
    was given, else 10 s (queenctl's pop); ``false``: not at all."""
    if wait is None:
        return 0.0
    text = wait.strip().lower()
    if text in ("", "true", "yes"):
        return min(ctl.client.timeout_s if ctl.timeout_given else QUEENCTL_WAIT_S, MAX_WAIT_S)
    if text in ("false", "no"):
        return 0.0
    try:
        seconds = duration_s(text)
    except ValueError as exc:
        raise usage(f"--wait: {exc}") from None
    if not 0 <= seconds <= MAX_WAIT_S:
        raise usage(f"--wait must be between 0 and {MAX_WAIT_S} s")
    return seconds


@click.command()
@click.argument("queue", required=False)
@click.option(
    "--group",
    "--cg",
    "group_name",
    default=None,
    help="consumer group (default: queue mode, one copy for all consumers)",
)
@consume_options
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=None,
    help="messages to ask for [default: --limit, else 1]",
)
@click.option(
    "-n", "--limit", type=click.IntRange(min=1), default=None, help="print at most N messages"
)
@click.option(
    "--wait",
    "wait",
    is_flag=False,
    flag_value="true",
    default=None,
    metavar="[SECONDS]",
    help="wait for a message when none is there: this long (2.5, 500ms, 10s), or, given "
    "alone, as long as --timeout (default 10 s) [default: do not wait]",
)
@click.option(
    "--auto-ack",
    is_flag=True,
    help="the broker acknowledges them as it hands them out (no lease)",
)
@click.option("--namespace", default=None, help="without QUEUE: pop from this namespace's queues")
@click.option("--task", default=None, help="without QUEUE: pop from this task's queues")
@broker_command
def pop(
    ctl: Ctl,
    *,
    queue: str | None,
    partition: str | None,
    group_name: str | None,
    subscription_mode: str | None,
    since: str | None,
    ack_them: bool,
    max_partitions: int,
    batch: int | None,
    limit: int | None,
    wait: str | None,
    auto_ack: bool,
    namespace: str | None,
    task: str | None,
) -> int:
    """Pop up to --batch messages from QUEUE and print them as JSON lines. Nothing there:
    nothing printed, exit 4 (a queue that does not exist: exit 2). Without --ack or
    --auto-ack the messages stay leased until acknowledged (queen ack) or until the lease
    runs out."""
    if queue is None and namespace is None and task is None:
        raise usage("give QUEUE, or --namespace / --task")
    if queue is None and partition is not None:
        raise usage("--partition needs QUEUE")
    messages = _pop(
        ctl,
        _pop_path(queue, partition),
        group_name=group_name,
        batch=batch or limit or 1,
        wait_s=_wait_s(ctl, wait),
        subscription=subscription_mode,
        since=since,
        partitions=max_partitions,
        auto_ack=auto_ack,
        namespace=namespace if queue is None else None,
        task=task if queue is None else None,
    )
    if not messages:
        if queue is not None:  # the broker answers an unknown queue as an empty one
            require_queue(ctl, queue)
        return Exit.EMPTY
    shown = messages[:limit] if limit is not None else messages
    for m in shown:
        emit_line(m)
    if ack_them and not auto_ack:
        _check_acks(_ack(ctl, messages))
    return Exit.OK


@click.command()
@click.argument("queue")
@click.option(
    "--group",
    "--cg",
    "group_name",
    default=None,
    help=f"consumer group [default: {TAIL_GROUP}, a group of its own; {QUEUE_MODE}: queue mode]",
)
@consume_options
@click.option(
    "--from",
    "from_mode",
    type=click.Choice(["all", "new", "new-only"]),
    default=None,
    hidden=True,  # queenctl's name of --subscription-mode on tail
)
@click.option(
    "--auto-ack", "auto_ack", is_flag=True, hidden=True, help="queenctl's name of --ack on tail"
)
@click.option("-f", "--follow", is_flag=True, help="go on until Ctrl-C (or --limit, --idle)")
@click.option(
    "--batch", type=click.IntRange(min=1), default=100, show_default=True, help="messages per pop"
)
@click.option(
    "-n",
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="stop after this many messages [default without --follow: --batch]",
)
@click.option(
    "--idle",
    "idle_s",
    type=click.FloatRange(min=0.1),
    default=None,
    help="stop after this many seconds without a message",
)
@click.option("--idle-millis", type=click.IntRange(min=1), default=None, hidden=True)
@click.option("--concurrency", type=click.IntRange(min=0), default=None, hidden=True)
@broker_command
def tail(
    ctl: Ctl,
    *,
    queue: str,
    partition: str | None,
    group_name: str | None,
    subscription_mode: str | None,
    since: str | None,
    ack_them: bool,
    max_partitions: int,
    from_mode: str | None,
    auto_ack: bool,
    follow: bool,
    batch: int,
    limit: int | None,
    idle_s: float | None,
    idle_millis: int | None,
    concurrency: int | None,
) -> int:
    """Print QUEUE's messages as JSON lines, read in a consumer group (--group; by default
    queenctl's own, queenctl-tail, so no other consumer's messages are taken). Without
    --follow it stops after --batch messages (--limit N: after N); with --follow it goes on
    until Ctrl-C; --idle S stops after S seconds without a message. With --ack each batch
    is acknowledged after it is printed; without it, popped partitions stay leased (in the
    tail's group) until their lease runs out."""
    name = group_name or TAIL_GROUP
    subscription = subscription_mode or from_mode
    ack_them = ack_them or auto_ack
    if idle_s is None and idle_millis is not None:
        idle_s = idle_millis / 1000
    if limit is None and not follow:
        limit = batch
    path = _pop_path(queue, partition)
    seen = 0
    quiet_since = time.monotonic()
    try:
        while limit is None or seen < limit:
            wait = 30.0
            if idle_s is not None:
                wait = max(0.1, min(wait, idle_s - (time.monotonic() - quiet_since)))
            take = batch if limit is None else min(batch, limit - seen)
            messages = _pop(
                ctl,
                path,
                group_name=name,
                batch=take,
                wait_s=wait,
                subscription=subscription,
                since=since,
                partitions=max_partitions,
            )
            if not messages:
                if idle_s is not None and time.monotonic() - quiet_since >= idle_s:
                    break
                continue
            quiet_since = time.monotonic()
            for m in messages:
                emit_line(m)
            sys.stdout.flush()
            seen += len(messages)
            if ack_them:
                _check_acks(_ack(ctl, messages))
    except KeyboardInterrupt:
        pass
    return Exit.OK


@click.command()
@click.argument("ids", nargs=-1, metavar="[PARTITION_ID TRANSACTION_ID LEASE_ID | TRANSACTION_ID]")
@click.option(
    "--status",
    type=click.Choice(["completed", "failed", "retry", "dlq"]),
    default=None,
    help="[default: completed]",
)
@click.option("--failed", is_flag=True, help="the same as --status failed (queenctl)")
@click.option(
    "--group", "--cg", "group_name", default=None, help="consumer group (default: queue mode)"
)
@click.option("--error", default=None, help="why it failed (with failed or dlq)")
@click.option(
    "--file",
    "--batch",
    "file",
    default=None,
    metavar="PATH",
    help="acknowledge the messages of PATH (- for stdin), as pop prints them",
)
@click.option("--partition-id", default=None, help="with one TRANSACTION_ID (queenctl)")
@click.option("--lease-id", default=None, help="with one TRANSACTION_ID (queenctl)")
@broker_command
def ack(
    ctl: Ctl,
    *,
    ids: tuple[str, ...],
    status: str | None,
    failed: bool,
    group_name: str | None,
    error: str | None,
    file: str | None,
    partition_id: str | None,
    lease_id: str | None,
) -> int:
    """Acknowledge one message (PARTITION_ID TRANSACTION_ID LEASE_ID as pop prints them, or
    queenctl's TRANSACTION_ID --partition-id P --lease-id L), or every message of --file or
    stdin (JSON lines, e.g. from queen pop). Prints ``ack ok`` (one) or ``ok=N failed=N``;
    exits 5 when the broker refused one (a stale or foreign lease), 4 when there was
    nothing to acknowledge."""
    if failed and status not in (None, "failed"):
        raise usage("give --failed or --status, not both")
    status = "failed" if failed else status or "completed"
    if ids:
        if file is not None:
            raise usage("give the message as arguments or --file, not both")
        if len(ids) == 3 and partition_id is None and lease_id is None:
            pid, tid, lid = ids
        elif len(ids) == 1 and partition_id is not None:
            pid, tid, lid = partition_id, ids[0], lease_id or ""
        else:
            raise usage(
                "give PARTITION_ID TRANSACTION_ID LEASE_ID, or TRANSACTION_ID --partition-id P "
                "[--lease-id L], or messages on stdin/--file"
            )
        messages = [
            {"partitionId": pid, "transactionId": tid, "leaseId": lid, "consumerGroup": group_name}
        ]
    else:
        messages = read_values((), file)
        for number, m in enumerate(messages, start=1):
            if not isinstance(m, dict) or not all(
                isinstance(m.get(k), str) and m.get(k) for k in ("partitionId", "transactionId")
            ):
                raise usage(f"message {number} needs partitionId and transactionId")
            if group_name is not None:
                m["consumerGroup"] = group_name
        if not messages:
            ctl.out.say("ok=0 failed=0")
            return Exit.EMPTY
    answers = _ack(ctl, messages, status, error)
    refused = _refused(answers)
    if ctl.out.explicit and not ctl.out.tables:
        ctl.out.render(answers)
    elif ids:
        ctl.out.say("ack ok" if not refused else f"ack failed: {refused[0].get('error')}")
    else:
        for a in refused:
            click.echo(
                f"queen: ack refused for {a.get('transactionId')}: {a.get('error')}", err=True
            )
        ctl.out.say(f"ok={len(answers) - len(refused)} failed={len(refused)}")
    return Exit.REFUSED if refused else Exit.OK


@group()
def lease() -> None:
    """Leases of popped messages."""


@lease.command("extend")
@click.argument("lease_id")
@click.option(
    "--seconds",
    type=click.IntRange(min=1),
    default=None,
    help="it runs until at least this long from now (never shorter than it was) "
    "[default: the queue's leaseTime]",
)
@broker_command
def lease_extend(ctl: Ctl, *, lease_id: str, seconds: int | None) -> int:
    """Extend the lease LEASE_ID (as pop prints it), as a consumer renewing it does (``POST
    /api/v1/lease/{leaseId}/extend``). Prints ``renewed <lease> -> <expiry>``; a lease that
    has run out or is not known exits 2."""
    answers = ctl.client.post(
        f"/api/v1/lease/{segment(lease_id)}/extend",
        {"seconds": seconds} if seconds is not None else None,
    )
    answer = answers[0] if isinstance(answers, list) and answers else {}
    if not answer.get("success"):
        raise CtlError(f"renew failed: {answer.get('error') or 'no answer'}", Exit.BROKER)
    ctl.out.done(f"renewed {answer.get('leaseId')} -> {answer.get('newExpiresAt')}", answers)
    return Exit.OK

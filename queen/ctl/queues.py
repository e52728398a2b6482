"""Commands on queues, partitions and a group's position: ``queues`` (queenctl's ``queue``),
``partitions``, ``seek``, ``replay``, ``namespaces``, ``tasks``."""

from __future__ import annotations

from typing import Any

import click

from queen.ctl.client import CtlError, Exit, require_queue, segment, usage
from queen.ctl.options import Ctl, broker_command, confirm, group, json_value
from queen.ctl.output import emit_pairs, seconds
from queen.ctl.times import EPOCH, iso, moment
from queen.ctl.views import (
    message_table,
    partition_table,
    queue_row,
    queue_table,
    without_leased,
)

LIST_ALIASES = {"ls": "list", "get": "describe", "show": "describe", "rm": "delete"}


@group(aliases=LIST_ALIASES)
def queues() -> None:
    """List, describe, configure, clear and delete queues."""


def _limit(value: int) -> int:
    return value or 100  # queenctl's 0: the broker's default


@queues.command("list")
@click.option("--namespace", default=None, help="only the queues of this namespace")
@click.option("--task", default=None, help="only the queues of this task")
@click.option("--limit", type=click.IntRange(0, 1000), default=100, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@broker_command
def queues_list(
    ctl: Ctl, *, namespace: str | None, task: str | None, limit: int, offset: int
) -> int:
    """The queues, by name, with their message counts."""
    page = ctl.client.get(
        "/api/v1/resources/queues",
        {"namespace": namespace, "task": task, "limit": _limit(limit), "offset": offset},
    )
    found = page.get("queues", [])

    def table() -> None:
        ctl.out.table(
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
                for q in found
            ),
            empty="no queues",
        )
        total = page.get("total", 0)
        if total > offset + len(found) and ctl.out.headers:
            click.echo(f"({total} queues; more with --offset {offset + _limit(limit)})")

    ctl.out.show(document=page, rows=found, table=table)
    return Exit.OK


def queue_config(ctl: Ctl, queue: str) -> dict[str, Any]:
    """The queue's options as ``GET /api/v1/status/queues/{queue}`` gives them (``config``:
    ``leaseTime``, ``retryLimit``, ...)."""
    answer = ctl.client.get(f"/api/v1/status/queues/{segment(queue)}")
    config = (answer.get("queue") or {}).get("config") if isinstance(answer, dict) else None
    return config if isinstance(config, dict) else {}


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
    """One queue: its options (lease time, retry limit, ...), totals and partitions (a
    missing queue exits 2)."""
    q = ctl.client.get(
        f"/api/v1/resources/queues/{segment(queue)}", {"limit": limit, "offset": offset}
    )

    def table() -> None:
        config = queue_config(ctl, queue)
        options = q.get("options") or {}
        totals = without_leased(q.get("totals"))
        retention = (
            f"pending {options.get('retentionSeconds', 0)} s, completed "
            f"{options.get('completedRetentionSeconds', 0)} s"
            if options.get("retentionEnabled")
            else "off"
        )
        emit_pairs(
            [
                ("queue", q.get("name")),
                ("namespace / task", f"{q.get('namespace') or '-'} / {q.get('task') or '-'}"),
                ("created", q.get("createdAt")),
                ("partitions", q.get("partitionCount")),
                ("messages", ", ".join(f"{k} {v}" for k, v in totals.items())),
                ("segments", q.get("segments")),
                ("lease time", _unit(config.get("leaseTime"), "s")),
                ("retry limit", config.get("retryLimit")),
                ("retry delay", _unit(config.get("retryDelay"), "ms")),
                ("delayed processing", _unit(config.get("delayedProcessing"), "s")),
                ("window buffer", _unit(config.get("windowBuffer"), "s")),
                ("max size", config.get("maxQueueSize") or "unlimited"),
                ("dedup window", _unit(options.get("dedupWindowSeconds"), "s")),
                ("retention", retention),
                ("max wait time", _unit(options.get("maxWaitTimeSeconds") or None, "s")),
            ]
        )
        click.echo()
        partition_table(ctl, q.get("partitions", []))

    ctl.out.show(document=q, table=table)
    return Exit.OK


def _unit(value: Any, unit: str) -> str:
    return "-" if value is None else f"{value} {unit}"


_CONFIG_FLAGS = (
    ("lease_time", "leaseTime"),
    ("retry_limit", "retryLimit"),
    ("priority", "priority"),
    ("delayed_processing", "delayedProcessing"),
    ("window_buffer", "windowBuffer"),
    ("max_size", "maxSize"),
    ("retention", "retentionSeconds"),
    ("completed_retention", "completedRetentionSeconds"),
)


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
@click.option("--lease-time", type=click.IntRange(min=0), default=None, help="leaseTime (s)")
@click.option("--retry-limit", type=click.IntRange(min=0), default=None, help="retryLimit")
@click.option("--priority", type=int, default=None, help="priority")
@click.option("--delayed-processing", type=click.IntRange(min=0), default=None, help="(s)")
@click.option("--window-buffer", type=click.IntRange(min=0), default=None, help="(s)")
@click.option("--max-size", type=click.IntRange(min=0), default=None, help="maxSize")
@click.option("--retention", type=click.IntRange(min=0), default=None, help="retentionSeconds")
@click.option(
    "--completed-retention",
    type=click.IntRange(min=0),
    default=None,
    help="completedRetentionSeconds",
)
@click.option("--encrypt", is_flag=True, help="encryptionEnabled")
@broker_command
def queues_configure(
    ctl: Ctl,
    *,
    queue: str,
    namespace: str | None,
    task: str | None,
    settings: tuple[str, ...],
    options_json: str | None,
    encrypt: bool,
    **flags: int | None,
) -> int:
    """Create QUEUE or set its options. As with POST /api/v1/configure, an option not given
    goes back to its default. queenctl's flags (--lease-time, --retry-limit, ...) set the
    options of the same name (given as 0, as queenctl sends them: left out)."""
    options: dict[str, Any] = {}
    if options_json is not None:
        parsed = json_value(options_json, "--options")
        if not isinstance(parsed, dict):
            raise usage("--options must be a JSON object")
        options.update(parsed)
    for flag, key in _CONFIG_FLAGS:
        if flags.get(flag):
            options[key] = flags[flag]
    if encrypt:
        options["encryptionEnabled"] = True
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
    if ctl.out.explicit and not ctl.out.tables:
        ctl.out.render(answer)
        return Exit.OK
    ctl.out.say(f"configured {answer.get('queue')}")
    if ctl.out.tables and not ctl.out.quiet:
        emit_pairs(sorted((answer.get("options") or {}).items()))
    if answer.get("warning"):
        click.echo(f"warning: {answer['warning']}", err=True)
    return Exit.OK


@queues.command("delete")
@click.argument("queue")
@click.option("--yes", is_flag=True, help="do not ask for a confirmation")
@broker_command
def queues_delete(ctl: Ctl, *, queue: str, yes: bool) -> int:
    """Delete QUEUE with its partitions, messages, groups' positions and dead letters.
    Exits 4 when there was no such queue (nothing to do)."""
    confirm(yes, f"delete queue {queue!r} and every message in it")
    answer = ctl.client.delete(f"/api/v1/resources/queues/{segment(queue)}")
    existed = bool(answer.get("existed"))
    ctl.out.done(f"deleted queue {queue}" if existed else f"no queue {queue}", answer)
    return Exit.OK if existed else Exit.EMPTY


@queues.command("clear")
@click.argument("queue")
@click.option("--partition", default=None, help="only this partition")
@click.option("--yes", is_flag=True, help="do not ask for a confirmation")
@broker_command
def queues_clear(ctl: Ctl, *, queue: str, partition: str | None, yes: bool) -> int:
    """Remove every message of QUEUE (or of one --partition), keeping the queue, its options
    and its groups; messages inside a live lease are kept. A missing queue exits 2."""
    where = f"{queue}/{partition}" if partition else queue
    confirm(yes, f"remove every message of {where!r}")
    require_queue(ctl, queue)
    answer = ctl.client.delete(f"/api/v1/queues/{segment(queue)}/clear", {"partition": partition})
    ctl.out.done(str(answer.get("message") or f"cleared {where}"), answer)
    return Exit.OK


@queues.command("stats")
@click.option("--namespace", default=None, help="only the queues of this namespace")
@click.option("--task", default=None, help="only the queues of this task")
@broker_command
def queues_stats(ctl: Ctl, *, namespace: str | None, task: str | None) -> int:
    """Message counts per queue (``GET /api/v1/status/queues``), by namespace and task."""
    answer = ctl.client.get(
        "/api/v1/status/queues", {"namespace": namespace, "task": task, "limit": 1000}
    )
    rows = [queue_row(q) for q in answer.get("queues", [])]

    ctl.out.show(document=answer, table=lambda: queue_table(ctl, rows, lag=False))
    return Exit.OK


def seek_target(to: str | None, to_end: bool) -> dict[str, Any]:
    """The body of a seek: ``{"toEnd": true}`` or ``{"timestamp": ISO}``. ``--to`` takes what
    queenctl's does: ``now``/``end``/``latest`` (the end), ``beginning``/``earliest``/
    ``start`` (the first message), ``15m ago``, a date, Unix seconds or ISO-8601."""
    if (to is None) == (not to_end):
        raise usage("give exactly one of --to TIME and --to-end")
    if to_end or (to or "").strip().lower() in ("now", "end", "latest"):
        return {"toEnd": True}
    try:
        at = moment(to or "")
    except ValueError as exc:
        raise usage(f"--to: {exc}") from None
    return {"timestamp": iso(at if at is not None else EPOCH)}


def do_seek(
    ctl: Ctl, group_name: str, queue: str, body: dict[str, Any], partition: str | None
) -> dict[str, Any]:
    path = f"/api/v1/consumer-groups/{segment(group_name)}/queues/{segment(queue)}"
    if partition is not None:
        path += f"/partitions/{segment(partition)}"
    answer: dict[str, Any] = ctl.client.post(path + "/seek", body)
    return answer


@click.command()
@click.argument("group_name", metavar="GROUP")
@click.argument("queue")
@click.option(
    "--to",
    "to",
    default=None,
    metavar="TIME",
    help="re-read what was stored from this time on (ISO-8601, a date, '15m ago', "
    "beginning; now/end: skip everything)",
)
@click.option("--to-end", is_flag=True, help="skip everything stored so far")
@click.option("--partition", default=None, help="only this partition (default: every one)")
@click.option("--dry-run", is_flag=True, help="say what would be done, do nothing")
@broker_command
def seek(
    ctl: Ctl,
    *,
    group_name: str,
    queue: str,
    to: str | None,
    to_end: bool,
    partition: str | None,
    dry_run: bool,
) -> int:
    """Move consumer GROUP's position on QUEUE (its leases there are released)."""
    body = seek_target(to, to_end)
    where = f"{queue}/{partition}" if partition is not None else queue
    if dry_run:
        click.echo(f"[dry-run] would move {group_name} on {where} to {_target(body)}")
        return Exit.OK
    answer = do_seek(ctl, group_name, queue, body, partition)
    if partition is not None:
        moved = "moved" if answer.get("updated") else "did not move (no position there yet)"
        line = f"{moved} {group_name} on {where} to {_target(body, answer)}"
    else:
        line = (
            f"moved {group_name} on {queue} to {_target(body, answer)}: "
            f"{answer.get('partitionsUpdated', 0)} partitions"
        )
    ctl.out.done(line, answer)
    return Exit.OK


def _target(body: dict[str, Any], answer: dict[str, Any] | None = None) -> str:
    if body.get("toEnd"):
        return "the end"
    return str((answer or {}).get("targetTimestamp") or body.get("timestamp"))


@click.command()
@click.argument("queue")
@click.option("--cg", "--group", "group_name", required=True, help="the consumer group")
@click.option("--to", "to", required=True, metavar="TIME", help="as for seek --to")
@click.option("--dry-run", is_flag=True, help="say what would be done, do nothing")
@broker_command
def replay(ctl: Ctl, *, queue: str, group_name: str, to: str, dry_run: bool) -> int:
    """queenctl's ``replay QUEUE --cg G --to TIME``: seek G on QUEUE to TIME, so its next pops
    deliver what was stored from then on (``now``/``end``: nothing stored so far)."""
    body = seek_target(to, False)
    if dry_run:
        click.echo(
            f"[dry-run] would seek cg={group_name} queue={queue} "
            f"toEnd={'true' if body.get('toEnd') else 'false'} ts={body.get('timestamp', '')!r}"
        )
        return Exit.OK
    answer = do_seek(ctl, group_name, queue, body, None)
    ctl.out.done(f"replayed cg={group_name} queue={queue} to={to}", answer)
    return Exit.OK


@group(aliases={"ls": "list", "get": "describe", "show": "describe"})
def partitions() -> None:
    """The partitions of a queue: list them, look into one, seek a group on one."""


@partitions.command("list")
@click.argument("queue")
@broker_command
def partitions_list(ctl: Ctl, *, queue: str) -> int:
    """QUEUE's partitions with their counts, offsets and leases."""
    answer = ctl.client.get(
        f"/api/v1/status/queues/{segment(queue)}", {"includePartitions": True, "limit": 1000}
    )
    found = answer.get("partitions", [])
    ctl.out.show(document=answer, rows=found, table=lambda: partition_table(ctl, found))
    return Exit.OK


@partitions.command("describe")
@click.argument("queue")
@click.argument("partition")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@broker_command
def partitions_describe(ctl: Ctl, *, queue: str, partition: str, limit: int) -> int:
    """The latest messages of one partition (``GET /api/v1/messages``)."""
    page = ctl.client.get(
        "/api/v1/messages", {"queue": queue, "partition": partition, "limit": limit}
    )
    found = page.get("messages", [])
    ctl.out.show(document=page, table=lambda: message_table(ctl, found))
    return Exit.OK


@partitions.command("seek")
@click.argument("queue")
@click.argument("partition")
@click.option("--cg", "--group", "group_name", required=True, help="the consumer group")
@click.option("--to", "to", default="end", show_default=True, metavar="TIME")
@broker_command
def partitions_seek(ctl: Ctl, *, queue: str, partition: str, group_name: str, to: str) -> int:
    """Move GROUP's position on one partition (queenctl's ``partition seek``; ``--to end``
    by default, or a time as for seek)."""
    answer = do_seek(ctl, group_name, queue, seek_target(to, False), partition)
    ctl.out.done(f"seek cg={group_name} queue={queue} partition={partition} to={to}", answer)
    return Exit.OK


def _groupings(ctl: Ctl, by: str) -> int:
    answer = ctl.client.get(f"/api/v1/resources/{by}s")
    found = answer.get(f"{by}s", [])
    ctl.out.show(
        document=answer,
        rows=found,
        table=lambda: ctl.out.table(
            [by, "queues", "partitions", "messages", "pending"],
            (
                [
                    g.get(by) or "-",
                    g.get("queues"),
                    g.get("partitions"),
                    (g.get("messages") or {}).get("total"),
                    (g.get("messages") or {}).get("pending"),
                ]
                for g in found
            ),
            empty=f"no {by}s",
        ),
    )
    return Exit.OK


@group(aliases={"ls": "list"})
def namespaces() -> None:
    """Queue namespaces."""


@namespaces.command("list")
@broker_command
def namespaces_list(ctl: Ctl) -> int:
    """Every namespace with its queues, partitions and messages."""
    return _groupings(ctl, "namespace")


@group(aliases={"ls": "list"})
def tasks() -> None:
    """Queue tasks."""


@tasks.command("list")
@broker_command
def tasks_list(ctl: Ctl) -> int:
    """Every task with its queues, partitions and messages."""
    return _groupings(ctl, "task")

"""``push``: items from arguments, ``--data``, a file or stdin, in requests of ``--batch``
items.

The input is read whole and checked before anything is sent: a value that is not JSON is a
usage error (exit 1) and nothing is pushed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from queen.ctl.client import CtlError, Exit, usage
from queen.ctl.options import Ctl, broker_command, json_value, read_values
from queen.ctl.output import emit_table


@click.command()
@click.argument("queue")
@click.argument("payloads", nargs=-1)
@click.option("--partition", default=None, help="partition of every item (default: Default)")
@click.option(
    "--partition-key",
    default=None,
    metavar="PATH",
    help="the partition of each item is the value at PATH in its payload (user_id, order.id)",
)
@click.option("--data", default=None, metavar="JSON", help="one payload (instead of stdin)")
@click.option(
    "-f",
    "--file",
    "file",
    default=None,
    metavar="PATH",
    help="read one JSON value per line from PATH (- for stdin)",
)
@click.option(
    "--items",
    "as_items",
    is_flag=True,
    help="each value is an item object: payload, and optionally partition, transactionId, traceId",
)
@click.option(
    "--wrapped",
    is_flag=True,
    help="each value is queenctl's item: data, and optionally partition, transactionId, traceId",
)
@click.option("--transaction-id", default=None, help="transaction id of the first item")
@click.option("--trace-id", default=None, help="trace id of every item")
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=500,
    show_default=True,
    help="items per request",
)
@click.option("--dry-run", is_flag=True, help="read and check the input, send nothing")
@broker_command
def push(
    ctl: Ctl,
    *,
    queue: str,
    payloads: tuple[str, ...],
    partition: str | None,
    partition_key: str | None,
    data: str | None,
    file: str | None,
    as_items: bool,
    wrapped: bool,
    transaction_id: str | None,
    trace_id: str | None,
    batch: int,
    dry_run: bool,
) -> int:
    """Push items to QUEUE: each PAYLOAD argument, --data, or each line of --file or stdin
    is one JSON payload (or one item object with --items or --wrapped). Prints
    ``queued=N duplicate=N failed=N``; exits 5 when an item failed, 4 when there was
    nothing to push."""
    if as_items and wrapped:
        raise usage("give --items or --wrapped, not both")
    if data is not None:
        if payloads or file is not None:
            raise usage("give --data, arguments or --file, not several")
        values = [json_value(data, "--data")]
    else:
        values = read_values(payloads, file)
    shape = "items" if as_items else "wrapped" if wrapped else None
    items = [
        _item(v, i, queue, partition=partition, partition_key=partition_key, shape=shape)
        for i, v in enumerate(values, start=1)
    ]
    if items and transaction_id is not None:
        items[0]["transactionId"] = transaction_id
    if trace_id is not None:
        for item in items:
            item.setdefault("traceId", trace_id)
    if dry_run or not items:
        ctl.out.say(f"queued={len(items)} duplicate=0 failed=0")
        return Exit.OK if items else Exit.EMPTY
    results: list[dict[str, Any]] = []
    with _progress(len(items), batch) as advance:
        for start in range(0, len(items), batch):
            try:
                answer = ctl.client.post("/api/v1/push", {"items": items[start : start + batch]})
            except CtlError as exc:
                if not results:
                    raise
                raise CtlError(
                    f"{exc.message} ({len(results)} items were pushed before this)", exc.code
                ) from None
            for item in answer:
                item["index"] = start + int(item.get("index", 0))
            results.extend(answer)
            advance(len(answer))
    counts = {"queued": 0, "duplicate": 0, "failed": 0, "buffered": 0}
    for r in results:
        status = str(r.get("status"))
        counts[status if status in counts else "failed"] += 1
    if ctl.out.explicit and not ctl.out.tables:
        ctl.out.render(results)
    else:
        line = (
            f"queued={counts['queued'] + counts['buffered']} duplicate={counts['duplicate']} "
            f"failed={counts['failed']}"
        )
        ctl.out.say(line + (f" (buffered={counts['buffered']})" if counts["buffered"] else ""))
        unusual = [r for r in results if r.get("status") not in ("queued", "buffered")]
        if unusual and not ctl.out.quiet:
            _unusual(unusual)
    return Exit.REFUSED if counts["failed"] else Exit.OK


def _unusual(results: list[dict[str, Any]]) -> None:
    """The items not stored (duplicates, failures), on stderr: stdout keeps queenctl's one
    line."""
    from contextlib import redirect_stdout

    with redirect_stdout(sys.stderr):
        emit_table(
            ["index", "status", "partition", "transaction id", "message id", "error"],
            (
                [
                    r.get("index"),
                    r.get("status"),
                    r.get("partition"),
                    r.get("transactionId"),
                    r.get("messageId"),
                    r.get("error"),
                ]
                for r in results
            ),
            empty="",
        )


@contextlib.contextmanager
def _progress(total: int, batch: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for a push of several requests, when stderr is a terminal."""
    if total <= batch or not sys.stderr.isatty():
        yield lambda n: None
        return
    with click.progressbar(length=total, label="pushing", file=sys.stderr) as bar:
        yield bar.update


def _item(
    value: Any,
    number: int,
    queue: str,
    *,
    partition: str | None,
    partition_key: str | None,
    shape: str | None,
) -> dict[str, Any]:
    if shape is None:
        item: dict[str, Any] = {"queue": queue, "payload": value}
    elif shape == "items":
        if not isinstance(value, dict) or "payload" not in value:
            raise usage(f"item {number} must be an object with a payload (--items)")
        item = {"queue": queue, **value}
    else:
        if not isinstance(value, dict) or "data" not in value:
            raise usage(f"item {number} must be an object with data (--wrapped)")
        item = {"queue": queue, "payload": value["data"]}
        for key in ("partition", "transactionId", "traceId"):
            if value.get(key):
                item[key] = value[key]
    if partition_key is not None:
        keyed = _at(item["payload"], partition_key)
        if keyed is not None:
            item["partition"] = keyed
    if partition is not None:
        item.setdefault("partition", partition)
    return item


def _at(payload: Any, path: str) -> str | None:
    """The value at the dotted ``path`` of ``payload`` as a partition name (a string, number or
    boolean; anything else, or nothing there: ``None``)."""
    for key in path.split("."):
        if not isinstance(payload, dict):
            return None
        payload = payload.get(key)
    if isinstance(payload, bool):
        return "true" if payload else "false"
    if isinstance(payload, int | float):
        return str(int(payload)) if float(payload).is_integer() else str(payload)
    return payload if isinstance(payload, str) and payload else None

"""``push``: items from arguments, a file or stdin, in requests of ``--batch`` items.

The input is read whole and checked before anything is sent: a value that is not JSON is a
usage error (exit 2) and nothing is pushed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from queen.ctl.client import CtlError, Exit, usage
from queen.ctl.options import Ctl, broker_command, read_values
from queen.ctl.output import emit_json, emit_table


@click.command()
@click.argument("queue")
@click.argument("payloads", nargs=-1)
@click.option("--partition", default=None, help="partition of every item (default: Default)")
@click.option(
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
@click.option("--transaction-id", default=None, help="transaction id of the one item pushed")
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=500,
    show_default=True,
    help="items per request",
)
@broker_command
def push(
    ctl: Ctl,
    *,
    queue: str,
    payloads: tuple[str, ...],
    partition: str | None,
    file: str | None,
    as_items: bool,
    transaction_id: str | None,
    batch: int,
) -> int:
    """Push items to QUEUE: each PAYLOAD argument, or each line of --file or stdin, is one
    JSON payload (or one item object with --items). Exits 1 when an item failed."""
    values = read_values(payloads, file)
    if not values:
        raise usage("nothing to push")
    if transaction_id is not None and len(values) != 1:
        raise usage("--transaction-id names one item; give each item its own with --items")
    items = [_item(v, i, queue, partition, as_items) for i, v in enumerate(values, start=1)]
    if transaction_id is not None:
        items[0]["transactionId"] = transaction_id
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
    failed = [r for r in results if r.get("status") == "failed"]
    if ctl.json:
        emit_json(results)
    else:
        counts: dict[str, int] = {}
        for r in results:
            counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        click.echo(f"pushed {len(results)} items to {queue}: {summary}")
        unusual = [r for r in results if r.get("status") not in ("queued", "buffered")]
        if unusual:
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
                    for r in unusual
                ),
                empty="",
            )
    return Exit.FAILED if failed else Exit.OK


@contextlib.contextmanager
def _progress(total: int, batch: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for a push of several requests, when stderr is a terminal."""
    if total <= batch or not sys.stderr.isatty():
        yield lambda n: None
        return
    with click.progressbar(length=total, label="pushing", file=sys.stderr) as bar:
        yield bar.update


def _item(
    value: Any, number: int, queue: str, partition: str | None, as_items: bool
) -> dict[str, Any]:
    if not as_items:
        item: dict[str, Any] = {"queue": queue, "payload": value}
    else:
        if not isinstance(value, dict) or "payload" not in value:
            raise usage(f"item {number} must be an object with a payload (--items)")
        item = {"queue": queue, **value}
    if partition is not None:
        item.setdefault("partition", partition)
    return item

"""How the operator commands print: human tables (``tabulate``) or the broker's JSON.

With ``--json`` a command prints the broker's answer unchanged (one JSON document), or, for
commands that combine answers, the documented shape of ``docs/command.md``; messages (``pop``,
``tail``) are JSON lines either way, so pipelines compose.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import click
from tabulate import tabulate


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


def emit_line(value: Any) -> None:
    """One JSON document on one line (JSON lines)."""
    click.echo(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def emit_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str) -> None:
    rows = [[cell(v) for v in row] for row in rows]
    if not rows:
        click.echo(empty)
        return
    click.echo(tabulate(rows, headers=list(headers), tablefmt="simple", disable_numparse=True))


def emit_pairs(pairs: Iterable[tuple[str, Any]]) -> None:
    """``key  value`` lines, aligned."""
    items = [(k, cell(v)) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0)
    for key, value in items:
        click.echo(f"{key.ljust(width)}  {value}")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def seconds(value: Any) -> str:
    """An age in seconds as ``4.2s``, ``3m 5s``, ``2h 10m``, ``3d 4h``."""
    if not isinstance(value, int | float):
        return "-"
    s = float(value)
    if s < 60:
        return f"{s:.1f}s"
    minutes, secs = divmod(int(s), 60)
    if minutes < 60:
        return f"{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"

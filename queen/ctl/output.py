"""How the operator commands print.

The mode is chosen by ``-o/--output`` (``table``, ``wide``, ``json``, ``ndjson``, ``yaml``,
``jsonpath=EXPR``, as queenctl takes them) or ``--json``; without either, a terminal gets
tables and a pipe gets ``-o json``, as with queenctl.

Each command has a *document*: what queenctl prints for it in the ``-o`` modes (for a list,
the list of its rows; for one thing, the broker's answer), so a script written for queenctl
reads the same keys. ``--json`` prints the broker's answer unchanged, or for commands that
combine answers the shape ``docs/command.md`` gives: what ``queen`` printed before ``-o``
existed. Messages (``pop``, ``tail``) are JSON lines whatever the mode, so pipelines compose.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import click
from tabulate import tabulate

FORMATS = ("table", "wide", "json", "ndjson", "jsonl", "yaml", "jsonpath=EXPR")


@dataclass(frozen=True, slots=True)
class Output:
    """The output mode of one command run."""

    mode: str  # table, wide, json, ndjson, yaml, jsonpath, broker (--json)
    expr: str = ""  # the jsonpath expression
    quiet: bool = False
    headers: bool = True
    explicit: bool = True  # chosen by -o or --json (not by where stdout goes)

    @classmethod
    def choose(
        cls, output: str | None, as_json: bool, *, quiet: bool = False, headers: bool = True
    ) -> Output:
        """``-o`` given wins, then ``--json``, then table at a terminal and ``json`` in a
        pipe. A format that is none of :data:`FORMATS` raises ``ValueError``."""
        if output:
            # -o=json reaches click as "=json" (a short option takes the rest of its word)
            mode, _, expr = output.strip().removeprefix("=").partition("=")
            mode = mode.lower()
            if expr or mode in ("jsonpath", "json-path"):
                if mode not in ("jsonpath", "json-path"):
                    raise ValueError(f"unknown output expression {mode!r}")
                if not expr.strip():
                    raise ValueError("the jsonpath expression is empty (-o jsonpath=.a.b[0])")
                return cls("jsonpath", expr, quiet, headers, True)
            mode = "ndjson" if mode == "jsonl" else mode
            if mode not in ("table", "wide", "json", "ndjson", "yaml"):
                raise ValueError(f"unknown output format {output!r}; one of {', '.join(FORMATS)}")
            return cls(mode, "", quiet, headers, True)
        if as_json:
            return cls("broker", "", quiet, headers, True)
        return cls("table" if sys.stdout.isatty() else "json", "", quiet, headers, False)

    @property
    def tables(self) -> bool:
        return self.mode in ("table", "wide")

    @property
    def wide(self) -> bool:
        return self.mode == "wide"

    def show(
        self,
        *,
        document: Any,
        table: Callable[[], None],
        rows: Sequence[Any] | None = None,
        broker: Any = None,
    ) -> None:
        """Print a command's result: ``table()`` in the table modes; in the ``-o`` modes
        ``rows`` (the list's rows) when given, else ``document``; with ``--json``
        ``broker`` (default: ``document``)."""
        if self.tables:
            table()
        elif self.mode == "broker":
            emit_json(document if broker is None else broker)
        else:
            self.render(document, rows)

    def render(self, document: Any, rows: Sequence[Any] | None = None) -> None:
        """The ``-o`` modes (``--json`` prints ``document`` as ``-o json`` does)."""
        value = list(rows) if rows is not None else document
        if self.mode == "ndjson":
            for row in value if rows is not None else [document]:
                emit_line(row)
        elif self.mode == "yaml":
            emit_yaml(value)
        elif self.mode == "jsonpath":
            emit_jsonpath(value, self.expr)
        else:
            emit_json(value)

    def done(self, line: str, document: Any) -> None:
        """What a command that acts prints: its confirmation line (unless ``-q``), or, when
        ``-o`` (not a table) or ``--json`` asks for it, ``document``."""
        if self.explicit and not self.tables:
            self.render(document)
        else:
            self.say(line)

    def say(self, line: str) -> None:
        """A confirmation line (``deleted ...``): printed unless ``-q``."""
        if not self.quiet:
            click.echo(line)

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str) -> None:
        emit_table(headers, rows, empty=empty, show_headers=self.headers)


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


def emit_line(value: Any) -> None:
    """One JSON document on one line (JSON lines)."""
    click.echo(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def emit_yaml(value: Any) -> None:
    import yaml

    click.echo(
        yaml.safe_dump(value, sort_keys=False, allow_unicode=True, default_flow_style=False),
        nl=False,
    )


def emit_jsonpath(value: Any, expr: str) -> None:
    """queenctl's ``-o jsonpath=.queues[0].name``: keys and indexes from the top; a string,
    number or boolean is printed bare, anything else as JSON."""
    from queen.ctl.client import usage

    try:
        found = jsonpath(value, expr)
    except ValueError as exc:
        raise usage(f"-o jsonpath: {exc}") from None
    if found is None:
        click.echo("")
    elif isinstance(found, bool):
        click.echo("true" if found else "false")
    elif isinstance(found, float):
        click.echo(str(int(found)) if found.is_integer() else repr(found))
    elif isinstance(found, str | int):
        click.echo(str(found))
    else:
        emit_json(found)


def jsonpath(value: Any, expr: str) -> Any:
    """``.a.b[0].c`` in ``value``: a missing key is ``None``, a bad step ``ValueError``."""
    text = expr.strip()
    if text in ("", "."):
        return value
    if not text.startswith((".", "[")):
        text = "." + text
    pos = 0
    while pos < len(text):
        if text[pos] == ".":
            end = pos + 1
            while end < len(text) and text[end] not in ".[":
                end += 1
            key = text[pos + 1 : end]
            if not key:
                raise ValueError(f"empty key at {pos}")
            if not isinstance(value, dict):
                raise ValueError(f"cannot take {key!r} of a non-object")
            value = value.get(key)
            pos = end
        elif text[pos] == "[":
            end = text.find("]", pos)
            if end < 0:
                raise ValueError("unterminated [")
            try:
                index = int(text[pos + 1 : end])
            except ValueError:
                raise ValueError(f"bad index {text[pos + 1 : end]!r}") from None
            if not isinstance(value, list):
                raise ValueError("cannot index a non-array")
            if not 0 <= index < len(value):
                raise ValueError(f"index {index} out of range (length {len(value)})")
            value = value[index]
            pos = end + 1
        else:
            raise ValueError(f"unexpected {text[pos]!r} at {pos}")
    return value


def emit_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    empty: str,
    show_headers: bool = True,
) -> None:
    rows = [[cell(v) for v in row] for row in rows]
    if not rows:
        if show_headers:
            click.echo(empty)
        return
    if show_headers:
        text = tabulate(rows, headers=list(headers), tablefmt="simple", disable_numparse=True)
    else:
        text = tabulate(rows, tablefmt="plain", disable_numparse=True)
    click.echo(text)


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

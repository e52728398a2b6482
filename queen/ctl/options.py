"""What every operator command shares: the connection options, the :class:`Ctl` its body
receives, confirmations, and reading JSON values from arguments, a file or stdin."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import click

from queen.ctl.client import DEFAULT_URL, BrokerClient, CtlError, Exit, usage


@dataclass(frozen=True, slots=True)
class Ctl:
    """What a command body works with: the broker and the output mode."""

    client: BrokerClient
    json: bool


def connection_options(*, top: bool) -> tuple[Callable[[Any], Any], ...]:
    """``--url``, ``--token``, ``--timeout`` and ``--json``. They are taken before the command
    (``queen --url ... status``, where the environment and defaults apply) or after it
    (``queen status --url ...``), which wins."""
    return (
        click.option(
            "--url",
            envvar="QUEEN_URL" if top else None,
            default=DEFAULT_URL if top else None,
            show_default=top,
            help="the broker's base URL [env QUEEN_URL; default " + DEFAULT_URL + "]",
        ),
        click.option(
            "--token",
            envvar="QUEEN_TOKEN" if top else None,
            default=None,
            help="bearer token (a JWT) [env QUEEN_TOKEN]",
        ),
        click.option(
            "--timeout",
            type=click.FloatRange(min=0.1),
            default=30.0 if top else None,
            help="seconds to wait for each answer, a long poll's wait added [default 30]",
        ),
        click.option(
            "--json", "as_json", is_flag=True, help="print JSON for scripts instead of tables"
        ),
    )


def with_options(f: Any, options: tuple[Callable[[Any], Any], ...]) -> Any:
    for option in reversed(options):
        f = option(f)
    return f


def broker_command(body: Callable[..., int]) -> Callable[..., int]:
    """Add the connection options to a command; its body gets a :class:`Ctl` first and
    returns its exit status."""

    @functools.wraps(body)
    def run(
        *args: Any,
        url: str | None,
        token: str | None,
        timeout: float | None,
        as_json: bool,
        **kwargs: Any,
    ) -> int:
        top = click.get_current_context().find_root().params
        url = url or top.get("url") or DEFAULT_URL
        token = token or top.get("token")
        timeout = timeout or top.get("timeout") or 30.0
        as_json = as_json or bool(top.get("as_json"))
        if not url.startswith(("http://", "https://")):
            raise usage(f"--url / QUEEN_URL must start with http:// or https://, got {url!r}")
        with BrokerClient(url, token, timeout) as client:
            return body(Ctl(client, as_json), *args, **kwargs)

    wrapped: Callable[..., int] = with_options(run, connection_options(top=False))
    return wrapped


def json_value(text: str, what: str) -> Any:
    """``text`` as JSON, else a usage error naming ``what``."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise usage(f"{what} is not JSON: {exc}") from None


def confirm(yes: bool, what: str) -> None:
    """Destructive commands need ``--yes``, or a ``y`` typed at a terminal."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise usage(f"refusing to {what} without --yes")
    if not click.confirm(f"{what}?", default=False):
        raise CtlError("not confirmed; nothing changed", Exit.FAILED)


def _json_lines(stream: IO[str], source: str) -> Iterator[Any]:
    for number, line in enumerate(stream, start=1):
        if line.strip():
            yield json_value(line, f"{source} line {number}")


def read_values(values: tuple[str, ...], file: str | None) -> list[Any]:
    """The JSON values of the arguments, else of ``file`` (``-``: stdin), else of stdin."""
    if values and file is not None:
        raise usage("give values as arguments or with --file, not both")
    if values:
        return [json_value(v, f"argument {i}") for i, v in enumerate(values, start=1)]
    if file is None or file == "-":
        if file is None and sys.stdin.isatty():
            raise usage("nothing to read: give values as arguments, --file PATH, or pipe them in")
        return list(_json_lines(sys.stdin, "stdin"))
    try:
        with open(file, encoding="utf-8") as stream:
            return list(_json_lines(stream, file))
    except OSError as exc:
        raise usage(f"cannot read {file}: {exc.strerror or exc}") from None

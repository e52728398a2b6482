"""What every operator command shares: the connection and output options, the :class:`Ctl`
its body receives, command groups with aliases (queenctl's words beside ours),
confirmations, and reading JSON values from arguments, a file or stdin."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, overload

import click

from queen.ctl.client import BrokerClient, CtlError, Exit, default_url, usage
from queen.ctl.output import FORMATS, Output
from queen.ctl.times import Duration

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Ctl:
    """What a command body works with: the broker, the output mode, and whether
    ``--timeout`` was given (``pop --wait`` without a value waits that long, as queenctl's
    ``pop --timeout`` does)."""

    client: BrokerClient
    out: Output
    timeout_given: bool = False


def connection_options(*, top: bool) -> tuple[Callable[[Any], Any], ...]:
    """The options every command takes, before it (``queen --url ... status``, where the
    environment applies) or after it (``queen status --url ...``), which wins. queenctl's
    names are taken too: ``--server``, ``-o``, ``-q``, ``--no-headers``, ``--insecure``,
    ``--context``, ``--config`` (and ``--color``/``--no-color``, which change nothing: the
    tables have no colour)."""
    return (
        click.option(
            "--url",
            "--server",
            "url",
            envvar=["QUEEN_URL", "QUEEN_SERVER"] if top else None,
            default=None,
            help="the broker's base URL [env QUEEN_URL, then QUEEN_SERVER; default "
            "http://127.0.0.1:$QUEEN_PORT, else http://127.0.0.1:6632]",
        ),
        click.option(
            "--token",
            envvar="QUEEN_TOKEN" if top else None,
            default=None,
            help="bearer token (a JWT) [env QUEEN_TOKEN]",
        ),
        click.option(
            "--timeout",
            type=Duration(minimum=0.1),
            default=None,
            help="how long to wait for each answer, in seconds or as 500ms, 10s, 1m; a long "
            "poll's wait is added [default 30]",
        ),
        click.option("--json", "as_json", is_flag=True, help="print the broker's answer as JSON"),
        click.option(
            "-o",
            "--output",
            "output",
            default=None,
            metavar="FORMAT",
            help=f"{' | '.join(FORMATS)} [default: table at a terminal, json otherwise]",
        ),
        click.option("-q", "--quiet", is_flag=True, help="no confirmation lines"),
        click.option("--no-headers", is_flag=True, help="tables without their header"),
        click.option("--insecure", is_flag=True, help="do not check the TLS certificate"),
        click.option(
            "--context", "context_name", default=None, help="a queenctl context [env QUEEN_CONTEXT]"
        ),
        click.option(
            "--config",
            "config_path",
            default=None,
            metavar="PATH",
            help="queenctl's config file [env QUEEN_CONFIG; default ~/.queen/config.yaml]",
        ),
        click.option("--color/--no-color", default=None, hidden=True),
    )


_SHARED = (
    "url",
    "token",
    "timeout",
    "as_json",
    "output",
    "quiet",
    "no_headers",
    "insecure",
    "context_name",
    "config_path",
    "color",
)


def with_options(f: Any, options: tuple[Callable[[Any], Any], ...]) -> Any:
    for option in reversed(options):
        f = option(f)
    return f


Body = Callable[..., int]


@overload
def broker_command(body: Body, *, timeout_s: float = ...) -> Body: ...


@overload
def broker_command(body: None = None, *, timeout_s: float = ...) -> Callable[[Body], Body]: ...


def broker_command(
    body: Body | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Body | Callable[[Body], Body]:
    """Add the shared options to a command; its body gets a :class:`Ctl` first and returns
    its exit status. ``timeout_s`` is the command's default ``--timeout``
    (``@broker_command(timeout_s=5.0)``)."""
    if body is None:
        return functools.partial(broker_command, timeout_s=timeout_s)

    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> int:
        mine = {name: kwargs.pop(name) for name in _SHARED}
        top = click.get_current_context().find_root().params

        def given(name: str) -> Any:
            value = mine.get(name)
            return value if value not in (None, False) else top.get(name)

        url, token = given("url"), given("token")
        insecure = bool(given("insecure"))
        if not url or not token:
            from queen.ctl.contexts import load_context

            context = load_context(
                given("config_path"), given("context_name"), token_given=bool(token)
            )
            if context is not None:
                url = url or context.server
                token = token or context.token
                insecure = insecure or context.insecure
        url = url or default_url()
        if not url.startswith(("http://", "https://")):
            raise usage(
                f"--url / QUEEN_URL / QUEEN_SERVER must start with http:// or https://, got {url!r}"
            )
        timeout = given("timeout")
        try:
            out = Output.choose(
                given("output"),
                bool(given("as_json")),
                quiet=bool(given("quiet")),
                headers=not given("no_headers"),
            )
        except ValueError as exc:
            raise usage(f"-o: {exc}") from None
        with BrokerClient(url, token, timeout or timeout_s, verify=not insecure) as client:
            return body(Ctl(client, out, timeout is not None), *args, **kwargs)

    wrapped: Callable[..., int] = with_options(run, connection_options(top=False))
    return wrapped


class AliasGroup(click.Group):
    """A command group that also answers to other words: ``aliases`` maps a word to the name
    of one of its commands (queenctl's ``queue`` for our ``queues``, ``ls`` for ``list``).
    ``--help`` names them beside each command."""

    def __init__(self, *args: Any, aliases: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = dict(aliases or {})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        _, command, rest = super().resolve_command(ctx, args)
        return (command.name if command else None), command, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            also = sorted(a for a, target in self.aliases.items() if target == name)
            suffix = f" (also: {', '.join(also)})" if also else ""
            limit = max(45, formatter.width - 6 - len(name) - len(suffix))
            rows.append((name, command.get_short_help_str(limit=limit) + suffix))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def group(*, aliases: Mapping[str, str] | None = None) -> Callable[[Any], AliasGroup]:
    """``@group(aliases={...})``: a :class:`AliasGroup` from a function."""

    def make(f: Any) -> AliasGroup:
        made: AliasGroup = click.group(cls=AliasGroup, aliases=aliases)(f)
        return made

    return make


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
        raise CtlError("not confirmed; nothing changed", Exit.USAGE)


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

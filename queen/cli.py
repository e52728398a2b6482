"""Command line: ``queen serve`` (every setting is a flag, an environment variable and a
default; ``queen serve --help`` lists them all; ``--check`` checks them and exits), ``queen
import`` (:mod:`queen.migrate.command`), ``queen --version``, and the operator commands of
:mod:`queen.ctl` (``queen --help`` lists them). Every command is a ``click`` command.

``queen serve`` and ``queen import`` are run without loading the operator commands, and a
command line either cannot parse exits 2 (the operator commands' usage status is queenctl's,
1)."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Sequence
from typing import Any

import click

from queen.migrate.command import command as import_command
from queen.settings import Settings, describe, parse_value

SERVICE_USAGE_STATUS = 2
"""The exit status of a command line ``queen serve`` or ``queen import`` cannot parse."""


def shown_default(default: object) -> str:
    """How ``--help`` shows a default: ``(unset)``, ``true``/``false``, or the value."""
    if default is None:
        return "(unset)"
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


class SettingValue(click.ParamType[Any]):
    """The text of a flag, read as its setting reads its environment variable."""

    def __init__(self, setting: str) -> None:
        self.name = setting

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return parse_value(self.name, value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _serve_command() -> click.Command:
    params: list[click.Parameter] = [
        click.Option(
            ["--" + name.replace("_", "-"), name],
            type=SettingValue(name),
            default=None,
            metavar=env,
            help=f"{text} [env {env}; default {shown_default(default)}]",
        )
        for name, env, _kind, default, text in describe()
    ]
    params.append(
        click.Option(
            ["--check"],
            is_flag=True,
            help="check the settings, the database, its schema and the spool directory, print "
            "each check, then exit (0 when every check passes) instead of serving",
        )
    )
    return click.Command(
        "serve",
        callback=serve,
        params=params,
        help="Run the broker. Flags override environment variables, which override the defaults.",
        short_help="Run the broker (queen serve --help lists its settings; --check checks them).",
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def serve(check: bool, **overrides: Any) -> int:
    """``queen serve``: run the broker (or, with ``check``, check what it would find)."""
    if check:
        from queen.preflight import run_checks

        return run_checks(overrides)
    try:
        settings = Settings.from_env(**overrides)
    except ValueError as exc:
        print(f"queen: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from queen.server import StartupError, run
    from queen.storage.embedded import DataDirInUse
    from queen.storage.postgres import ForeignSchemaError, SchemaBusy

    try:
        run(settings)
    except (StartupError, ForeignSchemaError, SchemaBusy, DataDirInUse) as exc:
        print(f"queen: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


serve_command = _serve_command()
SERVICE_COMMANDS = {"serve": serve_command, "import": import_command}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        service = SERVICE_COMMANDS.get(args[0]) if args else None
        if service is not None:
            return _run_service(service, args[1:])
        return _commands().main(args, prog_name="queen", standalone_mode=False) or 0
    except KeyboardInterrupt:  # Ctrl-C before a command took over its signals
        print("queen: interrupted", file=sys.stderr)
        return 130


def _run_service(command: click.Command, args: list[str]) -> int:
    """``queen serve`` or ``queen import`` on its own."""
    try:
        status = command.main(args, prog_name=f"queen {command.name}", standalone_mode=False)
    except click.UsageError as exc:
        exc.show()
        return SERVICE_USAGE_STATUS
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        print("queen: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


def _commands() -> Any:
    """``queen``: ``serve`` and ``import`` beside the operator commands. Failures print one
    line and give the exit statuses of :class:`queen.ctl.Exit`; a usage error is 1 (2 for
    ``serve`` and ``import``)."""
    from queen.ctl import ALIASES, COMMANDS, Exit
    from queen.ctl.inspect import package_version
    from queen.ctl.options import AliasGroup, connection_options, with_options

    class Queen(AliasGroup):
        def main(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().main(*args, **kwargs)
            except click.exceptions.NoArgsIsHelpError as exc:  # `queen` alone: its help
                exc.show()
                return int(Exit.OK)
            except click.UsageError as exc:
                exc.show()
                command = exc.ctx.command if exc.ctx is not None else None
                if command in SERVICE_COMMANDS.values():
                    return SERVICE_USAGE_STATUS
                return int(Exit.USAGE)
            except click.ClickException as exc:
                exc.show()
                return exc.exit_code
            except click.Abort:
                click.echo("queen: interrupted", err=True)
                return int(Exit.INTERRUPTED)

    @click.group(
        cls=Queen,
        aliases=ALIASES,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    @click.version_option(
        package_version(), "--version", prog_name="queen", message="%(prog)s %(version)s"
    )
    @functools.partial(with_options, options=connection_options(top=True))
    def queen(**_options: Any) -> None:
        """Queen on Trio: a partitioned, durable message broker.

        `queen serve` runs the broker and `queen import` copies an original Queen database;
        the other commands operate a running one through its HTTP API (QUEEN_URL or
        QUEEN_SERVER, QUEEN_TOKEN). queenctl's commands, flags and output formats work too.
        Exit statuses: 0 ok, 1 usage error, 2 the broker failed or is unreachable, 3
        authentication or role refused, 4 nothing to do (no message, nothing to push), 5
        items refused (a failed push item, a refused ack), 130 interrupted."""

    for command in (*SERVICE_COMMANDS.values(), *COMMANDS):
        queen.add_command(command)
    return queen


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``queen serve`` (every setting is a flag, an environment variable and a
default; ``queen serve --help`` lists them all; ``--check`` checks them and exits), ``queen
import`` (:mod:`queen.migrate.command`), ``queen --version``, and the operator commands of
:mod:`queen.ctl` (``queen --help`` lists them)."""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from queen.settings import Settings, describe, parse_value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queen", description="Queen on Trio: a partitioned, durable message broker"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the broker",
        description="Run the broker. Flags override environment variables, which override "
        "the defaults.",
    )
    for name, env, _kind, default, text in describe():
        flag = "--" + name.replace("_", "-")
        serve.add_argument(
            flag,
            dest=name,
            type=_flag_type(name),
            default=None,
            metavar=env,
            help=f"{text} [env {env}; default {shown_default(default)}]",
        )
    serve.add_argument(
        "--check",
        action="store_true",
        help="check the settings, the database, its schema and the spool directory, print "
        "each check, then exit (0 when every check passes) instead of serving",
    )
    from queen.migrate.command import add_parser as add_import

    add_import(commands)
    return parser


def shown_default(default: object) -> str:
    """How ``--help`` shows a default: ``(unset)``, ``true``/``false``, or the value."""
    if default is None:
        return "(unset)"
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


def _flag_type(name: str) -> Callable[[str], Any]:
    def parse(raw: str) -> Any:
        try:
            return parse_value(name, raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["serve"]:
            return serve_main(args[1:])
        if args[:1] == ["import"]:
            return import_main(args[1:])
        return _commands().main(args, prog_name="queen", standalone_mode=False) or 0
    except KeyboardInterrupt:  # Ctrl-C before a command took over its signals
        print("queen: interrupted", file=sys.stderr)
        return 130


def _commands() -> Any:
    """``queen``: ``serve`` and ``import`` beside the operator commands. Failures print one
    line and give the exit statuses of :class:`queen.ctl.Exit`; a usage error is 1."""
    import click

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

    @queen.command(
        "serve",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    @click.argument("flags", nargs=-1, type=click.UNPROCESSED)
    def serve(flags: tuple[str, ...]) -> int:
        """Run the broker (queen serve --help lists its settings; --check checks them)."""
        return serve_main(list(flags))

    @queen.command(
        "import",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    @click.argument("flags", nargs=-1, type=click.UNPROCESSED)
    def import_(flags: tuple[str, ...]) -> int:
        """Import an original Queen database (queen import --help lists its options)."""
        return import_main(list(flags))

    for command in COMMANDS:
        queen.add_command(command)
    return queen


def import_main(argv: Sequence[str]) -> int:
    from queen.migrate.command import main as run_import

    return run_import(_parser().parse_args(["import", *argv]))


def serve_main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(["serve", *argv])
    check = bool(args.check)
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "check")}
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


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``queen serve``. Every setting is a flag, an environment variable and a
default; ``queen serve --help`` lists them all."""

from __future__ import annotations

import argparse
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
    args = _parser().parse_args(argv)
    if args.command == "import":
        from queen.migrate.command import main as import_main

        return import_main(args)
    overrides = {k: v for k, v in vars(args).items() if k != "command"}
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
    from queen.storage.postgres import ForeignSchemaError

    try:
        run(settings)
    except (StartupError, ForeignSchemaError, DataDirInUse) as exc:
        print(f"queen: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``queen serve``. Every setting is a flag, an environment variable and a
default; ``queen serve --help`` lists them all."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from queen.settings import Settings, describe


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
    for name, env, kind, default, text in describe():
        flag = "--" + name.replace("_", "-")
        shown = "(unset)" if default is None else default
        serve.add_argument(
            flag,
            dest=name,
            type=kind,
            default=None,
            metavar=env,
            help=f"{text} [env {env}; default {shown}]",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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

    try:
        run(settings)
    except StartupError as exc:
        print(f"queen: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``queen import --from URL [--dry-run] [--batch-size N]``.

The target is the database ``queen serve`` would use (``DATABASE_URL``, the ``PG_*``
settings, or the embedded default). Exit status: 0 done (or, with ``--dry-run``, planned),
1 failed part way (run it again: it continues where it stopped), 2 refused (nothing written),
130 interrupted (Ctrl-C or SIGTERM: it stops after the batch being written; run it again to
continue).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, TextIO

# Kept light: `queen --help` imports this module; the import's own modules load in main().


def add_parser(commands: Any) -> None:
    """Add ``import`` to the ``queen`` command's subparsers."""
    parser = commands.add_parser(
        "import",
        help="copy an original Queen database into this broker's database",
        description="Copy the queues (with their options), partitions, messages, consumer "
        "group positions and dead letters of an original Queen database into the database "
        "this broker is configured for (DATABASE_URL, PG_* or the embedded default). "
        "Safe to run again: it continues where it stopped and imports nothing twice.",
    )
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="postgresql:// URL of the original Queen database (read only)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="report what would be imported (counts per queue) and write nothing",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive,
        default=1000,
        metavar="N",
        help="messages per target transaction [default 1000]",
    )


def _positive(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import psycopg
    import trio

    from queen.migrate.progress import progress_for
    from queen.migrate.run import Importer, ImportInterrupted, ImportOptions, ImportRefused
    from queen.settings import Settings
    from queen.storage.database import open_database
    from queen.storage.embedded import DataDirInUse
    from queen.supervision import stop_signals

    out = out if out is not None else sys.stdout
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"queen import: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    progress = progress_for(sys.stderr)

    importer: list[Importer] = []

    def interrupted() -> None:
        progress.say("interrupted: stopping after the batch being written")
        for running in importer:
            running.interrupt()

    async def run() -> Any:
        with stop_signals(interrupted) as stop:
            async with open_database(settings) as db:
                options = ImportOptions(
                    source_url=args.source,
                    target_conninfo=db.conninfo,
                    dry_run=args.dry_run,
                    batch_size=args.batch_size,
                    encryption_key=settings.encryption_key,
                )
                importer.append(Importer(options, progress))
                if stop.is_set():  # while the database started
                    importer[0].interrupt()
                return await trio.to_thread.run_sync(importer[0].run)

    try:
        report = trio.run(run)
    except (ImportRefused, DataDirInUse) as exc:
        print(f"queen import: {exc}", file=sys.stderr)
        return 2
    except ImportInterrupted as exc:
        print(
            f"queen import: interrupted; {exc.messages} messages were imported by this run "
            "and are kept: run it again to continue where it stopped",
            file=sys.stderr,
        )
        return 130
    except psycopg.Error as exc:
        text = str(exc).strip().splitlines()
        print(
            f"queen import: failed: {text[0] if text else type(exc).__name__}; "
            "run it again to continue where it stopped",
            file=sys.stderr,
        )
        return 1
    from queen.migrate.report import render

    out.write(render(report))
    out.flush()
    return 0

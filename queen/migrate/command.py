"""``queen import --from URL [--dry-run] [--batch-size N]``.

The target is the database ``queen serve`` would use (``DATABASE_URL``, the ``PG_*``
settings, or the embedded default). Exit status: 0 done (or, with ``--dry-run``, planned),
1 failed part way (run it again: it continues where it stopped), 2 refused or a command line
it cannot parse (nothing written), 130 interrupted (Ctrl-C or SIGTERM: it stops after the
batch being written; run it again to continue).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import click

# Kept light: `queen --help` imports this module; the import's own modules load in main().


@click.command(
    "import",
    short_help="Import an original Queen database (queen import --help lists its options).",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--from",
    "source",
    required=True,
    metavar="URL",
    help="postgresql:// URL of the original Queen database (read only)",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="report what would be imported (counts per queue) and write nothing",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=1000,
    metavar="N",
    help="messages per target transaction [default 1000]",
)
def command(source: str, dry_run: bool, batch_size: int) -> int:
    """Copy the queues (with their options), partitions, messages, consumer group positions
    and dead letters of an original Queen database into the database this broker is
    configured for (DATABASE_URL, PG_* or the embedded default). Safe to run again: it
    continues where it stopped and imports nothing twice."""
    return main(source, dry_run=dry_run, batch_size=batch_size)


def main(source: str, *, dry_run: bool, batch_size: int, out: TextIO | None = None) -> int:
    """Run the import; its exit status."""
    import psycopg
    import trio

    from queen.migrate.progress import progress_for
    from queen.migrate.run import Importer, ImportInterrupted, ImportOptions, ImportRefused
    from queen.settings import Settings
    from queen.storage.database import missing_database, open_database
    from queen.storage.embedded import DataDirInUse
    from queen.supervision import stop_signals

    out = out if out is not None else sys.stdout
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"queen import: {exc}", file=sys.stderr)
        return 2
    missing = missing_database(settings)
    if missing is not None:
        print(f"queen import: {missing}", file=sys.stderr)
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
                    source_url=source,
                    target_conninfo=db.conninfo,
                    dry_run=dry_run,
                    batch_size=batch_size,
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

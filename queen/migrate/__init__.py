"""``queen import``: copy an original Queen database into this broker's schema.

:mod:`queen.migrate.plan` works out what to write from what was read (pure),
:mod:`queen.migrate.run` drives the phases (queues and partitions, messages in batches,
positions and dead letters) over the SQL of :mod:`queen.storage.original` and
:mod:`queen.storage.importer`,
:mod:`queen.migrate.progress` shows how far it is, and :mod:`queen.migrate.command` is the
command line (exit status 0 done, 1 failed and resumable, 2 refused).
"""

from queen.migrate.command import command, main

__all__ = ["command", "main"]

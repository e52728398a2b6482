"""Choose the database: ``DATABASE_URL`` if set, else an embedded PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import trio

from queen.settings import Settings
from queen.storage.embedded import EmbeddedPostgres

log = logging.getLogger("queen.storage")


def redact(url: str) -> str:
    """``url`` without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


@asynccontextmanager
async def open_database(settings: Settings) -> AsyncIterator[tuple[str, str]]:
    """Yield ``(conninfo, description)``; an embedded server is stopped on exit if we started
    it."""
    if settings.database_url:
        yield settings.database_url, redact(settings.database_url)
        return
    server = EmbeddedPostgres(settings.pg_data_dir)
    conninfo = await trio.to_thread.run_sync(server.start)
    try:
        yield conninfo, server.describe()
    finally:
        if server.owned:
            with trio.CancelScope(shield=True):
                log.info("stopping the embedded PostgreSQL")
                await trio.to_thread.run_sync(server.stop)

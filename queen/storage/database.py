"""Choose the database: ``DATABASE_URL`` if set, else ``PG_HOST`` with ``PG_PORT``,
``PG_USER``, ``PG_PASSWORD`` and ``PG_DB`` (the original broker's settings), else an embedded
PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote, urlsplit, urlunsplit

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


def external_database(settings: Settings) -> tuple[str, str] | None:
    """``(conninfo, description)`` of the external database the settings name, or None when
    the embedded server is to be used. The description has no password and says which
    settings chose the database."""
    if settings.database_url:
        source = "DATABASE_URL" + ("; PG_HOST ignored" if settings.pg_host else "")
        return settings.database_url, f"{redact(settings.database_url)} ({source})"
    if settings.pg_host:
        url = pg_settings_url(settings)
        return url, f"{redact(url)} (PG_HOST, PG_PORT, PG_USER, PG_DB)"
    return None


def pg_settings_url(settings: Settings) -> str:
    """A connection URL from the ``PG_*`` settings; a host starting with ``/`` is a Unix
    socket directory."""
    assert settings.pg_host is not None
    raw = settings.pg_host
    ipv6 = ":" in raw and not raw.startswith("/")
    host = f"[{raw}]" if ipv6 else quote(raw, safe="")
    user = quote(settings.pg_user, safe="")
    password = quote(settings.pg_password, safe="")
    auth = f"{user}:{password}@" if settings.pg_password else f"{user}@"
    return f"postgresql://{auth}{host}:{settings.pg_port}/{quote(settings.pg_db, safe='')}"


@asynccontextmanager
async def open_database(settings: Settings) -> AsyncIterator[tuple[str, str]]:
    """Yield ``(conninfo, description)``; an embedded server is stopped on exit if we started
    it."""
    external = external_database(settings)
    if external is not None:
        yield external
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

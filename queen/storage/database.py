"""Choose the database: ``DATABASE_URL`` if set, else ``PG_HOST`` with ``PG_PORT``,
``PG_USER``, ``PG_PASSWORD`` and ``PG_DB`` (the original broker's settings), else an embedded
PostgreSQL (when it is installed: the broker's ``embedded`` extra).

An embedded server is this process's to keep alive: :class:`Database` then carries an
:class:`EmbeddedWatch`, whose ``run`` is a loop for :class:`queen.supervision.Loops`
(``embedded-postgres``) that waits for the server's postmaster to exit and raises when it
does, so the supervisor logs and counts it and starts the loop again, which starts the server
again (with the supervisor's back-off while that fails) and calls ``on_restarted`` (the broker
probes the database at once). The broker meanwhile spools, and replays once the health probe
sees the server answer.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import trio

from queen.errors import QueenError
from queen.settings import Settings
from queen.storage.embedded import INSTALL_EXTRA, EmbeddedPostgres, embedded_available

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


NO_DATABASE = (
    "no database is set (DATABASE_URL, or PG_HOST) and the embedded PostgreSQL is not "
    f"installed: set DATABASE_URL, or {INSTALL_EXTRA}"
)


def missing_database(settings: Settings) -> str | None:
    """Why the settings leave no database to use (none named, and the embedded server not
    installed), or None when there is one."""
    if external_database(settings) is None and not embedded_available():
        return NO_DATABASE
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


@dataclass(frozen=True, slots=True)
class Database:
    """The database a broker uses: how to connect, what to call it in logs, and (an embedded
    server) the loop that keeps it running."""

    conninfo: str
    description: str
    embedded: EmbeddedWatch | None = None


class EmbeddedServerExited(QueenError, RuntimeError):
    """The embedded PostgreSQL's postmaster exited while the broker ran."""


@asynccontextmanager
async def open_database(settings: Settings) -> AsyncIterator[Database]:
    """Yield the :class:`Database`. An embedded server's data directory is locked for this
    process (:class:`~queen.storage.embedded.DataDirInUse` if another holds it), and the
    server is stopped on exit if this process started or adopted it."""
    external = external_database(settings)
    if external is not None:
        yield Database(*external)
        return
    server = EmbeddedPostgres(settings.pg_data_dir)
    await trio.to_thread.run_sync(server.lock)
    try:
        conninfo = await trio.to_thread.run_sync(server.start)
        yield Database(conninfo, server.describe(), embedded=EmbeddedWatch(server))
    finally:
        with trio.CancelScope(shield=True):
            if server.owned:
                log.info("stopping the embedded PostgreSQL")
                await trio.to_thread.run_sync(server.stop)
            server.unlock()


class EmbeddedWatch:
    """Keeps one embedded server running: a loop for :class:`queen.supervision.Loops`.

    Each run starts the server if it is not running (the first run finds it running), reports
    ready, and waits for its postmaster to exit; then it raises :class:`EmbeddedServerExited`.
    Cancelled, it leaves the server as it is (the caller stops it).
    """

    def __init__(self, server: EmbeddedPostgres, *, poll_s: float = 0.5) -> None:
        self.server = server
        self.poll_s = poll_s
        self.restarts = 0
        # Called once a restart has succeeded (the broker probes the database at once).
        self.on_restarted: Callable[[], None] = lambda: None

    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        server = self.server
        if not await trio.to_thread.run_sync(server.is_running):
            log.warning("starting the embedded PostgreSQL again (%s)", server.data_dir)
            started = trio.current_time()
            try:
                await trio.to_thread.run_sync(server.start)
            except RuntimeError as exc:  # its message ends with the server log's tail
                raise EmbeddedServerExited(
                    f"the embedded PostgreSQL does not start yet: {_reason(str(exc))} "
                    f"(see {server.log_file})"
                ) from exc
            server.owned = True
            self.restarts += 1
            log.warning(
                "the embedded PostgreSQL is running again after %.1f s (restart %d)",
                trio.current_time() - started,
                self.restarts,
            )
            self.on_restarted()
        pid = server.postmaster_pid()
        if pid is None:
            raise EmbeddedServerExited(f"no postmaster.pid in {server.data_dir}")
        task_status.started()
        await wait_for_exit(pid, self.poll_s)
        raise EmbeddedServerExited(
            f"the embedded PostgreSQL (postmaster pid {pid}) exited; starting it again"
        )


async def wait_for_exit(pid: int, poll_s: float) -> None:
    """Return once process ``pid`` (not necessarily our child) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError as exc:  # no pidfd (old kernel, seccomp): look every poll_s
        if exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
            raise
        while True:  # nothing wakes us when another process exits
            if not _alive(pid):
                return
            await trio.sleep(poll_s)
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def _reason(message: str) -> str:
    """The last FATAL line of a failed start's message, or its first line."""
    lines = message.splitlines()
    fatal = [line.split("FATAL:", 1)[1].strip() for line in lines if "FATAL:" in line]
    return fatal[-1] if fatal else lines[0] if lines else message


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

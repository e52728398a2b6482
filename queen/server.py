"""``queen serve``: the Quart-Trio app over one broker, served by :mod:`queen.serving`.

One process is one broker: database (embedded or external), broker, HTTP server, in that
order, inside one ``trio.run``. SIGINT/SIGTERM start a graceful shutdown: the server stops
accepting, closes idle connections and finishes its requests, then the broker drains, then
the embedded PostgreSQL (if this process started it) stops.

With ``workers > 1`` the parent starts the database once, then runs that many broker processes
that share the listening port through ``SO_REUSEPORT`` and the database through the URL. Every
setting the parent was given (flags included) reaches the workers through their environment.
The parent forwards SIGINT/SIGTERM to the workers; if a worker exits on its own, the parent
stops the others and exits (with an error if that worker failed), so a process manager sees it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

import trio

from queen.auth import AccessGate, AuthConfigError, build_gate
from queen.broker import Broker
from queen.gctune import tune_gc
from queen.http.app import create_app
from queen.lifecycle import open_broker
from queen.serving import serve_app
from queen.settings import Settings, describe
from queen.spool import files
from queen.storage.database import open_database

log = logging.getLogger("queen.server")


class AcceptErrorThrottle(logging.Filter):
    """Out of descriptors, Trio's accept loop waits 0.1 s and retries, logging every retry with
    its traceback. Keep the first record, then at most one line per ``period_s`` saying how
    many were left out."""

    def __init__(self, period_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._period_s = period_s
        self._clock = clock
        self._last: float | None = None
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self._period_s:
            self._dropped += 1
            return False
        if self._dropped:
            record.msg = f"{record.msg} ({self._dropped} more since the last report)"
            record.exc_info, record.exc_text = None, None
        self._last, self._dropped = now, 0
        return True


def throttle_accept_errors() -> None:
    """Install :class:`AcceptErrorThrottle` on Trio's accept loop logger (once)."""
    logger = logging.getLogger("trio.serve_listeners")
    if not any(isinstance(f, AcceptErrorThrottle) for f in logger.filters):
        logger.addFilter(AcceptErrorThrottle())


class StartupError(RuntimeError):
    """The broker cannot start with these settings; the message names the setting."""


def check_spool_dir(settings: Settings) -> Path:
    path = Path(settings.file_buffer_dir)
    try:
        files.ensure_writable(path)
    except OSError as exc:
        raise StartupError(
            f"FILE_BUFFER_DIR={settings.file_buffer_dir!r} cannot be used: {exc.strerror or exc}"
        ) from exc
    return path


def check_auth(settings: Settings) -> AccessGate:
    """The access gate the settings describe; a misconfiguration is a :class:`StartupError`."""
    try:
        return build_gate(settings)
    except AuthConfigError as exc:
        raise StartupError(str(exc)) from exc


def listen_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


async def serve(
    settings: Settings, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run one broker process until SIGINT/SIGTERM; ``task_status`` gets the bound port."""
    gate = check_auth(settings)
    spool = check_spool_dir(settings)
    async with open_broker(settings) as broker:
        await gate.warm_up()
        app = create_app(broker, gate=gate)
        throttle_accept_errors()
        sock = listen_socket(settings.host, settings.port)
        port = sock.getsockname()[1]
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, stop)
            await nursery.start(
                partial(
                    serve_app,
                    app,
                    settings,
                    sock,
                    shutdown_trigger=partial(_shutdown_trigger, stop, broker),
                )
            )
            worker = os.environ.get("QUEEN_WORKER_ID", "0")
            log.info(
                "queen listening on http://%s:%d (worker %s); database: %s; spool: %s",
                settings.host,
                port,
                worker,
                broker.database,
                spool,
            )
            log.info("authentication: %s", gate.describe())
            task_status.started(port)
            await stop.wait()
            log.info("shutting down: finishing requests in flight")
        nursery.cancel_scope.cancel()


async def _shutdown_trigger(stop: trio.Event, broker: Broker) -> None:
    """Hypercorn's graceful shutdown starts when this returns; long polls answer at once."""
    await stop.wait()
    broker.stop_waiting()


async def _stop_on_signal(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            stop.set()
            return


def worker_environ(
    settings: Settings, conninfo: str, worker: int, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of worker ``worker``: ``base`` (default: ours) plus every setting."""
    env = dict(os.environ if base is None else base)
    for name, variable, _kind, _default, _help in describe():
        value = getattr(settings, name)
        if value is None:
            env.pop(variable, None)
        elif isinstance(value, bool):
            env[variable] = "true" if value else "false"
        else:
            env[variable] = str(value)
    env["DATABASE_URL"] = conninfo
    env.pop("PG_HOST", None)  # the URL above is the database, whichever settings named it
    env["QUEEN_WORKERS"] = "1"
    env["QUEEN_WORKER_ID"] = str(worker)
    return env


async def serve_workers(settings: Settings) -> None:
    """Start the database once, then ``settings.workers`` broker processes on one port.

    Returns when every worker has stopped. Raises :class:`StartupError` if a worker failed
    (exited with an error without being asked to stop); the others are stopped first.
    """
    check_auth(settings)
    check_spool_dir(settings)
    async with open_database(settings) as (conninfo, description):
        log.info(
            "queen starting %d workers on http://%s:%d; database: %s; spool: %s",
            settings.workers,
            settings.host,
            settings.port,
            description,
            settings.file_buffer_dir,
        )
        stopping = False
        failure: list[str] = []
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            children: list[trio.Process] = []
            try:
                for i in range(settings.workers):
                    children.append(
                        await trio.lowlevel.open_process(
                            [sys.executable, "-m", "queen.cli", "serve", "--workers", "1"],
                            env=worker_environ(settings, conninfo, i),
                        )
                    )

                async def forward() -> None:
                    nonlocal stopping
                    async for signum in signals:
                        stopping = True
                        for child in children:
                            if child.returncode is None:
                                child.send_signal(signum)

                async def watch(worker: int, child: trio.Process) -> None:
                    nonlocal stopping
                    code = await child.wait()
                    if stopping:
                        return
                    stopping = True
                    if code != 0:
                        failure.append(f"worker {worker} exited with code {code}")
                    log.warning("worker %d exited (code %d); stopping the others", worker, code)
                    for other in children:
                        if other.returncode is None:
                            other.terminate()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(forward)
                    async with trio.open_nursery() as watchers:
                        for i, child in enumerate(children):
                            watchers.start_soon(watch, i, child)
                    nursery.cancel_scope.cancel()
            finally:
                for child in children:
                    if child.returncode is None:
                        child.terminate()
                with trio.CancelScope(shield=True):
                    for child in children:
                        await child.wait()
    if failure:
        raise StartupError(failure[0])


def run(settings: Settings) -> None:
    if settings.workers > 1 and not os.environ.get("QUEEN_WORKER_ID"):
        trio.run(serve_workers, settings)
    else:
        tune_gc(settings.gc_gen0_threshold)
        trio.run(serve, settings)

"""``queen serve``: Hypercorn (Trio worker) serving the Quart-Trio app over one broker.

One process is one broker: database (embedded or external), broker, HTTP server, in that
order, inside one ``trio.run``. SIGINT/SIGTERM start a graceful shutdown: Hypercorn stops
accepting and finishes its requests, then the broker drains, then the embedded PostgreSQL (if
this process started it) stops.

With ``workers > 1`` the parent starts the database once, then runs that many broker processes
that share the listening port through ``SO_REUSEPORT`` and the database through the URL.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from functools import partial
from pathlib import Path

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from queen.broker import Broker, open_broker
from queen.http.app import create_app
from queen.settings import Settings
from queen.storage.database import open_database

log = logging.getLogger("queen.server")


class StartupError(RuntimeError):
    """The broker cannot start with these settings; the message names the setting."""


def check_spool_dir(settings: Settings) -> Path:
    path = Path(settings.file_buffer_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".queen-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StartupError(
            f"FILE_BUFFER_DIR={settings.file_buffer_dir!r} cannot be used: {exc.strerror or exc}"
        ) from exc
    return path


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


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = settings.shutdown_grace_s
    config.keep_alive_timeout = 75
    config.backlog = 1024
    return config


async def serve(
    settings: Settings, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run one broker process until SIGINT/SIGTERM; ``task_status`` gets the bound port."""
    spool = check_spool_dir(settings)
    async with open_broker(settings) as broker:
        app = create_app(broker)
        config = hypercorn_config(settings)
        sock = listen_socket(settings.host, settings.port)
        port = sock.getsockname()[1]
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, stop)
            await nursery.start(
                partial(
                    worker_serve,
                    wrap_app(app, config.wsgi_max_body_size, None),
                    config,
                    sockets=Sockets([], [sock], []),
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


async def serve_workers(settings: Settings) -> None:
    """Start the database once, then ``settings.workers`` broker processes on one port."""
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
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                children: list[trio.Process] = []
                for i in range(settings.workers):
                    env = {**os.environ, "DATABASE_URL": conninfo, "QUEEN_WORKER_ID": str(i)}
                    children.append(
                        await trio.lowlevel.open_process(
                            [sys.executable, "-m", "queen.cli", "serve", "--workers", "1"],
                            env=env,
                        )
                    )

                async def forward() -> None:
                    async for signum in signals:
                        for child in children:
                            if child.returncode is None:
                                child.send_signal(signum)

                nursery.start_soon(forward)
                try:
                    for child in children:
                        await child.wait()
                finally:
                    for child in children:
                        if child.returncode is None:
                            child.terminate()
                    with trio.CancelScope(shield=True):
                        for child in children:
                            await child.wait()
                nursery.cancel_scope.cancel()


def run(settings: Settings) -> None:
    if settings.workers > 1 and not os.environ.get("QUEEN_WORKER_ID"):
        trio.run(serve_workers, settings)
    else:
        trio.run(serve, settings)

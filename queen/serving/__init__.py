"""Serving the HTTP app: Hypercorn's HTTP/1.1 machinery, our connection lifecycle.

:func:`serve_app` accepts connections on one listening socket and serves each with
:class:`~queen.serving.connection.Connection` (keep-alive and header deadlines, the end of the
client's side acted on, lingering close) and the app behind
:class:`~queen.serving.guard.ConnectionGuard` (Quart-Trio kept out of Hypercorn's close path,
request body bytes bounded by the process's :class:`~queen.budget.ByteBudget`), within the
process's :class:`ConnectionCapacity` (a cap on connections that keeps descriptors in reserve,
the longest idle connection shed to make room). A request's scope carries its connection's
:class:`ClientEnd` (:func:`client_end`), so that a long wait can stop when the client ends its
side.
"""

from __future__ import annotations

import logging
import resource
import socket
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState, LifespanState

from queen.budget import ByteBudget
from queen.metrics import Metrics
from queen.serving.accept import accept_connections
from queen.serving.capacity import (
    ConnectionCapacity,
    default_max_connections,
    raise_descriptor_limit,
)
from queen.serving.connection import ClientEnd, Connection, client_end
from queen.serving.guard import ConnectionGuard
from queen.serving.inbox import Listener, request_listener
from queen.settings import Settings

__all__ = [
    "ByteBudget",
    "ClientEnd",
    "ConnectionCapacity",
    "ConnectionGuard",
    "Listener",
    "capacity_for",
    "client_end",
    "hypercorn_config",
    "raise_descriptor_limit",
    "request_listener",
    "serve_app",
]


def capacity_for(settings: Settings, metrics: Metrics | None = None) -> ConnectionCapacity:
    """The connection capacity of this process: ``QUEEN_MAX_CONNECTIONS``, or (0) the open
    files limit less a reserve."""
    cap = settings.max_connections
    if not cap:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = default_max_connections(soft)
    return ConnectionCapacity(cap, metrics)


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = settings.shutdown_grace_s
    config.keep_alive_timeout = settings.keep_alive_timeout_s
    config.backlog = 1024
    return config


async def serve_app(
    app: ASGIFramework,
    settings: Settings,
    sock: socket.socket,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    capacity: ConnectionCapacity | None = None,
    budget: ByteBudget | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on the listening socket ``sock`` until ``shutdown_trigger`` returns.

    ``budget``: the process's byte budget, shared with what else charges it (the broker's pop
    answers); without one, a budget of ``max_decoding_bytes`` for request bodies alone.

    Ready (``task_status.started()``) once the app's lifespan has started and the socket is
    accepting. When ``shutdown_trigger`` returns, accepting stops, idle connections are closed
    at once, and the others close after their current response; whatever is left after
    ``shutdown_grace_s`` is cancelled. Returns when every connection is closed and the app's
    lifespan has ended.
    """
    config = hypercorn_config(settings)
    if capacity is None:
        capacity = capacity_for(settings)
    if budget is None:
        budget = ByteBudget(settings.max_decoding_bytes)
    wrapped = ASGIWrapper(ConnectionGuard(app, budget, settings.max_body_bytes))
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            handler = partial(
                Connection,
                wrapped,
                config,
                context,
                ConnectionState(lifespan_state.copy()),
                header_timeout_s=settings.header_timeout_s,
                body_timeout_s=settings.body_timeout_s,
                capacity=capacity,
            )
            try:
                async with trio.open_nursery() as accepting:
                    await accepting.start(
                        accept_connections, listener, handler, connections, capacity
                    )
                    task_status.started()
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
            finally:
                await context.terminated.set()
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()

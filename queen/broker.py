"""The broker object and :func:`open_broker`, the one way to run it (HTTP server or library).

::

    async with queen.open_broker(queen.Settings(database_url=...)) as broker:
        results = await broker.push([{"queue": "orders", "payload": {"id": 1}}])

``open_broker`` opens the database (an embedded PostgreSQL when no URL is set), migrates the
schema, starts the batcher and the supervisor in a nursery of its own, and yields the broker.
On exit it shuts down in two phases: new pushes are refused at once, pushes already accepted
get ``shutdown_grace_s`` to finish, then everything left is cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from queen.actors.messages import PushOutcome, PushRequest
from queen.batcher import Batcher
from queen.intake import PreparedPush, prepare_push
from queen.metrics import Metrics
from queen.model import PushResultDict, Status
from queen.settings import Settings
from queen.storage.base import Store, StoreError
from queen.storage.database import open_database
from queen.storage.pool import ConnectionPool
from queen.storage.postgres import PgStore
from queen.supervisor import Supervisor

log = logging.getLogger("queen.broker")


class BrokerClosed(RuntimeError):
    """The broker is shutting down and accepts no new work."""


class Broker:
    """The push path as an object. The HTTP app is a thin layer over this."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        batcher: Batcher,
        supervisor: Supervisor,
        metrics: Metrics,
        *,
        database: str,
    ) -> None:
        self.settings = settings
        self.store = store
        self.batcher = batcher
        self.supervisor = supervisor
        self.metrics = metrics
        self.database = database
        self._closing = False
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    @property
    def closing(self) -> bool:
        return self._closing

    async def push(
        self, items: Sequence[dict[str, Any]] | list[Any], producer_sub: str | None = None
    ) -> list[PushResultDict]:
        """Push ``items`` (the JSON items of ``POST /api/v1/push``) and return one result per
        item, in order, exactly as the HTTP route answers.

        ``producer_sub`` is the trusted producer identity stored with every message (the HTTP
        layer passes the validated token's ``sub``). Raises :class:`queen.model.InvalidPush`
        for a body that breaks a rule (nothing is stored) and :class:`BrokerClosed` during
        shutdown.
        """
        return await self.push_prepared(prepare_push(list(items)), producer_sub)

    async def push_prepared(
        self, prepared: PreparedPush, producer_sub: str | None = None
    ) -> list[PushResultDict]:
        if self._closing:
            raise BrokerClosed("broker is shutting down")
        self.metrics.push_requests += 1
        self.metrics.push_items += prepared.count
        self._enter()
        try:
            requests: list[PushRequest] = []
            for batch in prepared.batches:
                request = PushRequest(
                    message_ids=batch.message_ids,
                    transaction_ids=batch.transaction_ids,
                    payloads=batch.payloads,
                    producer_sub=producer_sub,
                    trace_ids=batch.trace_ids,
                )
                await self.supervisor.submit(batch.key, request)
                requests.append(request)
            results: list[PushResultDict | None] = [None] * prepared.count
            for batch, request in zip(prepared.batches, requests, strict=True):
                outcome = await request.reply.wait()
                self._fill(results, batch.key.queue, batch.key.partition, batch, outcome)
            return results  # type: ignore[return-value]
        finally:
            self._leave()

    def _fill(
        self,
        results: list[PushResultDict | None],
        queue: str,
        partition: str,
        batch: Any,
        outcome: PushOutcome,
    ) -> None:
        status = outcome.status.value
        duplicates = outcome.duplicates
        m = self.metrics
        m.push_items_duplicate += len(duplicates)
        rest = len(batch.indexes) - len(duplicates)
        if outcome.status is Status.QUEUED:
            m.push_items_queued += rest
        elif outcome.status is Status.BUFFERED:
            m.push_items_buffered += rest
        else:
            m.push_items_failed += rest
        for pos, index in enumerate(batch.indexes):
            named = duplicates.get(pos) if duplicates else None
            message_id = named or batch.message_ids[pos]
            transaction_id = batch.transaction_ids[pos]
            results[index] = {
                "index": index,
                "message_id": message_id,
                "messageId": message_id,
                "transaction_id": transaction_id,
                "transactionId": transaction_id,
                "queueName": queue,
                "partition": partition,
                "status": "duplicate" if named else status,
            }

    def _enter(self) -> None:
        self._in_flight += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def health(self) -> tuple[bool, dict[str, Any]]:
        """Ask the database; return (healthy, the /health body)."""
        healthy = False
        with trio.move_on_after(max(1.0, self.settings.db_connect_timeout_s)):
            try:
                await self.store.ping()
                healthy = True
            except StoreError:
                healthy = False
        body: dict[str, Any] = {
            "status": "healthy" if healthy else "unhealthy",
            "database": "connected" if healthy else "disconnected",
            "server": "queen-trio",
            "version": _version(),
            "activePartitions": self.supervisor.active_partitions,
        }
        return healthy, body

    async def _drain(self) -> None:
        """Phase two of shutdown: wait for accepted pushes to finish."""
        self._closing = True
        await self._idle.wait()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("queen-trio")
    except PackageNotFoundError:
        return "0+unknown"


@asynccontextmanager
async def open_broker(
    settings: Settings | None = None, *, store: Store | None = None
) -> AsyncIterator[Broker]:
    """Run a broker inside the caller's Trio program; see the module docstring.

    ``store`` replaces the database entirely (tests drive actors with an in-memory store).
    """
    settings = settings or Settings.from_env()
    async with _open_store(settings, store) as (opened, database):
        metrics = Metrics()
        batcher = Batcher(
            opened,
            metrics,
            concurrency=settings.write_concurrency,
            max_items=settings.batch_max_items,
            max_bytes=settings.batch_max_bytes,
            linger_s=settings.batch_linger_ms / 1000,
            queue_size=settings.batch_queue_size,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(batcher.run)
            supervisor = Supervisor(opened, batcher, settings, metrics)
            await nursery.start(supervisor.run)
            broker = Broker(settings, opened, batcher, supervisor, metrics, database=database)
            try:
                yield broker
            finally:
                with trio.move_on_after(settings.shutdown_grace_s) as grace:
                    grace.shield = True
                    await broker._drain()
                if grace.cancelled_caught:
                    log.warning("shutdown grace period over; cancelling unfinished pushes")
                nursery.cancel_scope.cancel()


@asynccontextmanager
async def _open_store(settings: Settings, store: Store | None) -> AsyncIterator[tuple[Store, str]]:
    if store is not None:
        yield store, type(store).__name__
        return
    async with open_database(settings) as (conninfo, description):
        pool = ConnectionPool(
            conninfo,
            size=settings.db_pool_size,
            connect_timeout_s=settings.db_connect_timeout_s,
            statement_timeout_ms=settings.db_statement_timeout_ms,
        )
        try:
            pg = PgStore(pool)
            await pg.migrate()
            yield pg, description
        finally:
            with trio.CancelScope(shield=True):
                await pool.aclose()

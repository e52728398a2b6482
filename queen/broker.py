"""The broker: one facade over the services of one broker process, for HTTP and for embedding
programs alike. :func:`queen.lifecycle.open_broker` builds and runs one::

    async with queen.open_broker(queen.Settings(database_url=...)) as broker:
        results = await broker.push([{"queue": "orders", "payload": {"id": 1}}])
        popped = await broker.pop("orders", batch=10)
        await broker.ack(popped.messages)  # typed messages; [m.ack("failed") ...] to nack

The services do the work and own their rules: :attr:`Broker.push_service`
(:class:`queen.push.PushService`), :attr:`Broker.consume`
(:class:`queen.consume.service.ConsumeService`), :attr:`Broker.streams`
(:class:`queen.streams.service.StreamsService`), :attr:`Broker.ops`
(:class:`queen.operations.Operations`) and :attr:`Broker.admin`
(:class:`queen.admin.service.AdminService`). The methods below are the shortcuts an embedding
program uses most; each builds a typed request and hands it to one service.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from queen.actors.supervisor import Supervisor
from queen.admin.service import AdminService
from queen.budget import ByteBudget
from queen.consume import requests
from queen.consume.errors import ConsumeUnavailable, InvalidRequest
from queen.consume.options import parse_options
from queen.consume.policy import subscription_of
from queen.consume.results import (
    AckResult,
    LeaseExtension,
    Message,
    PopResult,
    QueueConfigured,
    QueueDeleted,
    TransactionResult,
)
from queen.consume.service import ConsumeService
from queen.encryption import QueueEncryption
from queen.health import DatabaseHealth
from queen.intake import prepare_push
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.operations import Health, Operations
from queen.push import PushedItem, PushService
from queen.records import (
    QUEUE_MODE,
    AckItem,
    PopRequest,
    QueueOptions,
    TransactionRequest,
    TxAck,
    TxPush,
)
from queen.settings import Settings
from queen.spool import Spool
from queen.storage.base import Store
from queen.storage.retention import PassOutcome, QueueHoldings
from queen.streams.service import StreamsService


class Broker:
    """One broker process's services; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics,
        database: str,
        push_service: PushService,
        ops: Operations,
        admin: AdminService,
        store: Store,
        budget: ByteBudget | None = None,
        consume: ConsumeService | None = None,
        streams: StreamsService | None = None,
    ) -> None:
        self.settings = settings
        # The bytes of request bodies and pop answers this process holds at once (the HTTP
        # server charges bodies to it, the consume side answers)
        self.budget = budget or ByteBudget(settings.max_decoding_bytes)
        self.metrics = metrics
        self.database = database  # what the start-up line calls it (no password)
        self.push_service = push_service
        self.ops = ops
        self.store = store  # the push path's store (tests watch its writes)
        self._consume = consume
        self._streams = streams
        self.admin = admin  # the admin API's and the dashboard's figures

    # --- the services ------------------------------------------------------------------------

    @property
    def consume(self) -> ConsumeService:
        """The consume side; raises :class:`ConsumeUnavailable` on a store other than
        PostgreSQL (the in-memory store of the actor tests)."""
        if self._consume is None:
            raise ConsumeUnavailable("consuming needs the PostgreSQL store")
        return self._consume

    @property
    def streams(self) -> StreamsService:
        """The streams side (``/streams/v1/*``)."""
        if self._streams is None:
            raise ConsumeUnavailable("streaming queries need the PostgreSQL store")
        return self._streams

    # What the operations room reads, for the routes and the dashboard that show it.
    @property
    def supervisor(self) -> Supervisor:
        return self.ops.supervisor

    @property
    def spool(self) -> Spool | None:
        return self.ops.spool

    @property
    def db_health(self) -> DatabaseHealth:
        return self.ops.db_health

    @property
    def maintenance(self) -> MaintenanceSwitch:
        return self.ops.maintenance

    @property
    def encryption(self) -> QueueEncryption:
        return self.ops.encryption

    @property
    def closing(self) -> bool:
        return self.push_service.closing

    # --- pushing -----------------------------------------------------------------------------

    async def push(
        self, items: Sequence[dict[str, Any]], producer_sub: str | None = None
    ) -> list[PushedItem]:
        """Push ``items`` (the JSON items of ``POST /api/v1/push``) and return one result per
        item, in order.

        ``producer_sub`` is the trusted producer identity stored with every message (the HTTP
        layer passes the validated token's ``sub``). Raises :class:`queen.model.InvalidPush`
        for a body that breaks a rule (nothing is stored) and :class:`queen.BrokerClosed`
        during shutdown.
        """
        # (push_prepared straight away: a coroutine fewer to pass through at every wake-up)
        prepared = prepare_push(list(items))
        return (await self.push_service.push_prepared(prepared, producer_sub)).items()

    # --- consuming ---------------------------------------------------------------------------

    async def configure(
        self,
        queue: str,
        options: QueueOptions | dict[str, Any] | None = None,
        *,
        namespace: str | None = None,
        task: str | None = None,
    ) -> QueueConfigured:
        """Create or reconfigure ``queue`` (``POST /api/v1/configure``) with ``options`` (a
        :class:`queen.records.QueueOptions`, or the route's camelCase option names, whose
        missing options go back to their defaults)."""
        return await self.consume.configure(
            queue,
            namespace,
            task,
            options if isinstance(options, QueueOptions) else parse_options(options),
        )

    async def delete_queue(self, queue: str) -> QueueDeleted:
        return await self.consume.delete_queue(queue)

    async def pop(
        self,
        queue: str | None = None,
        partition: str | None = None,
        *,
        namespace: str | None = None,
        task: str | None = None,
        consumer_group: str | None = None,
        batch: int | None = None,
        partitions: int | None = None,
        wait: bool = False,
        timeout_ms: int = 30_000,
        auto_ack: bool = False,
        subscription_mode: str | None = None,
        subscription_from: str | None = None,
        autopilot: bool = False,
    ) -> PopResult:
        """Pop from ``queue`` (one ``partition``, or any), or from every queue matching
        ``namespace``/``task``. ``consumer_group`` None is queue mode. Without ``batch`` a pop
        delivers one message, or with ``autopilot`` as many as the broker chooses, their
        payloads adding up to ``QUEEN_POP_MAX_BYTES`` at most (one message at least). The
        result is empty when nothing was deliverable (by ``timeout_ms`` with ``wait``).
        Raises :class:`queen.consume.AnswersBusy` when the process's byte budget stays full
        (nothing is leased)."""
        try:
            subscription = subscription_of(subscription_mode, subscription_from)
        except ValueError:
            raise InvalidRequest(
                "subscriptionFrom must be 'now' or an ISO-8601 timestamp"
            ) from None
        request = PopRequest(
            queue=queue,
            partition=partition,
            namespace=namespace or "",
            task=task or "",
            consumer_group=consumer_group or QUEUE_MODE,
            batch=batch,
            partitions=partitions,
            wait=wait,
            timeout_ms=timeout_ms,
            auto_ack=auto_ack,
            subscription=subscription,
            autopilot=autopilot,
        )
        result = await self.consume.pop(request)
        result.charge.release()  # the program holds the messages from here
        return result

    async def ack(self, acks: Message | AckItem | Sequence[Message | AckItem]) -> list[AckResult]:
        """Acknowledge popped messages (``completed``), or what :meth:`Message.ack` says of
        them (another status, an error). One result per ack, in order."""
        many = [acks] if isinstance(acks, Message | AckItem) else list(acks)
        return await self.consume.ack([_checked(a) for a in many])

    async def extend_lease(self, lease_id: str, seconds: int | None = None) -> LeaseExtension:
        """Extend a lease by ``seconds`` (default: the queue's lease time)."""
        return await self.consume.extend_lease(lease_id, seconds)

    async def transaction(
        self,
        acks: Sequence[Message | AckItem] = (),
        push: Sequence[dict[str, Any]] = (),
        *,
        required_leases: Sequence[str] | None = None,
        producer_sub: str | None = None,
    ) -> TransactionResult:
        """Ack ``acks`` (popped messages, or what :meth:`Message.ack` says of them) and push
        ``push`` (items as for :meth:`push`, ``traceId`` kept) atomically; the results follow
        that order. ``required_leases`` (default: the leases of ``acks``) must all be live.
        Raises :class:`queen.PartitionsBusy` (nothing applied) when a pushed partition cannot
        be written now."""
        items = [_checked(a) for a in acks]
        if required_leases is None:
            required = list(dict.fromkeys(i.lease_id for i in items if i.lease_id is not None))
        else:
            required = [requests.lease_id(lease) for lease in required_leases]
        prepared = prepare_push(list(push), keep_trace_ids=True) if push else None
        request = TransactionRequest(
            acks=[TxAck(i, item) for i, item in enumerate(items)],
            pushes=[] if prepared is None else [TxPush(len(items), prepared)],
            required_leases=required,
            size=len(items) + (prepared.count if prepared is not None else 0),
        )
        return await self.consume.transaction(request, producer_sub)

    def stop_waiting(self) -> None:
        """Make long-polling pops answer "nothing" now (a server shutting down calls this
        first, so its requests finish promptly)."""
        if self._consume is not None:
            self._consume.stop_waiting()

    # --- operating ---------------------------------------------------------------------------

    async def health(self) -> Health:
        return await self.ops.health()

    async def set_maintenance(self, enabled: bool) -> None:
        await self.ops.set_maintenance(enabled)

    async def wait_spool_empty(self) -> None:
        await self.ops.wait_spool_empty()

    async def run_retention_pass(self) -> PassOutcome:
        return await self.ops.run_retention_pass()

    async def queue_holdings(self, queue: str) -> QueueHoldings | None:
        return await self.ops.queue_holdings(queue)

    async def retention_totals(self) -> dict[str, int]:
        return await self.ops.retention_totals()


def _checked(ack: Message | AckItem) -> AckItem:
    """The ack of a popped message as the pop made it (its group and lease id are the broker's
    own, so there is nothing to check), or a caller's item, checked."""
    if isinstance(ack, Message):
        return ack.ack()
    return requests.checked_ack(ack)

"""The consume side of the broker: configure, pop (with long poll), ack, leases, transactions,
the dead letter queue, consumer groups and the pop maintenance switch.

:class:`ConsumeService` is what :class:`queen.broker.Broker` delegates to. Rules live in SQL
(``queen/storage/consume.sql``) and in the pure modules beside this one; this module owns the
waiting:

- **Long poll.** A waiting pop takes a wake-up ticket for its queue, queries, and if nothing
  was deliverable waits on the ticket until the deadline, re-querying at least every
  ``pop_recheck_ms`` while something is pending behind a lease, a retry delay, a delay or a
  window buffer (which no push announces; sooner when the query said the earliest of them
  ends sooner), and not at all while nothing is pending and the push listener hears the
  other processes. Tickets are fired by this process's committed pushes (a batcher
  commit listener), by transactions and lease-releasing acks here, and by the push listener
  (NOTIFY from every other broker process). A pop whose client leaves is cancelled by the
  HTTP layer (the pop route when the client ends its side, the server when the connection
  breaks); cancellation only ever interrupts the wait, never a database call.
  Waiting pops of the same kind share their re-checks and wake-ups
  (:mod:`queen.consume.looks`): a hundred idle consumers cost one query per re-check, and a
  push of one message two queries, instead of a hundred. They look in turns, oldest first
  (:mod:`queen.consume.turns`), so the pop that has waited longest is served first.
- **Encryption.** Payloads pushed by a transaction to an encrypted queue are sealed before the
  database call; every payload a pop or a dead letter page reads is opened
  (:class:`queen.encryption.QueueEncryption`). A pop that reads a payload it cannot decrypt
  (no key, another key) withholds that partition's messages and releases its lease, so they
  stay stored for a broker with the right key (with autoAck, whose cursor has already moved,
  they are copied to the group's dead letter queue); the other partitions are delivered. If
  nothing is left, the pop fails with :class:`queen.cipher.PayloadUnreadable`.
- **Answer bytes.** A pop's answer is held to ``pop_max_bytes`` of payloads (in SQL, so
  nothing beyond is leased) and charged to the process's :class:`~queen.budget.ByteBudget`,
  which request bodies are charged to too: while a query runs it reserves what its answer may
  take (``pop_max_bytes``, or less when the budget has less room, and the query then reads
  less), and once the messages are read their payload bytes stay charged until whoever sends
  the answer releases :attr:`PopResult.charge`. Queries that hold a reservation are as many
  as the database has connections for this process, so reservations cannot pile up behind a
  busy pool. With no room at all a pop waits for some up to a second, then raises
  :class:`AnswersBusy` having leased nothing.
- **Shutdown.** :meth:`stop_waiting` makes every waiting pop answer "nothing" at once, so
  a server can finish its requests promptly; new pops answer "nothing" from then on.

The service's own task (:meth:`run`) hosts the push listener in a nursery of its own; the
supervisor runs it as a supervised background loop, cancelled with the broker's nursery.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import trio

from queen.budget import ByteBudget, Charge
from queen.cipher import PREFIX, PayloadUnreadable
from queen.consume import requests
from queen.consume.errors import AnswersBusy, InvalidRequest, NotFound
from queen.consume.looks import PopKey, SharedLooks
from queen.consume.options import checked_options
from queen.consume.policy import pop_sizing
from queen.consume.results import (
    AckResult,
    DlqMessage,
    DlqPage,
    GroupDeleted,
    GroupDeletedOnQueue,
    LeaseExtension,
    PopMaintenance,
    PopResult,
    QueueConfigured,
    QueueDeleted,
    SeekResult,
    SubscriptionMoved,
    TransactionResult,
    TxAckResult,
    TxPushResult,
)
from queen.consume.tracing import Traces
from queen.consume.turns import NO_TURN, Turns
from queen.consume.wakeups import Wakeups
from queen.encryption import QueueEncryption
from queen.errors import StoreError, StoreUnavailable
from queen.flow import QueueFlow
from queen.health import DatabaseHealth
from queen.ids import millis_of, mint_id
from queen.intake import decode_json
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.primitives import acquire_free
from queen.push import PushService
from queen.records import (
    AckItem,
    Delivered,
    DlqQuery,
    PopRequest,
    QueueOptions,
    SeekTarget,
    Sizing,
    TransactionRequest,
)
from queen.settings import Settings
from queen.storage.base import SegmentWrite, WriteResult
from queen.storage.consume import PENDING_NONE, ConsumeStore, PopOutcome, TransactOutcome
from queen.storage.listener import PushListener

log = logging.getLogger("queen.consume")

_MIN_RECHECK_S = 0.01
_RIPE_MARGIN_S = 0.005  # past the ripe time on PostgreSQL's clock too
ROOM_WAIT_S = 1.0  # a pop that finds the byte budget full waits this long for room at most


class ConsumeService:
    def __init__(
        self,
        store: ConsumeStore,
        settings: Settings,
        metrics: Metrics,
        *,
        switches: MaintenanceSwitch,
        push: PushService,
        encryption: QueueEncryption | None = None,
        budget: ByteBudget | None = None,
        database: DatabaseHealth | None = None,
    ) -> None:
        """``push``: the push service whose actors a transaction's pushes take their turn
        behind. ``budget``: the process's
        byte budget (default: one of its own, of ``max_decoding_bytes``). ``database``: the
        database's health; with it, a waiting pop and an ack that find the database unreachable
        wait for it to come back (:meth:`_database_back`) instead of failing at once."""
        self.store = store
        self.budget = budget or ByteBudget(settings.max_decoding_bytes)
        self._reading = trio.CapacityLimiter(settings.db_pool_size)
        self.push = push
        self.encryption = encryption or QueueEncryption(None, None, refresh_s=1.0)
        self.settings = settings
        self.metrics = metrics
        # per queue and minute: pushes, pops and how long they had waited, acks
        self.flow = push.flow if push is not None else QueueFlow()
        self.wakeups = Wakeups()
        self.switches = switches
        self.traces = Traces(store.trace_store(), self.encryption)
        self.listener: PushListener | None = None
        self._recheck_s = max(_MIN_RECHECK_S, settings.pop_recheck_ms / 1000)
        self._linger_s = max(0.0, settings.pop_linger_ms / 1000)
        self._looks = SharedLooks(self.wakeups)
        self._turns = Turns(settings.db_pool_size)
        self._closing = False
        self._stopping = trio.Event()
        self.database = database

    async def run(
        self, *, task_status: trio.TaskStatus[ConsumeService] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the push listener until cancelled; ready once it made its first attempt."""
        self.listener = self.store.push_listener(
            self.wakeups.fire, self.wakeups.fire_all, self.wakeups.fire_partitions
        )
        async with trio.open_nursery() as nursery:
            if self.listener is not None:
                await nursery.start(self.listener.run)
            task_status.started(self)

    def on_commit(self, segments: Sequence[SegmentWrite], results: Sequence[WriteResult]) -> None:
        """Batcher commit listener: wake the pops waiting on the queues just written."""
        self.wakeups.fire_partitions(
            {(s.key.queue, s.key.partition) for s in segments if s.key is not None}
        )

    def stop_waiting(self) -> None:
        """Shutdown: waiting pops answer at once, new pops find nothing."""
        self._closing = True
        self._stopping.set()
        self.wakeups.fire_all()

    async def _database_back(self, error: StoreUnavailable, deadline: float) -> bool:
        """Whether the database, found unreachable (``error``), is reachable again by
        ``deadline`` (False at once without a health to watch, or when the service stops).

        The official clients' consume loops give up on an error answer after a few retries
        but poll on through long-poll timeouts, so a pop or an ack waits out a short outage
        rather than failing it: the health is told (its probes then watch for the database's
        return, which wakes this wait), and the caller looks again."""
        database = self.database
        if database is None or self._closing:
            return False
        database.report_down(error)
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:

                async def stopping() -> None:
                    await self._stopping.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(stopping)
                await database.wait_up()
                nursery.cancel_scope.cancel()
        return database.up and not self._closing

    # --- queues ------------------------------------------------------------------------------

    async def configure(
        self,
        queue: str,
        namespace: str | None = None,
        task: str | None = None,
        options: QueueOptions | None = None,
    ) -> QueueConfigured:
        """Create or reconfigure ``queue`` (``options`` None: every option's default). Raises
        :class:`InvalidRequest` for a bad name or option; nothing is changed then."""
        queue = _name(queue, "queue")
        namespace = requests.name(namespace, "namespace", required=False) or ""
        task = requests.name(task, "task", required=False) or ""
        options = checked_options(QueueOptions() if options is None else options)
        queue_id, partition_id = await self.store.configure(queue, namespace, task, options)
        self.encryption.configured(queue, options.encryption_enabled)
        warning = None
        if options.encryption_enabled and self.encryption.cipher is None:
            warning = (
                "encryptionEnabled is set but QUEEN_ENCRYPTION_KEY is not set: payloads of "
                "this queue are stored in plaintext"
            )
        return QueueConfigured(queue_id, partition_id, queue, namespace, task, options, warning)

    async def delete_queue(self, queue: str) -> QueueDeleted:
        """Delete ``queue`` and everything of it. Raises :class:`InvalidRequest` for a bad
        name."""
        queue = _name(queue, "queue")
        existed = await self.store.delete_queue(queue)
        self.encryption.deleted(queue)
        return QueueDeleted(queue, existed)

    # --- pop ---------------------------------------------------------------------------------

    async def pop(self, request: PopRequest) -> PopResult:
        """Deliver what is available now, or with ``wait`` as soon as something is, until
        ``timeout_ms``. An empty result means "nothing to deliver" (also in maintenance).

        The caller releases the result's :attr:`~PopResult.charge` once the answer is sent.
        Raises :class:`InvalidRequest` for a request that breaks a rule
        (:func:`queen.consume.requests.checked_pop`: names, ``pop_max_batch``, the ranges of
        partitions and timeout), :class:`AnswersBusy` (nothing leased) when the byte budget
        stays full."""
        s = self.settings
        request = requests.checked_pop(request, s.pop_max_batch)
        sizing = pop_sizing(
            request.batch,
            request.partitions,
            one_partition_route=request.partition is not None,
            default_batch=s.pop_default_batch,
            autopilot_batch=s.pop_autopilot_batch,
            autopilot_partitions=s.pop_autopilot_partitions,
            autopilot=request.autopilot,
            autopilot_spread=s.pop_autopilot_spread,
        )
        self.metrics.pop_requests += 1
        result = PopResult(request.consumer_group, sizing=sizing if request.autopilot else None)
        deadline = trio.current_time() + request.timeout_ms / 1000
        key = PopKey(
            request.queue,
            request.partition,
            request.namespace,
            request.task,
            request.consumer_group,
        )
        looked = 0  # the number of this pop's last query (0: none yet)
        turns = self._turns
        arrival = turns.arrival()
        waits = False  # counted among its kind's waiting pops (queen.consume.turns)
        unreachable: StoreUnavailable | None = None  # the database, found away by a look
        try:
            while not self._answers_nothing():
                ticket = self.wakeups.ticket(request.queue, request.partition)
                with trio.move_on_at(deadline):
                    await self._looks.wait_for_like(key, looked)
                turn = NO_TURN
                if request.wait and (waits or turns.others_wait(key)):
                    # (at the deadline the last look is made without one: the pop's answer)
                    with trio.move_on_at(deadline):
                        turn = await turns.take(key, arrival)
                    if self._answers_nothing():  # (since it began waiting for its turn)
                        turn.end()
                        break
                try:
                    like = self._looks.answered(key, looked)
                    unchanged = (  # (the last look, at the deadline, is made: the pop's answer)
                        self._looks.unchanged(key)
                        if looked and request.wait and trio.current_time() < deadline
                        else None
                    )
                    if like is not None:
                        self.metrics.pop_rechecks_shared += 1
                        holds_until = like.holds_until
                    elif unchanged is not None:  # a like look's answer holds: nothing fired since
                        self.metrics.pop_rechecks_shared += 1
                        holds_until = unchanged
                    else:
                        look = self._looks.start(key, waiting=request.wait)
                        looked = look.number
                        lease_id = "" if request.auto_ack else mint_id()
                        try:
                            outcome, charge = await self._look(
                                request, sizing, lease_id or None, look.hint
                            )
                        except StoreUnavailable as error:
                            self._looks.finish(look, found_nothing=False)
                            if not request.wait or self.database is None:
                                raise
                            unreachable = error  # (waited out below, after the turn ends)
                        except BaseException:
                            self._looks.finish(look, found_nothing=False)
                            raise
                        else:
                            delivered, expires_at = outcome.delivered, outcome.lease_expires_at
                            holds_until = self._looks.finish(
                                look,
                                found_nothing=not delivered,
                                holds_until=self._holds_until(look.started, outcome.ripe_in_s),
                            )
                            turn.end(_more_may_be_left(delivered, sizing))
                            if delivered:
                                result.lease_id, result.lease_expires_at = lease_id, expires_at
                                return await self._deliver(request, result, delivered, charge)
                            charge.release()
                finally:
                    turn.end()
                if unreachable is not None:
                    # the database went away: wait for it (until the deadline), then look again
                    if not await self._database_back(unreachable, deadline):
                        break
                    unreachable = None
                    continue
                now = trio.current_time()
                if not request.wait or now >= deadline or self._closing:
                    break
                if not waits:
                    waits = True
                    turns.waiting(key, 1)
                woken = await self.wakeups.wait(
                    ticket, min(deadline, max(holds_until, now + _MIN_RECHECK_S))
                )
                if woken and sizing.batch > 1 and self._linger_s > 0 and not self._closing:
                    # woken by a push, which may be one message of several on their way: let
                    # more arrive, so one answer carries them (bounded by the deadline)
                    await trio.sleep_until(min(deadline, trio.current_time() + self._linger_s))
        finally:
            if waits:
                turns.waiting(key, -1)
        self.metrics.pop_empty += 1
        if request.queue is not None:
            self.flow.found_nothing(request.queue)
        return result

    def _answers_nothing(self) -> bool:
        """Pops answer nothing now: the service stops waiting, or pops are paused."""
        return self._closing or self.switches.pop_enabled

    async def _deliver(
        self,
        request: PopRequest,
        result: PopResult,
        delivered: list[Delivered],
        charge: Charge,
    ) -> PopResult:
        """``result`` (its lease set) carrying ``delivered`` (decrypted) and ``charge``,
        counted in the metrics and the flow."""
        try:
            delivered = await self._opened(request, delivered, result.lease_id)
        except BaseException:
            charge.release()
            raise
        self.metrics.pop_messages += len(delivered)
        lags = _lags_s(delivered)
        self.metrics.pop_lag_seconds += sum(lags)
        for queue in {d.queue for d in delivered}:
            self.flow.popped(
                queue,
                [lag for d, lag in zip(delivered, lags, strict=True) if d.queue == queue],
            )
        result.delivered = delivered
        result.charge = charge
        return result

    async def _look(
        self,
        request: PopRequest,
        sizing: Sizing,
        lease_id: str | None,
        hint: list[str] | None = None,
    ) -> tuple[PopOutcome, Charge]:
        """One query within the byte budget: what it found, and the charge of its payloads.
        ``hint``: the partitions it reads (None: the pop's whole scope).

        The query may read ``pop_max_bytes``, or what room the budget has if that is less;
        that much is reserved while it runs. With no room it waits up to :data:`ROOM_WAIT_S`
        for some, then raises :class:`AnswersBusy` without querying.
        """
        budget = self.budget
        give_up = trio.current_time() + ROOM_WAIT_S
        while True:
            if not await budget.wait_for_room(give_up):
                self.metrics.pop_busy += 1
                log.warning(
                    "pop answered busy: %d of %d bytes of request bodies and pop answers in "
                    "progress",
                    budget.in_use_bytes,
                    budget.limit_bytes,
                )
                raise AnswersBusy("too many answers in progress; retry later")
            await acquire_free(self._reading)
            try:
                cut = min(self.settings.pop_max_bytes, budget.room)
                if cut <= 0:
                    continue  # taken while this pop waited for its turn
                budget.try_charge(cut)
                self.metrics.pop_looks += 1
                try:
                    outcome = await self.store.pop(request, sizing, lease_id, cut, hint)
                finally:
                    budget.release(cut)
                return outcome, budget.charge(outcome.payload_bytes)
            finally:
                self._reading.release()

    def _holds_until(self, started: float, ripe_in_s: float | None) -> float:
        """Until when a look started at ``started`` that found nothing holds if nothing fires.

        The re-check comes ``pop_recheck_ms`` after the look, or sooner when the look said
        its earliest pending partition ripens sooner (a retry delay, a lease, a delay or a
        window buffer that ends), with a few milliseconds' margin for the clocks. When nothing
        was pending at all, only a wake-up can change the answer (a push, or a cursor moved
        by seek or group deletion: each fires, here or through the push listener), so it holds
        until one comes, as long as the push listener hears the other processes. A look that
        did not say (no wait, or no queue yet) re-checks at the usual pace.
        """
        if ripe_in_s is None or ripe_in_s <= 0:  # not said, or held by a concurrent pop
            return started + self._recheck_s
        if ripe_in_s == PENDING_NONE and (self.listener is None or self.listener.connected):
            return PENDING_NONE
        # (nothing pending with the listener down: the re-check, as min() gives it)
        return started + min(ripe_in_s + _RIPE_MARGIN_S, self._recheck_s)

    async def _opened(
        self, request: PopRequest, delivered: list[Delivered], lease_id: str
    ) -> list[Delivered]:
        """``delivered`` with every payload decrypted.

        A message this broker cannot decrypt is not handed over. Under a lease, its whole
        partition is withheld and that partition's lease released, so the batch stays whole
        and in order for a broker with the right key. With autoAck the group's cursor has
        already moved: the message is copied to the group's dead letter queue instead, and
        the rest is delivered. If nothing is left, :class:`PayloadUnreadable`.
        """
        if not any(d.payload.startswith(PREFIX) for d in delivered):
            return delivered
        out: list[Delivered] = []
        bad: list[tuple[Delivered, str]] = []
        for d in delivered:
            try:
                plain = self.encryption.open(d.payload, d.message_id)
            except PayloadUnreadable as exc:
                bad.append((d, str(exc)))
                continue
            out.append(d if plain is d.payload else dataclasses.replace(d, payload=plain))
        if not bad:
            return out
        first, reason = bad[0]
        where = f"queue {first.queue!r} partition {first.partition!r}"
        if lease_id:
            withheld = {d.partition_id: d for d, _ in reversed(bad)}  # first bad one each
            out = [d for d in out if d.partition_id not in withheld]
            count = sum(d.partition_id in withheld for d in delivered)
            await self._release(request, lease_id, list(withheld.values()))
            log.error(
                "pop withheld %d message(s) of %s that cannot be decrypted: %s",
                count,
                where,
                reason,
            )
            message = (
                f"cannot decrypt messages of {where}: {reason}; they stay stored and are "
                "delivered by a broker with the right key"
            )
        else:
            count = len(bad)
            unread = [d for d, _ in bad]
            kept = 0
            try:
                kept = await self.store.keep_in_dlq(
                    request.consumer_group, unread, f"not delivered: {reason}"
                )
            except StoreError as exc:
                log.warning("could not keep undecryptable messages in the DLQ: %s", exc)
            log.error(
                "autoAck pop of group %r moved past %d message(s) of %s that cannot be "
                "decrypted (%s); %d kept in its dead letter queue; ids: %s",
                request.consumer_group,
                count,
                where,
                reason,
                kept,
                ", ".join(d.message_id for d in unread),
            )
            message = (
                f"cannot decrypt messages of {where}: {reason}; with autoAck the group has "
                "moved past them: they are kept in its dead letter queue"
            )
        self.metrics.pop_undecryptable += count
        if not out:
            raise PayloadUnreadable(message)
        return out

    async def _release(self, request: PopRequest, lease_id: str, firsts: list[Delivered]) -> None:
        """Release the lease of the partitions of ``firsts`` (one message of each)."""
        releases = [
            AckItem(
                transaction_id=d.transaction_id,
                partition_id=d.partition_id,
                status="retry",
                consumer_group=request.consumer_group,
                lease_id=lease_id,
            )
            for d in firsts
        ]
        try:
            await self.store.ack(releases)
        except StoreError as exc:  # the lease then simply expires
            log.warning("could not release the lease of undecryptable messages: %s", exc)

    # --- acks and leases ---------------------------------------------------------------------

    async def ack(self, items: Sequence[AckItem]) -> list[AckResult]:
        """One result per item, in order; a refused item has success false."""
        self.metrics.ack_requests += 1
        try:
            outcomes = await self.store.ack(items)
        except StoreUnavailable as error:
            # wait a while for the database to come back, then once more (an ack whose
            # transaction had committed before the answer was lost is judged again)
            wait_until = trio.current_time() + self.settings.db_outage_wait_s
            if not await self._database_back(error, wait_until):
                raise
            outcomes = await self.store.ack(items)
        # the counters and one flow update per queue, in one pass
        refused = dlq = 0
        per_queue: dict[str, list[int]] = {}  # queue -> [taken, refused]
        for o in outcomes:
            if not o.success:
                refused += 1
            if o.dlq:
                dlq += 1
            if o.queue:
                counts = per_queue.get(o.queue)
                if counts is None:
                    counts = per_queue[o.queue] = [0, 0]
                counts[0] += 1
                counts[1] += not o.success
        metrics = self.metrics
        metrics.acks += len(outcomes)
        metrics.acks_refused += refused
        metrics.acks_dlq += dlq
        for queue, (taken, refused_here) in per_queue.items():
            self.flow.acked(queue, taken, refused_here)
        # a released lease: its partition may be claimed again (what is left of it)
        self.wakeups.fire_partitions(_released(outcomes))
        return outcomes

    async def extend_lease(self, lease_id: str, seconds: int | None = None) -> LeaseExtension:
        """Extend the lease by ``seconds`` (None: the queue's lease time). Raises
        :class:`InvalidRequest` for a lease id that is not a UUID or seconds out of range."""
        lease_id = requests.lease_id(lease_id)
        seconds = requests.checked_lease_seconds(seconds)
        renewed, expires_at, state = await self.store.extend_lease(lease_id, seconds)
        return LeaseExtension(lease_id, state, renewed, expires_at)

    # --- transactions ------------------------------------------------------------------------

    async def transaction(
        self, request: TransactionRequest, producer_sub: str | None = None
    ) -> TransactionResult:
        """Apply acks and pushes atomically; one result per item, in order.

        The pushed partitions are held (:meth:`queen.push.PushService.hold`) for the write,
        so they keep one writer and their spooled backlog keeps its place: raises
        :class:`queen.push.PartitionsBusy` (nothing applied) when one cannot be written now.
        """
        for push in request.pushes:
            for batch in push.prepared.batches:
                self.encryption.seal(batch.key.queue, [batch])
        outcome = await self.push.write_held(
            request.push_keys(),
            lambda turn: self.store.transact(request, producer_sub, turn),
        )
        self.metrics.transactions += 1
        self.metrics.transactions_failed += not outcome.ok
        results: list[TxAckResult | TxPushResult | None] = [None] * request.size
        judged = {a.index: a for a in outcome.acks}
        for tx_ack in request.acks:
            verdict = judged.get(tx_ack.index)  # None: the transaction failed before the acks
            results[tx_ack.index] = TxAckResult(
                tx_ack.index,
                tx_ack.item.transaction_id,
                verdict,
            )
        for frame in outcome.pushed:
            results[frame.index] = TxPushResult.of(frame)
        if outcome.ok:
            self.wakeups.fire_partitions(
                {(f.key.queue, f.key.partition) for f in outcome.pushed} | _released(outcome.acks)
            )
        return TransactionResult(
            transaction_id=mint_id(),
            success=outcome.ok,
            error=None if outcome.ok else _transaction_error(outcome),
            results=[r for r in results if r is not None],
        )

    # --- dead letter queue and consumer groups -----------------------------------------------

    async def dlq(self, query: DlqQuery) -> DlqPage:
        total, entries = await self.store.dlq_page(query)
        messages = []
        for e in entries:
            try:
                data = decode_json(self.encryption.open(e.payload, e.message_id).encode())
            except PayloadUnreadable as exc:
                messages.append(DlqMessage(e, None, str(exc)))
            else:
                messages.append(DlqMessage(e, data))
        return DlqPage(messages, total, query.limit, query.offset)

    async def delete_consumer_group(self, group: str, delete_metadata: bool) -> GroupDeleted:
        deleted = await self.store.delete_consumer_group(group, delete_metadata)
        return GroupDeleted(group, deleted, delete_metadata)

    async def delete_consumer_group_on_queue(
        self, group: str, queue: str, delete_metadata: bool = True
    ) -> GroupDeletedOnQueue:
        """Forget ``group`` on ``queue`` only (its cursors, leases, pending failures and, with
        ``delete_metadata``, its subscription there). An unknown queue deletes nothing."""
        group, queue = _name(group, "consumer group"), _name(queue, "queue")
        _, deleted, metadata = await self.store.delete_consumer_group_on_queue(
            group, queue, delete_metadata
        )
        if deleted:
            self.wakeups.fire({queue})  # its leases are gone: its waiting pops may go on
        return GroupDeletedOnQueue(group, queue, deleted, metadata)

    async def seek(
        self, group: str, queue: str, target: SeekTarget, partition: str | None = None
    ) -> SeekResult:
        """Move ``group`` on ``queue`` (or on one ``partition``) to the end or to a time; its
        leases there are released. Raises :class:`NotFound` for an unknown queue/partition."""
        group, queue = _name(group, "consumer group"), _name(queue, "queue")
        if partition is not None:
            partition = _name(partition, "partition")
        if not target.to_end and target.at is None:
            raise InvalidRequest("Must specify either 'toEnd': true or 'timestamp'")
        if target.at is not None and target.at.tzinfo is None:
            target = SeekTarget(to_end=target.to_end, at=target.at.replace(tzinfo=UTC))
        done = await self.store.seek(group, queue, partition, target.to_end, target.at)
        if not done.queue_found:
            raise NotFound(f"queue {queue} not found")
        if not done.partition_found:
            raise NotFound(f"partition {partition} not found in queue {queue}")
        self.wakeups.fire({queue})  # released leases and a cursor moved back: pops may go on
        return SeekResult(
            group, queue, target.to_end, target.at, partition, done.updated, done.moved_to
        )

    async def set_subscription(self, group: str, at: datetime) -> SubscriptionMoved:
        updated = await self.store.set_subscription(group, at)
        return SubscriptionMoved(group, at, updated)

    # --- pop maintenance ---------------------------------------------------------------------

    async def pop_maintenance(self) -> PopMaintenance:
        await trio.lowlevel.checkpoint()
        return PopMaintenance(self.switches.pop_enabled)

    async def set_pop_maintenance(self, enabled: bool) -> PopMaintenance:
        await self.switches.set_pop(enabled)
        if enabled:
            self.wakeups.fire_all()  # waiting pops answer now
        return PopMaintenance(enabled)


def _released(outcomes: Sequence[AckResult]) -> set[tuple[str, str]]:
    """The (queue, partition) whose lease an acknowledgment released."""
    return {
        (o.queue, o.partition)
        for o in outcomes
        if o.lease_released and o.queue is not None and o.partition is not None
    }


def _more_may_be_left(delivered: list[Delivered], sizing: Sizing) -> bool | None:
    """What a pop's look says of its kind's next looks (:meth:`queen.consume.turns.Turn.end`):
    False when it found nothing, True when it took all it could (a whole batch, or as many
    partitions as it may claim: more may be left), None when it took less."""
    if not delivered:
        return False
    if len(delivered) >= sizing.batch:
        return True
    return len({d.partition_id for d in delivered}) >= sizing.partitions or None


def _lags_s(delivered: list[Delivered]) -> list[float]:
    """How long each delivered message waited: pop time less its creation time (carried by
    its id); a message created "later" (another host's clock) counts 0."""
    now_ms = time.time() * 1000
    return [max(0.0, now_ms - millis_of(d.message_id)) / 1000 for d in delivered]


def _name(value: Any, what: str) -> str:
    checked = requests.name(value, what)
    assert checked is not None
    return checked


def _transaction_error(outcome: TransactOutcome) -> str:
    failed = next((a for a in outcome.acks if not a.success), None)
    if failed is not None:
        return f"ACK operation failed: {failed.error}"
    return outcome.reason or "transaction failed"

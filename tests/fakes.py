"""In-memory stores with the PostgreSQL stores' contracts, for actor, batcher and consume tests.

:class:`MemoryStore` models what the push transaction does (offsets, segments, first-wins,
windowed dedup, original ids) and adds test hooks: a gate that holds writes, per-partition
failures, partitions deleted under a write, and a record of how many writes each partition
had in flight at once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from trio_util import RepeatedEvent

from queen.actors.batcher import Batcher
from queen.actors.supervisor import Supervisor
from queen.errors import StoreError, StoreUnavailable
from queen.ids import NIL_UUID, mint_id
from queen.metrics import Metrics
from queen.model import PartitionKey
from queen.push import PushService
from queen.records import Delivered, PopRequest, Sizing
from queen.settings import Settings
from queen.storage.base import SegmentWrite, WriteResult
from queen.storage.consume import PENDING_NONE, PopOutcome


@dataclass
class StoredSegment:
    partition_id: int
    first_offset: int
    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    request_count: int

    @property
    def last_offset(self) -> int:
        return self.first_offset + len(self.message_ids) - 1


@dataclass
class MemoryStore:
    window_s: float = 3600.0
    partitions: dict[PartitionKey, int] = field(default_factory=dict)
    names: dict[int, PartitionKey] = field(default_factory=dict)
    next_offset: dict[int, int] = field(default_factory=dict)
    segments: list[StoredSegment] = field(default_factory=list)
    sidecar: dict[tuple[int, str], tuple[int, float]] = field(default_factory=dict)
    transactions: list[list[int]] = field(default_factory=list)  # partition ids per commit
    # test hooks
    gate: trio.Event | None = None
    failing: set[str] = field(default_factory=set)  # partition names whose writes fail
    crash_on_resolve: set[str] = field(default_factory=set)
    # partition name -> how many more writes find their partition deleted (its queue was)
    vanishing: dict[str, int] = field(default_factory=dict)
    unavailable: bool = False
    in_flight: dict[int, int] = field(default_factory=dict)
    max_in_flight: dict[int, int] = field(default_factory=dict)
    writes_started: int = 0
    resolve_calls: int = 0
    activity: RepeatedEvent = field(default_factory=RepeatedEvent)  # set when a write starts

    async def ensure_partition(self, key: PartitionKey) -> int:
        await trio.lowlevel.checkpoint()
        if key.partition in self.crash_on_resolve:
            raise RuntimeError(f"injected crash for {key.partition}")
        if self.unavailable:
            raise StoreUnavailable("injected outage")
        if key not in self.partitions:
            pid = len(self.names) + 1  # (never an id of a deleted partition)
            self.partitions[key] = pid
            self.names[pid] = key
            self.next_offset[pid] = 0
        return self.partitions[key]

    async def ensure_partitions(self, keys: Sequence[PartitionKey]) -> list[int]:
        self.resolve_calls += 1
        return [await self.ensure_partition(k) for k in keys]

    async def ping(self) -> None:
        await trio.lowlevel.checkpoint()
        if self.unavailable:
            raise StoreUnavailable("injected outage")

    async def write_segments(self, writes: Sequence[SegmentWrite]) -> list[WriteResult]:
        pids = [w.partition_id for w in writes]
        for pid in pids:
            self.in_flight[pid] = self.in_flight.get(pid, 0) + 1
            self.max_in_flight[pid] = max(self.max_in_flight.get(pid, 0), self.in_flight[pid])
        self.writes_started += 1
        self.activity.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            await trio.lowlevel.checkpoint()
            if self.unavailable:
                raise StoreUnavailable("injected outage")
            for w in writes:
                if self.names[w.partition_id].partition in self.failing:
                    raise StoreError(f"injected failure in {self.names[w.partition_id]}")
            self.transactions.append(pids)
            return [self._vanished(w) or self._apply(w) for w in writes]
        finally:
            for pid in pids:
                self.in_flight[pid] -= 1

    def _vanished(self, w: SegmentWrite) -> WriteResult | None:
        key = self.names[w.partition_id]
        if not self.vanishing.get(key.partition):
            return None
        self.vanishing[key.partition] -= 1
        self.partitions.pop(key, None)  # the next resolve creates it again, with a new id
        return WriteResult(partition_missing=True)

    def _apply(self, w: SegmentWrite) -> WriteResult:
        now = trio.current_time()
        pid = w.partition_id
        result = WriteResult()
        leader_id: dict[int, str] = {}
        fresh: list[int] = []
        dedup = self.window_s > 0
        for pos, lead in enumerate(w.first_wins()):
            if dedup and lead != pos:
                result.duplicates[pos] = leader_id[lead]
                continue
            hit = self.sidecar.get((pid, w.transaction_ids[pos])) if dedup else None
            if hit is not None and now - hit[1] < self.window_s:
                leader_id[pos] = result.duplicates[pos] = self._original(pid, hit[0])
            else:
                leader_id[pos] = w.message_ids[pos]
                fresh.append(pos)
        if fresh:
            first = self.next_offset[pid]
            for i, pos in enumerate(fresh if dedup else ()):
                self.sidecar[(pid, w.transaction_ids[pos])] = (first + i, now)
            self.segments.append(
                StoredSegment(
                    pid,
                    first,
                    [w.message_ids[p] for p in fresh],
                    [w.transaction_ids[p] for p in fresh],
                    [w.payloads[p] for p in fresh],
                    w.request_count,
                )
            )
            self.next_offset[pid] = first + len(fresh)
        return result

    def _original(self, pid: int, offset: int) -> str:
        for seg in self.segments:
            if seg.partition_id == pid and seg.first_offset <= offset <= seg.last_offset:
                return seg.message_ids[offset - seg.first_offset]
        return NIL_UUID

    def segments_of(self, partition: str) -> list[StoredSegment]:
        pids = {pid for key, pid in self.partitions.items() if key.partition == partition}
        return [s for s in self.segments if s.partition_id in pids]


@dataclass
class FakeListener:
    """A push listener that only says whether it hears the other processes."""

    connected: bool

    async def run(self, *, task_status: trio.TaskStatus[FakeListener]) -> None:
        task_status.started(self)
        await trio.sleep_forever()


@dataclass
class MemoryConsumeStore:
    """An in-memory store with the consume store's contract for what the waiting logic needs.

    Queue mode only: every message is delivered once (no leases, retries or groups), which is
    what :class:`queen.consume.service.ConsumeService`'s long poll is tested against; a pop
    keeps to its byte budget as the real one does. It counts its pops and keeps the
    listener's callback, so a test can announce a push the way another broker process does
    (:meth:`notify`). Calls outside that scope raise NotImplementedError.
    """

    messages: dict[str, list[Delivered]] = field(default_factory=dict)
    state: dict[str, object] = field(default_factory=dict)
    pop_calls: int = 0
    max_bytes_asked: list[int] = field(default_factory=list)  # each pop's byte budget
    hints: list[list[str] | None] = field(default_factory=list)  # each pop's hint, if any
    ripe_in_s: float | None = None  # what a waiting pop that found nothing is told
    pop_latency_s: float = 0.0  # a pop answers this long after it read (the database's time)
    listener_connected: bool | None = None  # None: no push listener at all
    on_queues: Callable[[set[str]], None] | None = None
    _offsets: dict[str, int] = field(default_factory=dict)

    def add(self, queue: str, payload: str = '{"n": 1}') -> Delivered:
        """Store one message on ``queue`` without telling anyone."""
        offset = self._offsets.get(queue, 0)
        self._offsets[queue] = offset + 1
        message = Delivered(
            partition_id=1,
            queue=queue,
            partition="Default",
            offset=offset,
            message_id=mint_id(),
            transaction_id=mint_id(),
            payload=payload,
            producer_sub=None,
            trace_id=None,
            retry_count=0,
        )
        self.messages.setdefault(queue, []).append(message)
        return message

    def notify(self, queue: str) -> None:
        """What the push listener does when another process pushed on ``queue``."""
        assert self.on_queues is not None, "the consume service is not running"
        self.on_queues({queue})

    async def pop(
        self,
        request: PopRequest,
        sizing: Sizing,
        lease_id: str | None,
        max_bytes: int,
        hint: Collection[str] | None = None,
    ) -> PopOutcome:
        await trio.lowlevel.checkpoint()
        self.pop_calls += 1
        self.max_bytes_asked.append(max_bytes)
        self.hints.append(None if hint is None else sorted(hint))
        assert request.queue is not None
        waiting = self.messages.get(request.queue, [])
        if hint is not None and "Default" not in hint:  # (every message is in "Default")
            return PopOutcome([], None, PENDING_NONE if request.wait else None)
        taken: list[Delivered] = []
        size = 0
        for message in waiting[: sizing.batch]:
            length = len(message.payload.encode())
            if taken and size + length > max_bytes:
                break
            taken.append(message)
            size += length
        self.messages[request.queue] = waiting[len(taken) :]
        if self.pop_latency_s:
            await trio.sleep(self.pop_latency_s)
        if taken or not request.wait:
            return PopOutcome(taken, payload_bytes=size)
        return PopOutcome([], None, self.ripe_in_s)

    async def get_state(self, key: str) -> object:
        await trio.lowlevel.checkpoint()
        return self.state.get(key)

    async def set_state(self, key: str, value: object) -> None:
        await trio.lowlevel.checkpoint()
        self.state[key] = value

    def trace_store(self) -> Any:
        return None

    def push_listener(
        self,
        on_queues: Callable[[set[str]], None],
        on_reconnect: Callable[[], None],
        on_partitions: Callable[[set[tuple[str, str]]], None] | None = None,
    ) -> FakeListener | None:
        self.on_queues = on_queues
        if self.listener_connected is None:
            return None
        return FakeListener(self.listener_connected)

    def __getattr__(self, name: str) -> Any:
        if name in _CONSUME_CALLS:
            raise NotImplementedError(f"MemoryConsumeStore does not model {name}")
        raise AttributeError(name)


_CONSUME_CALLS = {
    "configure",
    "delete_queue",
    "ack",
    "extend_lease",
    "transact",
    "dlq_page",
    "keep_in_dlq",
    "delete_consumer_group",
    "delete_consumer_group_on_queue",
    "seek",
    "set_subscription",
}


def idle_push_service(settings: Settings) -> PushService:
    """A push service over an in-memory store whose actors never run: for consume tests that
    push nothing but need the service a consume service is built with."""
    store = MemoryStore()
    metrics = Metrics()
    batcher = Batcher(
        store,
        metrics,
        concurrency=1,
        max_items=settings.batch_max_items,
        max_bytes=settings.batch_max_bytes,
        linger_s=0.0,
        queue_size=1,
    )
    return PushService(Supervisor(store, batcher, settings, metrics), metrics)

"""The supervisor: owns the partition actors' nursery and their lifetimes.

- **Spawn on first use**: :meth:`Supervisor.submit` finds the partition's actor or starts one.
  The registry is only touched synchronously (no checkpoint between "look up" and "register"),
  so one process never runs two actors for one partition.
- **Idle stop**: one reaper loop looks over the actors every quarter of
  ``actor_idle_timeout_s`` and stops those parked on an empty inbox for that long (see
  :meth:`queen.actors.partition.PartitionActor.stop_if_idle`); a producer that meets a closed
  inbox simply asks again and gets a fresh actor. One timer for all actors, instead of one per
  waiting actor, keeps ten thousand idle actors cheap.
- **Crash containment** (strategy: *restart on demand*): an actor that raises is logged, its
  held requests are answered ``failed``, it is unregistered, and nothing else is touched: other
  partitions' actors, the batcher and the server go on. The next push to that partition starts
  a new actor.
Cancelling the supervisor's nursery (the last phase of shutdown) stops every actor.
"""

from __future__ import annotations

import logging

import trio
from trio_util import periodic

from queen.actors.batcher import Batcher
from queen.actors.messages import PushRequest
from queen.actors.partition import DirectRouter, PartitionActor, WriteRouter
from queen.actors.resolver import PartitionResolver
from queen.encryption import QueueEncryption
from queen.metrics import Metrics
from queen.model import PartitionKey
from queen.primitives import Fence
from queen.settings import Settings
from queen.storage.base import Store

log = logging.getLogger("queen.supervisor")


class Supervisor:
    def __init__(
        self,
        store: Store,
        batcher: Batcher,
        settings: Settings,
        metrics: Metrics,
        *,
        router: WriteRouter | None = None,
        encryption: QueueEncryption | None = None,
    ) -> None:
        self._store = store
        self._batcher = batcher
        self._settings = settings
        self._metrics = metrics
        self._router = router or DirectRouter()
        self._encryption = encryption
        self._resolver = PartitionResolver(store.ensure_partitions)
        self._actors: dict[PartitionKey, PartitionActor] = {}
        self._nursery: trio.Nursery | None = None

    @property
    def batcher(self) -> Batcher:
        """Where the actors' writes go."""
        return self._batcher

    @property
    def active_partitions(self) -> int:
        return len(self._actors)

    def actor(self, key: PartitionKey) -> PartitionActor | None:
        """The running actor of ``key``, if any (for tests and introspection)."""
        return self._actors.get(key)

    async def run(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Host the actors until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._resolver.run)
            nursery.start_soon(self._reap_idle)
            task_status.started(self)
            await trio.sleep_forever()

    async def _reap_idle(self) -> None:
        # A quarter of the timeout (an actor stops between 1 and 1.25 timeouts idle), never
        # a busy loop, even with a timeout of 0.
        interval = max(self._settings.actor_idle_timeout_s / 4, 0.01)
        async for _ in periodic(interval):
            self.reap_idle(trio.current_time())

    def reap_idle(self, now: float) -> int:
        """Stop every actor idle for ``actor_idle_timeout_s`` at ``now``; returns how many."""
        return sum(actor.stop_if_idle(now) for actor in list(self._actors.values()))

    def put(self, key: PartitionKey, work: PushRequest | Fence) -> None:
        """Put ``work`` in the inbox of ``key``'s actor, starting the actor if needed; never
        waits and takes no checkpoint."""
        actor = self._actors.get(key)
        if actor is None or not actor.put(work):
            self._spawn(key).put(work)  # a fresh actor always takes it

    async def submit(self, key: PartitionKey, work: PushRequest | Fence) -> None:
        """:meth:`put`, for callers that await (the spool replay, holds)."""
        self.put(key, work)

    def _spawn(self, key: PartitionKey) -> PartitionActor:
        if self._nursery is None:
            raise RuntimeError("supervisor is not running")
        s = self._settings
        actor = PartitionActor(
            key,
            resolve=self._resolver.resolve,
            writer=self._batcher,
            router=self._router,
            on_idle_stop=self._idle_stopped,
            idle_timeout_s=s.actor_idle_timeout_s,
            segment_max_items=s.segment_max_items,
            hold_s=s.spool_hold_s,
            encryption=self._encryption,
        )
        self._actors[key] = actor
        self._metrics.actors_started += 1
        self._metrics.actors_active = len(self._actors)
        self._nursery.start_soon(self._supervise, actor, name=f"actor:{key.queue}/{key.partition}")
        return actor

    async def _supervise(self, actor: PartitionActor) -> None:
        try:
            await actor.run()
        except Exception:
            self._metrics.actor_crashes += 1
            log.exception("partition actor %s/%s crashed", actor.key.queue, actor.key.partition)
        finally:
            self._forget(actor)

    def _idle_stopped(self, actor: PartitionActor) -> None:
        self._metrics.actors_stopped_idle += 1
        self._forget(actor)

    def _forget(self, actor: PartitionActor) -> None:
        if self._actors.get(actor.key) is actor:
            del self._actors[actor.key]
        self._metrics.actors_active = len(self._actors)

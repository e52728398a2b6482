"""The admin and observability service: what the broker holds, where consumers stand, and
how this process is doing, one part per subject, each answering typed values (HTTP renders
them in the original broker's shapes, :mod:`queen.http.render_admin`):

- :attr:`AdminService.queues` (:mod:`queen.admin.queues`): queues, partitions, namespaces,
  tasks;
- :attr:`AdminService.messages` (:mod:`queen.admin.messages`): stored messages, one with its
  payload, the deletion of one;
- :attr:`AdminService.consumer_groups` (:mod:`queen.admin.groups`): where groups stand;
- :attr:`AdminService.system` (:mod:`queen.admin.system`): the overview, status, this
  process's history and counters, the per-queue flow, retention;
- :attr:`AdminService.database` (:mod:`queen.admin.database`): the database server;
- :attr:`AdminService.gauges` (:mod:`queen.admin.gauges`): what Prometheus reads per queue;
- :attr:`AdminService.actions` (:mod:`queen.admin.actions`): the operator's actions on dead
  letters and queues.

Each reads through :class:`queen.storage.admin.PgAdminStore` and the broker's own state
(counters, spool, switches), and takes a typed query that HTTP parsed once from the request
(:func:`queen.admin.queues.queue_query`, ...). Figures are computed when asked, from offsets
and cursors (see ``admin.sql``), so there is nothing to keep in step; ``POST
/api/v1/stats/refresh`` only takes a history sample.
"""

from __future__ import annotations

from queen.admin.actions import AdminActions
from queen.admin.database import DatabaseReads
from queen.admin.gauges import Gauges
from queen.admin.groups import ConsumerGroups
from queen.admin.history import History
from queen.admin.messages import MessageReads
from queen.admin.queues import QueueReads
from queen.admin.system import SystemReads
from queen.consume.service import ConsumeService
from queen.flow import SharedFlow
from queen.metrics import Figures, LocalFigures, Metrics
from queen.operations import Operations
from queen.push import PushService
from queen.settings import Settings
from queen.storage.admin import PgAdminStore


class AdminService:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        ops: Operations,
        *,
        database: str,
        store: PgAdminStore | None = None,
        consume: ConsumeService | None = None,
        history: History | None = None,
        push: PushService,
        figures: Figures | None = None,
        flow: SharedFlow | None = None,
    ) -> None:
        """``database``: what the start-up line calls it; ``store`` and ``consume`` are None
        without PostgreSQL (the admin reads then raise
        :class:`queen.consume.errors.ConsumeUnavailable`); ``figures``: how the service's
        counters are read (by default this process's); ``flow``: every process's per-queue
        flow (None: this process's alone)."""
        self.ops = ops
        self.figures: Figures = figures or LocalFigures(metrics)
        self.history = history or History(self.figures, pool=self._pool)
        self.queues = QueueReads(store, ops)
        self.messages = MessageReads(store, ops.encryption)
        self.consumer_groups = ConsumerGroups(store)
        self.system = SystemReads(
            settings,
            metrics,
            ops,
            history=self.history,
            figures=self.figures,
            queues=self.queues,
            store=store,
            consume=consume,
            flow=flow,
        )
        self.database = DatabaseReads(settings, store, database=database)
        self.gauges = Gauges(store)
        self.actions = AdminActions(store, push)

    def _pool(self) -> tuple[int, int] | None:
        gauges = self.ops.gauges()
        if "db_pool_size" not in gauges:
            return None
        return int(gauges["db_pool_size"]), int(gauges["db_pool_active"])

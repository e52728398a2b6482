"""The consume side: queue options, pops with leases and long polls, acks, transactions, the
dead letter queue, consumer groups and pop maintenance (its switch is cached with the other
admin switch in :mod:`queen.maintenance`).

- :mod:`queen.consume.options`, :mod:`~queen.consume.policy`, :mod:`~queen.consume.requests`:
  pure rules and validation.
- :mod:`queen.consume.service`: :class:`ConsumeService`, what the broker delegates to.
- :mod:`queen.consume.wakeups`: how a waiting pop is woken (by this process's commits, and by
  other processes' pushes through :mod:`queen.storage.listener`).
- Storage: :class:`queen.storage.consume.ConsumeStore` (``queen/storage/consume.sql`` on
  PostgreSQL); the values both sides share are in :mod:`queen.records`.
"""

from queen.consume.errors import AnswersBusy, ConsumeUnavailable, InvalidRequest, NotFound
from queen.consume.results import PopResult
from queen.records import QUEUE_MODE, Delivered, SeekTarget

__all__ = [
    "QUEUE_MODE",
    "AnswersBusy",
    "ConsumeUnavailable",
    "Delivered",
    "InvalidRequest",
    "NotFound",
    "PopResult",
    "SeekTarget",
]

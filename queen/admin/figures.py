"""What several admin answers share: the message figures of a queue, ages, and the store every
admin read needs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from queen.consume.errors import ConsumeUnavailable
from queen.storage.admin import PgAdminStore


@dataclass(frozen=True, slots=True)
class MessageCounts:
    """The figures of a partition, a queue or every queue: ``total`` held, and partition by
    partition those of the consumer furthest behind there for each figure
    (:func:`consumer_counts`, the original's meaning): ``pending`` (not yet done, outside a
    live lease), ``processing`` (inside one), ``completed`` (done), and the partitions'
    ``dead_letter`` copies in the DLQ; ``failed``: queue mode's failed attempts."""

    total: int
    pending: int
    processing: int
    completed: int
    failed: int
    dead_letter: int

    @property
    def depth(self) -> int:
        """Messages not done yet: pending and processing."""
        return self.pending + self.processing


def consumer_counts(
    *, held: int, undone: int, processing: int, done: int, dead: int, failed: int = 0
) -> MessageCounts:
    """The figures of the consumers furthest behind (``most_*`` of the store's rows, summed
    over partitions): ``undone`` counts leased messages too, so pending is the rest."""
    return MessageCounts(
        total=held,
        pending=max(0, undone - processing),
        processing=processing,
        completed=done,
        failed=failed,
        dead_letter=dead,
    )


def age_s(moment: datetime | None, now: datetime) -> float:
    """Seconds from ``moment`` to ``now``, to the millisecond; 0 for none (or the future)."""
    return 0.0 if moment is None else round(max(0.0, (now - moment).total_seconds()), 3)


def need_store(store: PgAdminStore | None, what: str = "the admin API needs") -> PgAdminStore:
    """``store``, or :class:`ConsumeUnavailable` (HTTP 501) without PostgreSQL."""
    if store is None:
        raise ConsumeUnavailable(f"{what} the PostgreSQL store")
    return store

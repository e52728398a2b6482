"""What several admin answers share: queue mode's message figures, ages, and the store every
admin read needs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from queen.consume.errors import ConsumeUnavailable
from queen.storage.admin import PgAdminStore


@dataclass(frozen=True, slots=True)
class MessageCounts:
    """Queue mode's figures of a partition, a queue or every queue: ``total`` held, of which
    ``completed`` (acked or dead-lettered), ``processing`` (inside a live lease) and
    ``pending`` (the rest); ``failed`` attempts and ``dead_letter`` copies in the DLQ."""

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


def message_counts(
    *, held: int, undone: int, processing: int, failed: int, dead_letter: int
) -> MessageCounts:
    """Queue mode's figures from what the store reads: ``held`` messages, ``undone`` of them
    not yet acknowledged, ``processing`` of those inside a live lease."""
    return MessageCounts(
        total=held,
        pending=max(0, undone - processing),
        processing=processing,
        completed=max(0, held - undone),
        failed=failed,
        dead_letter=dead_letter,
    )


def age_s(moment: datetime | None, now: datetime) -> float:
    """Seconds from ``moment`` to ``now``, to the millisecond; 0 for none (or the future)."""
    return 0.0 if moment is None else round(max(0.0, (now - moment).total_seconds()), 3)


def need_store(store: PgAdminStore | None, what: str = "the admin API needs") -> PgAdminStore:
    """``store``, or :class:`ConsumeUnavailable` (HTTP 501) without PostgreSQL."""
    if store is None:
        raise ConsumeUnavailable(f"{what} the PostgreSQL store")
    return store

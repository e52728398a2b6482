"""Messages exchanged with the partition actors; they answer through :mod:`queen.primitives`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeVar

from queen.errors import QueenError
from queen.model import Status
from queen.primitives import Reply

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PushOutcome:
    """What happened to the items of one :class:`PushRequest`.

    Every item not in ``duplicates`` has ``status``; ``duplicates`` maps an item's position in
    the request to the message id it duplicates. Outcomes are read, never changed: the common
    ones (:data:`QUEUED`, :data:`BUFFERED`, :data:`FAILED`) are shared.
    """

    status: Status
    duplicates: dict[int, str] = field(default_factory=dict)


QUEUED = PushOutcome(Status.QUEUED)
BUFFERED = PushOutcome(Status.BUFFERED)
FAILED = PushOutcome(Status.FAILED)


@dataclass(slots=True, eq=False)
class PushRequest:
    """Frames for one partition, in order: the items of one push body for that partition, or
    (``replay=True``) frames read back from the spool, which go to the database only.

    ``producer_subs`` and ``trace_ids`` are ``None`` when no frame has one, else one entry per
    frame. ``received``: when the broker had the push in hand (``time.monotonic()``), no later
    than its arrival was answered to anyone; infinity when not known.
    """

    message_ids: list[str]
    transaction_ids: list[str]
    payloads: list[bytes]
    producer_subs: list[str | None] | None = None
    trace_ids: list[str | None] | None = None
    replay: bool = False
    reply: Reply[PushOutcome] = field(default_factory=Reply)
    received: float = math.inf

    def __len__(self) -> int:
        return len(self.message_ids)


class ActorStopped(QueenError):
    """The partition's actor stopped before it could answer (the broker is shutting down)."""

"""Plain values shared by every room of the broker: statuses, partition keys, push results."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from queen.errors import QueenError

DEFAULT_PARTITION = "Default"


class Status(enum.StrEnum):
    """The four per-item answers of a push. No per-item error text exists by design."""

    QUEUED = "queued"
    DUPLICATE = "duplicate"
    BUFFERED = "buffered"
    FAILED = "failed"


class PartitionKey(NamedTuple):
    """A partition by name. (A named tuple: hashing and comparing one, as every look-up of a
    partition's actor does, runs no Python code.)"""

    queue: str
    partition: str


class InvalidPush(QueenError, ValueError):
    """The push body breaks a rule; nothing of it was stored."""


def first_wins(transaction_ids: Sequence[str]) -> list[int]:
    """For every frame, the position of the first frame with the same transaction id.

    >>> first_wins(["a", "b", "a", "a", "c"])
    [0, 1, 0, 0, 4]
    """
    first: dict[str, int] = {}
    return [first.setdefault(tx, pos) for pos, tx in enumerate(transaction_ids)]

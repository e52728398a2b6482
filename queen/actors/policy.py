"""Pure decisions of the push path, tested without Trio or a database."""

from __future__ import annotations

from collections.abc import Sequence


def coalesce_count(sizes: Sequence[int], max_items: int) -> int:
    """How many waiting requests (item counts ``sizes``, oldest first) go into one segment.

    Always at least one, so a request larger than ``max_items`` is still written whole (a
    request's items for one partition are one segment); then more while the total stays
    within ``max_items``.
    """
    if not sizes:
        return 0
    total = sizes[0]
    taken = 1
    for size in sizes[1:]:
        if total + size > max_items:
            break
        total += size
        taken += 1
    return taken


def may_spread(frames: int, writes: int, *, min_items: int, min_writes: int) -> bool:
    """Whether :func:`spread_count` could keep fewer than all of ``writes`` ready writes
    holding ``frames`` frames (a necessary condition, cheaper than the sizes it needs).

    >>> may_spread(100, 10, min_items=800, min_writes=32)
    False
    """
    return writes > 1 and (
        (min_items > 0 and frames >= 2 * min_items) or (min_writes > 0 and writes >= 2 * min_writes)
    )


def spread_count(
    sizes: Sequence[int], free_slots: int, *, min_items: int, min_writes: int = 0
) -> int:
    """How many of the ready writes (item counts ``sizes``, in arrival order) the transaction
    being gathered keeps when ``free_slots`` more transactions could start now; the rest waits
    for the next transaction (which can start at once).

    Ready items are shared out evenly over this transaction and the free slots, at least
    ``min_items`` per share. When there are too few items for that, many one-frame writes
    (single-item pushes, each its own producer) are shared out the same way by count, at least
    ``min_writes`` per share. Writes of several frames are not: they are mostly pushes spread
    over several partitions, and such a push waits for every transaction holding a part of it,
    so splitting them adds commits without letting any producer go on sooner. 0 turns a rule
    off.

    >>> spread_count([100] * 16, 3, min_items=100)
    4
    >>> spread_count([1] * 64, 3, min_items=100)
    64
    >>> spread_count([1] * 64, 3, min_items=800, min_writes=32)
    32
    """
    if free_slots <= 0:
        return len(sizes)
    total = sum(sizes)
    if min_items > 0 and total >= 2 * min_items:
        share = max(min_items, -(-total // (free_slots + 1)))
        taken = 0
        for count, size in enumerate(sizes, 1):
            taken += size
            if taken >= share:
                return count
        return len(sizes)
    if min_writes > 0 and len(sizes) >= 2 * min_writes and total < 2 * len(sizes):
        return max(min_writes, -(-len(sizes) // (free_slots + 1)))
    return len(sizes)

"""What an import writes, worked out from what was read (pure: no I/O).

Positions. The original's cursor is the last message done in a partition's order; here a
cursor is an offset, and the import stores a partition's messages at consecutive offsets in
that order, so a cursor's offset is the count of messages done. A named group that has no row
for a partition yet starts there as its subscription says (after every message created up to
its subscription time), or from the beginning; the import writes that start as a cursor too,
so every group resumes exactly where the original would have served it next. Leases are not
carried over: what was leased and not acked is delivered again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from queen.storage.import_records import (
    QUEUE_MODE,
    CursorWrite,
    GroupWrite,
    OriginalPartition,
    OriginalPosition,
    OriginalQueue,
    OriginalSubscription,
)

# The original's subscription modes, as this broker names a group's start.
_MODES = {"new": "now", "new-only": "now", "timestamp": "at"}


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """One queue of the source, as a line of the report."""

    name: str
    partitions: int
    messages: int  # in the source
    imported: int  # already here before this run
    to_import: int
    groups: int  # named consumer groups
    queue_mode: bool  # queue-mode consumers have positions
    dead_letters: int  # not copied yet
    note: str = ""


@dataclass(frozen=True, slots=True)
class Target:
    """Where one source partition went: its id here and its queue's, and ``base``, the
    offset here of the first message the source still holds (0 unless the original's
    retention removed imported messages since)."""

    partition_id: int
    queue_id: int
    base: int
    messages: int  # imported


def subscription_for(
    subs: Sequence[OriginalSubscription], group: str, queue: str, partition: str
) -> OriginalSubscription | None:
    """The subscription of ``group`` that applies to one partition: one naming that
    partition first, else the queue's."""
    queue_wide = None
    for s in subs:
        if s.consumer_group == group and s.queue == queue:
            if s.partition == partition:
                return s
            if s.partition == "":
                queue_wide = s
    return queue_wide


def named_groups(
    queue: OriginalQueue,
    partitions: Sequence[OriginalPartition],
    positions: Sequence[OriginalPosition],
    subs: Sequence[OriginalSubscription],
) -> list[str]:
    """The named groups that consumed, or subscribed to, ``queue``, by name."""
    mine = {p.source_id for p in partitions if p.source_queue == queue.source_id}
    found = {
        pos.consumer_group
        for pos in positions
        if pos.source_partition in mine and pos.consumer_group != QUEUE_MODE
    }
    found.update(s.consumer_group for s in subs if s.queue == queue.name)
    return sorted(found)


def group_write(queue_id: int, group: str, sub: OriginalSubscription | None) -> GroupWrite:
    if sub is None or sub.mode not in _MODES:
        return GroupWrite(queue_id, group, "all", None)
    return GroupWrite(queue_id, group, _MODES[sub.mode], sub.since)


@dataclass(frozen=True, slots=True)
class StartWanted:
    """A cursor whose offset is a subscription's start: the caller counts the messages of
    the source partition created up to ``sub.since``."""

    source_partition: str
    group: str
    sub: OriginalSubscription


def cursor_plan(
    queues: Sequence[OriginalQueue],
    partitions: Sequence[OriginalPartition],
    positions: Sequence[OriginalPosition],
    subs: Sequence[OriginalSubscription],
    targets: Mapping[str, Target],
) -> tuple[list[GroupWrite], list[CursorWrite], list[StartWanted]]:
    """Groups and cursors for every imported partition. Cursors that start at a
    subscription are returned apart (``StartWanted``); :func:`start_cursors` turns them
    into cursors once their counts are known."""
    groups: list[GroupWrite] = []
    cursors: list[CursorWrite] = []
    wanted: list[StartWanted] = []
    by_key = {(p.source_partition, p.consumer_group): p for p in positions}
    for q in queues:
        mine = [p for p in partitions if p.source_queue == q.source_id and p.source_id in targets]
        if not mine:
            continue
        names = named_groups(q, partitions, positions, subs)
        queue_id = targets[mine[0].source_id].queue_id
        groups.extend(
            group_write(queue_id, g, subscription_for(subs, g, q.name, "")) for g in names
        )
        for p in mine:
            t = targets[p.source_id]
            queue_pos = by_key.get((p.source_id, QUEUE_MODE))
            if queue_pos is not None:
                cursors.append(_cursor(t, QUEUE_MODE, queue_pos.done or 0, queue_pos.retries))
            for g in names:
                pos = by_key.get((p.source_id, g))
                if pos is not None and pos.done is not None:
                    cursors.append(_cursor(t, g, pos.done, pos.retries))
                    continue
                sub = subscription_for(subs, g, q.name, p.name)
                if sub is not None:
                    wanted.append(StartWanted(p.source_id, g, sub))
                else:
                    cursors.append(_cursor(t, g, 0, pos.retries if pos else 0))
    return groups, cursors, wanted


def start_cursors(
    wanted: Sequence[StartWanted], counts: Sequence[int], targets: Mapping[str, Target]
) -> list[CursorWrite]:
    """The cursors of :class:`StartWanted` entries, given how many messages of each
    partition come before the subscription's start."""
    return [
        _cursor(targets[w.source_partition], w.group, n, 0)
        for w, n in zip(wanted, counts, strict=True)
    ]


def _cursor(t: Target, group: str, done: int, retries: int) -> CursorWrite:
    # The snapshot the messages were read in is the one positions are read in, so a cursor
    # never passes the messages imported; clamped all the same.
    offset = min(max(t.base + done, 0), t.messages)
    attempts = retries if offset < t.messages else 0
    return CursorWrite(t.partition_id, t.queue_id, group, offset, attempts)

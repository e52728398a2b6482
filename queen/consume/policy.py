"""Pure decisions of the consume side, tested without Trio or a database."""

from __future__ import annotations

import functools
from datetime import UTC, datetime

from queen.records import Sizing, Subscription, SubscriptionStart


def parse_timestamp(text: str) -> datetime:
    """An ISO-8601 timestamp (``Z`` or an offset; no zone means UTC). Raises ValueError."""
    value = datetime.fromisoformat(text.strip())
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def subscription_of(mode: str | None, start_from: str | None) -> Subscription:
    """The subscription a pop asks for.

    A non-empty ``subscriptionFrom`` other than ``now`` starts at that timestamp; else mode
    ``new``/``new-only`` or ``subscriptionFrom=now`` starts now; else from the beginning: any
    other mode (``all``, the clients' ``from_beginning``, anything) means all. Raises
    ValueError for a timestamp that cannot be read.
    """
    start_from = (start_from or "").strip()
    if start_from and start_from.lower() != "now":
        return Subscription(SubscriptionStart.AT, parse_timestamp(start_from))
    if (mode or "").lower() in ("new", "new-only") or start_from.lower() == "now":
        return Subscription(SubscriptionStart.NOW)
    return Subscription(SubscriptionStart.ALL)


def pop_sizing(
    batch: int | None,
    partitions: int | None,
    *,
    one_partition_route: bool,
    default_batch: int,
    autopilot_batch: int,
    autopilot_partitions: int,
    autopilot: bool,
    autopilot_spread: int = 1,
) -> Sizing:
    """How many messages and partitions one pop may take.

    A value the client set is used as is. When the client left the choice to the broker
    (``autopilot=true``), an omitted batch is ``autopilot_batch`` and an omitted partition
    count is as many partitions as the batch could use, up to ``autopilot_partitions``: a
    batch fills from several partitions when each holds only a few messages, and a pop that
    fills it from its first partition claims no other. That width applies only while at least
    ``autopilot_spread`` partitions are claimable: with fewer, the pop claims one and leaves
    the rest to the group's other consumers, so that a few ready partitions are worked on side
    by side (a count the client set applies as it is). Without autopilot they are
    ``default_batch`` (1, as the official clients expect from a pop without ``batch``) and 1.
    The partition route always claims one partition.
    """
    if autopilot:
        size = batch or autopilot_batch
        if one_partition_route:
            return Sizing(size, 1)
        if partitions:
            return Sizing(size, partitions)
        width = min(size, autopilot_partitions)
        return Sizing(size, width, autopilot_spread if width > 1 else 1)
    return Sizing(batch or default_batch, 1 if one_partition_route else partitions or 1)


def iso_utc(moment: datetime) -> str:
    """``2026-04-26T10:59:28.267Z``: ISO-8601 UTC with milliseconds and ``Z``."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def iso_of_uuid7(message_id: str) -> str:
    """The creation time carried by a UUIDv7 message id, as :func:`iso_utc` writes it."""
    ms = int(message_id[:8] + message_id[9:13], 16)
    seconds, millis = divmod(ms, 1000)
    return f"{_second_stamp(seconds)}.{millis:03d}Z"


@functools.lru_cache(maxsize=4096)
def _second_stamp(seconds: int) -> str:
    """Formatting a time costs more than the rest of a delivered message's answer; the
    messages of one pop were mostly written in the same few seconds."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")

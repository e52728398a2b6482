"""The errors of the database that every layer may meet: raised by storage, turned into a
spooled push, a 503 or a retry above it."""

from __future__ import annotations


class StoreError(Exception):
    """A database operation failed for a reason other than the database being unreachable."""


class StoreUnavailable(StoreError):
    """The database could not be reached, or the connection broke while a call was in flight.

    A write that fails this way may or may not have committed; callers that keep the items
    (the spool) rely on deduplication to make a later retry idempotent.
    """


class StoreDeadlock(StoreError):
    """PostgreSQL chose the call as a deadlock victim and rolled it back: nothing of it was
    applied, so one call that is a single transaction may simply be run again."""

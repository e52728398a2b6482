"""The broker's errors: :class:`QueenError`, the one base of every error the broker raises on
purpose, and the errors of the database that every layer may meet (raised by storage, turned
into a spooled push, a 503 or a retry above it).

Each error is defined by the room that raises it and keeps the built-in base its callers
catch (``InvalidRequest`` is a ``ValueError``, ``NotFound`` a ``LookupError``); what HTTP
answers for each is :mod:`queen.http.app`'s table of handlers. Anything else that escapes a
request is a bug: HTTP answers 500 and logs it.
"""

from __future__ import annotations


class QueenError(Exception):
    """An error the broker raises on purpose: bad input, a missing name, a busy or absent
    resource, a refused request, settings that cannot work."""


class StoreError(QueenError):
    """A database operation failed for a reason other than the database being unreachable."""


class StoreUnavailable(StoreError):
    """The database could not be reached, or the connection broke while a call was in flight.

    A write that fails this way may or may not have committed; callers that keep the items
    (the spool) rely on deduplication to make a later retry idempotent.
    """


class StoreDeadlock(StoreError):
    """PostgreSQL chose the call as a deadlock victim and rolled it back: nothing of it was
    applied, so one call that is a single transaction may simply be run again."""

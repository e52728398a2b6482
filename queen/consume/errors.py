"""Errors of the consume side."""

from __future__ import annotations

from queen.errors import QueenError


class InvalidRequest(QueenError, ValueError):
    """A consume-side request breaks a rule (HTTP 400); nothing was changed."""


class ConsumeUnavailable(QueenError, RuntimeError):
    """The consume side needs PostgreSQL and the broker runs on another store."""


class NotFound(QueenError, LookupError):
    """A consume-side request names a queue or partition that does not exist (HTTP 404)."""


class AnswersBusy(QueenError, RuntimeError):
    """The process holds as many answer and body bytes as it may (``QUEEN_MAX_DECODING_BYTES``)
    and none were given back in time: the pop looked at nothing and leased nothing (HTTP 503
    with ``Retry-After``)."""

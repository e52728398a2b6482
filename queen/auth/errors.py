"""The two ways authentication fails: a refused request, and settings that cannot work."""

from __future__ import annotations

from typing import Any

from queen.errors import QueenError


class AuthFailure(QueenError):
    """A request is refused: 401 (no or bad credentials), 403 (not allowed), or 503 (the
    signing keys cannot be fetched right now). ``message`` is short and safe to send back;
    ``extra`` holds more JSON fields for the answer; ``sub`` is the refused caller's, when
    its token was valid (a 403), for the logs."""

    def __init__(self, status: int, message: str, *, sub: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.sub = sub
        self.extra = extra


def unauthorized(message: str) -> AuthFailure:
    return AuthFailure(401, message)


class AuthConfigError(QueenError, ValueError):
    """The authentication settings cannot work; the message names the variable."""


def clip(value: object, limit: int = 64) -> str:
    """``value`` as text short enough to echo in an error answer."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."

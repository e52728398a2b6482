"""Names in URL paths: a queue, partition, consumer group, transaction id or trace name may
hold ``/``, sent percent-encoded (``%2F``) inside its path segment.

Hypercorn hands the app the path already decoded (``scope["path"]``): there, ``a%2Fb`` and
``a/b`` are the same and a name holding ``/`` would be cut in two before routing.
:func:`routing_path` rebuilds the path from the raw one (``scope["raw_path"]``) segment by
segment instead, and keeps a ``/`` or ``%`` that was encoded inside a segment escaped there
(``%2F``, ``%25``); the app's converters (:data:`CONVERTERS`, installed over Werkzeug's own
``default``, ``string`` and ``path``) undo exactly those two escapes in the value a route gets.
A path without ``%`` (nearly every request) is used as it is.

Besides, the pop routes, one queue's resources and its clear take a queue or partition name
that spans segments (:class:`QueueName`, Werkzeug's ``path``), as the official clients leave
those names unquoted; routes where that would be ambiguous take one segment.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

from werkzeug.routing import BaseConverter, PathConverter, UnicodeConverter

_ESCAPED: Final = re.compile("%(2F|25)")


def routing_path(path: str, raw_path: bytes | None) -> str:
    """The path to route: ``path`` (decoded) with the ``/`` and ``%`` that ``raw_path`` had
    percent-encoded kept escaped in their segment. When the two do not agree (a server or a
    test client that rebuilds ``raw_path``), every ``%`` of ``path`` is escaped and no ``/``
    can be told apart."""
    if "%" not in path and (raw_path is None or b"%" not in raw_path):
        return path
    if raw_path is not None:
        try:
            segments = [unquote(s) for s in raw_path.decode("ascii").split("/")]
        except UnicodeDecodeError:
            segments = None
        if segments is not None and "/".join(segments) == path:
            return "/".join(s.replace("%", "%25").replace("/", "%2F") for s in segments)
    return path.replace("%", "%25")


def unescape(value: str) -> str:
    """A path value as the client meant it: ``%2F`` → ``/``, ``%25`` → ``%``."""
    if "%" not in value:
        return value
    return _ESCAPED.sub(lambda m: "/" if m[1] == "2F" else "%", value)


class Segment(UnicodeConverter):
    """One path segment (Werkzeug's default), unescaped."""

    def to_python(self, value: str) -> str:
        return unescape(value)


class Rest(PathConverter):
    """The rest of the path, ``/`` included (Werkzeug's ``path``), unescaped."""

    def to_python(self, value: str) -> str:
        return unescape(value)


def spanning(excluded: str) -> str:
    """The regex of one or more segments, none of them ``excluded`` (so that the literal
    segment a rule puts after the name is never taken as part of it)."""
    segment = rf"(?!{excluded}(?![^/]))[^/]+"
    return rf"{segment}(?:/{segment})*"


class QueueName(BaseConverter):
    """A queue name in the pop routes: one or more segments, none of them ``partition``."""

    part_isolating = False
    regex = spanning("partition")

    def to_python(self, value: str) -> str:
        return unescape(value)


CONVERTERS: Final[dict[str, type[BaseConverter]]] = {
    "default": Segment,
    "string": Segment,
    "path": Rest,
    "queue": QueueName,
}

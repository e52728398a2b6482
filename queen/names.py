"""Names: what a queue, partition or consumer group name may be (one rule, everywhere), and
what any other text bound for a text column may hold."""

from __future__ import annotations

import re

MAX_NAME_CHARS = 255

# Control characters and unpaired surrogates: PostgreSQL text cannot hold NUL or a surrogate,
# and the others have no business in a name (they would also break the store's column joins).
CONTROL = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
BAD_CHARS = "must not contain control characters or unpaired surrogates"


def name_problem(value: object) -> str | None:
    """Why ``value`` is not a valid name (a phrase to follow the field's name), or None."""
    if type(value) is not str:
        return "must be a string"
    if not value:
        return "must not be empty"
    if len(value) > MAX_NAME_CHARS:
        return f"is longer than {MAX_NAME_CHARS} characters"
    if CONTROL.search(value):
        return BAD_CHARS
    return None


# What PostgreSQL text (and jsonb) cannot hold at all: NUL and unpaired surrogates.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
UNSTORABLE_CHARS = "must not contain NUL or unpaired surrogates"


def text_problem(value: str) -> str | None:
    """Why a free text (a transaction id, an error message, a search) cannot be stored or
    looked up (a phrase to follow the field's name), or None."""
    return UNSTORABLE_CHARS if UNSTORABLE.search(value) else None

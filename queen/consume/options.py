"""Queue options (``POST /api/v1/configure``): validation (the defaults and the keys are
:class:`queen.records.QueueOptions` and :data:`queen.records.OPTION_FIELDS`; the answer's
``options`` is :func:`queen.http.render.queue_options`).

Pure: no I/O. Configure is an upsert that overwrites every option, so a key missing from a call
goes back to its default. Unknown keys are ignored (clients send extras); ``null`` counts as
missing. What each option does in this broker:

- ``leaseTime`` (s): how long a pop leases a partition to one consumer of a group.
- ``retryLimit``: failed acks retried before the message goes to the dead letter queue.
- ``retryDelay`` (ms): after a failed ack, the partition waits this long before redelivery.
- ``delayedProcessing`` (s): a message is delivered only once it is this old.
- ``windowBuffer`` (s): a partition is delivered only once it has been quiet this long, so a
  burst is consumed as one batch.
- ``priority``: when one pop spans several queues (namespace/task pop), higher goes first.
- ``dedupWindowSeconds``: push deduplication window (0 turns dedup off).
- ``retentionEnabled`` (default false) with ``retentionSeconds`` and
  ``completedRetentionSeconds``: removal of old messages by the retention pass; without
  ``retentionEnabled`` both times are stored and remove nothing.
- ``maxWaitTimeSeconds`` (0 = off): messages some consumer group has not consumed that long
  after they were stored are evicted (removed) by the retention pass, whatever
  ``retentionEnabled`` says.
- ``maxSize``, ``ttl``, ``deadLetterQueue``, ``dlqAfterMaxRetries``: stored and reported; a
  message that exhausts its retries always goes to the dead letter queue.
- ``encryptionEnabled``: payloads pushed from then on are stored encrypted (AES-256-GCM) when
  ``QUEEN_ENCRYPTION_KEY`` is set, in plaintext otherwise (see :mod:`queen.encryption`).
"""

from __future__ import annotations

from typing import Any

from queen.consume.errors import InvalidRequest
from queen.records import INT32_MAX as _INT32_MAX
from queen.records import OPTION_FIELDS as _FIELDS
from queen.records import QueueOptions


def parse_options(raw: Any) -> QueueOptions:
    """Validate the ``options`` object of a configure call; missing keys take defaults.

    Raises :class:`InvalidRequest` naming the first bad option.
    """
    if raw is None:
        raw = {}
    if type(raw) is not dict:
        raise InvalidRequest("options must be an object")
    values: dict[str, Any] = {}
    for key, name, lowest in _FIELDS:
        value = raw.get(key)
        if value is None:
            continue
        if lowest is None:
            if type(value) is not bool:
                raise InvalidRequest(f"options.{key} must be a boolean")
            values[name] = value
        else:
            values[name] = _integer(key, value, lowest)
    return QueueOptions(**values)


def checked_options(options: QueueOptions) -> QueueOptions:
    """The same rules on typed options (an embedding program's); raises
    :class:`InvalidRequest` naming the first bad option by its wire name."""
    for key, name, lowest in _FIELDS:
        value = getattr(options, name)
        if lowest is None:
            if type(value) is not bool:
                raise InvalidRequest(f"options.{key} must be a boolean")
        else:
            _integer(key, value, lowest)
    return options


def _integer(key: str, value: Any, lowest: int) -> int:
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int:
        raise InvalidRequest(f"options.{key} must be an integer")
    if not lowest <= value <= _INT32_MAX:
        raise InvalidRequest(f"options.{key} must be between {lowest} and {_INT32_MAX}")
    return value

"""Which queues are encrypted, and sealing their payloads on the way in.

:class:`QueueEncryption` keeps, in every broker process, the set of queues configured with
``encryptionEnabled: true`` (read from ``queen.queues``), and the cipher of
``QUEEN_ENCRYPTION_KEY`` if one is set. The write paths ask it, per write, whether to seal:

- a partition actor seals the payloads of the live requests it takes, just before it writes
  them to PostgreSQL or to the spool (so the spool holds ciphertext too); frames replayed from
  the spool are stored as they were spooled;
- a transaction seals the payloads it pushes before its one database call.

The set is refreshed every ``refresh_s`` (the refresh task is :meth:`run`; a failed refresh
keeps the last known set), and a ``configure`` or queue delete in this process applies at once;
other broker processes follow within ``refresh_s``. Until the set has been read once (the
database was unreachable since start-up) every queue counts as encrypted when a key is set:
pushes spooled then are sealed rather than risk plaintext on disk. Readers open envelopes by
their marker (:func:`queen.cipher.open_payload`), so whatever a write decided, every read
path returns the plaintext.

Without a key, encrypted queues work in plaintext; the start-up log, ``configure`` and
``/health`` say so.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from queen.cipher import PREFIX, PayloadCipher, PayloadUnreadable, open_payload, trace_associated
from queen.errors import StoreError
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.encryption")

__all__ = ["PayloadUnreadable", "QueueEncryption", "SealableFrames"]


class SealableFrames(Protocol):
    """Frames whose payloads may be replaced by their envelopes (a push request, a batch)."""

    message_ids: list[str]
    payloads: list[bytes]


@dataclass(frozen=True, slots=True)
class EncryptionStatus:
    """Whether a key is set, and which queues ask for encryption without one
    (``plaintext_queues``: None unless some do, at most 100 names)."""

    key_set: bool
    key_id: str | None
    encrypted_queues: int
    plaintext_queues: tuple[str, ...] | None = None


class QueueEncryption:
    def __init__(
        self,
        cipher: PayloadCipher | None,
        load: Callable[[], Awaitable[set[str]]] | None,
        *,
        refresh_s: float,
    ) -> None:
        self.cipher = cipher
        self._load = load
        self._refresh_s = refresh_s
        self._queues: set[str] = set()
        self._known = load is None  # without a database there is nothing to read

    @property
    def queues(self) -> frozenset[str]:
        """The queues configured with encryption, as last read."""
        return frozenset(self._queues)

    def seals(self, queue: str) -> bool:
        """Whether a write to ``queue`` now stores its payloads encrypted."""
        if self.cipher is None:
            return False
        return queue in self._queues or not self._known

    def seal(self, queue: str, frames: Sequence[SealableFrames]) -> None:
        """Replace the payloads of ``frames`` by envelopes if ``queue`` is encrypted (one set
        look-up otherwise). The payload lists are replaced, never changed in place."""
        cipher = self.cipher
        if cipher is None or (self._known and queue not in self._queues):
            return
        for part in frames:
            part.payloads = cipher.seal_many(part.payloads, part.message_ids)

    def open(self, stored: str, message_id: str) -> str:
        """The plaintext JSON of a stored payload (see :func:`queen.cipher.open_payload`)."""
        return open_payload(self.cipher, stored, message_id)

    def seal_trace(self, queue: str, partition_id: int, transaction_id: str, data: str) -> str:
        """A trace's ``data`` as stored: an envelope bound to its message if ``queue`` is
        encrypted, else ``data`` itself."""
        cipher = self.cipher
        if cipher is None or not self.seals(queue):
            return data
        associated = trace_associated(partition_id, transaction_id)
        return cipher.seal_bound(data.encode("utf-8"), associated).decode("ascii")

    def open_trace(self, stored: str, partition_id: int | None, transaction_id: str | None) -> str:
        """The plaintext JSON of a stored trace's ``data``. Raises :class:`PayloadUnreadable`
        when it is sealed and cannot be opened."""
        if not stored.startswith(PREFIX):
            return stored
        what = f"a trace of {transaction_id!r} in partition {partition_id}"
        if self.cipher is None:
            raise PayloadUnreadable(f"{what} is encrypted and QUEEN_ENCRYPTION_KEY is not set")
        if partition_id is None or transaction_id is None:
            raise PayloadUnreadable(f"{what} is encrypted and its message is unknown")
        return self.cipher.open_bound(stored, trace_associated(partition_id, transaction_id), what)

    def configured(self, queue: str, encrypted: bool) -> None:
        """A ``configure`` of ``queue`` in this process committed: apply it now."""
        if encrypted:
            self._queues.add(queue)
            if self.cipher is None:
                log.warning(
                    "queue %r asks for encryption but QUEEN_ENCRYPTION_KEY is not set: its "
                    "payloads are stored in plaintext",
                    queue,
                )
        else:
            self._queues.discard(queue)

    def deleted(self, queue: str) -> None:
        self._queues.discard(queue)

    async def load(self) -> None:
        """Read the set of encrypted queues now. Raises :class:`StoreError`."""
        if self._load is None:
            return
        self._queues = set(await self._load())
        self._known = True

    def log_state(self) -> None:
        """The start-up log line about encryption."""
        if self.cipher is not None:
            log.info("encryption: AES-256-GCM with key %s", self.cipher.key_id)
        elif self._queues:
            log.warning(
                "encryption: %d queue(s) ask for encryption (%s) but QUEEN_ENCRYPTION_KEY is "
                "not set: their payloads are stored in plaintext",
                len(self._queues),
                ", ".join(sorted(self._queues)[:10]),
            )
        else:
            log.info("encryption: no QUEEN_ENCRYPTION_KEY (queues are stored in plaintext)")

    def status(self) -> EncryptionStatus:
        """The ``encryption`` section of ``/health``."""
        keyless = self.cipher is None and bool(self._queues)
        return EncryptionStatus(
            key_set=self.cipher is not None,
            key_id=self.cipher.key_id if self.cipher is not None else None,
            encrypted_queues=len(self._queues),
            plaintext_queues=tuple(sorted(self._queues)[:100]) if keyless else None,
        )

    async def run(
        self, *, task_status: trio.TaskStatus[QueueEncryption] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Refresh the set every ``refresh_s`` until cancelled; a failure keeps the last set
        (and is reported to the loop's supervision). A pause after each refresh, not a fixed
        rate: see :meth:`queen.maintenance.MaintenanceSwitch.run`."""
        task_status.started(self)
        if self._load is None:
            return
        while True:
            await trio.sleep(self._refresh_s)
            try:
                await self.load()
            except StoreError as exc:
                log.debug("encrypted queues not refreshed: %s", exc)
                report_failure(exc)
            except Exception as exc:
                log.exception("encrypted queues not refreshed")
                report_failure(exc)
            else:
                report_ok()

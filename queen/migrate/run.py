"""The import's phases, over the SQL of :mod:`queen.storage.original` and
:mod:`queen.storage.importer`.

1. **Check.** The source is an original Queen database and not the target; the target is not
   an original's database; no queue of the source exists here unless an earlier import made
   it; encrypted messages can be opened. Any failure refuses the import and writes nothing.
2. **Queues and partitions**, with the queues' options, each created once.
3. **Messages**, partition by partition in the original's order, ``batch_size`` at a time:
   each batch is one target transaction that also records how far the partition is, so a
   killed import continues after the last whole batch and never stores a message twice.
4. **Positions and dead letters**, in one transaction (see :mod:`queen.migrate.plan`).

The source is read in one repeatable-read, read-only snapshot: a source still in use is
imported as of the moment the import began (stop the original first to take everything).

:meth:`Importer.interrupt` (Ctrl-C) stops it at the next batch: the batch being written is
committed or not at all, a read of the source in progress is cancelled, and
:class:`ImportInterrupted` is raised. What was committed stays, as after a killed import: the
next run continues from there. Once the positions are being written (phase 4, one
transaction) the import finishes.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from queen.cipher import PayloadCipher, parse_key
from queen.errors import QueenError
from queen.migrate.payloads import OriginalPayloadUnreadable, stored_payload
from queen.migrate.plan import QueuePlan, Target, cursor_plan, named_groups, start_cursors
from queen.migrate.progress import Progress
from queen.storage.import_records import (
    DeadLetterWrite,
    ImportState,
    OriginalDeadLetter,
    OriginalMessage,
    OriginalPartition,
    OriginalQueue,
    PartitionMoved,
    PositionsWritten,
)
from queen.storage.importer import (
    create_partition,
    create_queue,
    existing_queues,
    import_state,
    prepare_target,
    write_messages,
    write_positions,
)
from queen.storage.original import (
    OriginalReader,
    identity,
    open_snapshot,
    original_shape_problem,
    read_partitions,
    read_queues,
)
from queen.storage.postgres import ForeignSchemaError, check_foreign_schema

# Fault injection for the tests: the process kills itself (SIGKILL) right after committing
# this many message batches, as `kill -9` would.
KILL_AFTER_BATCHES_ENV = "QUEEN_IMPORT_KILL_AFTER_BATCHES"


class ImportRefused(QueenError):
    """The import cannot start; nothing was written. The text is one line for an operator."""


class ImportInterrupted(QueenError):
    """Stopped when asked (:meth:`Importer.interrupt`); ``messages`` were committed by this
    run before it stopped."""

    def __init__(self, messages: int) -> None:
        super().__init__(f"interrupted after {messages} messages")
        self.messages = messages


@dataclass(frozen=True, slots=True)
class ImportOptions:
    source_url: str
    target_conninfo: str
    dry_run: bool = False
    batch_size: int = 1000
    dedup_window_s: int = 3600  # of every imported queue (this broker's default)
    encryption_key: str | None = None  # QUEEN_ENCRYPTION_KEY: the original's and ours


@dataclass(slots=True)
class ImportReport:
    queues: list[QueuePlan]
    dry_run: bool
    positions: PositionsWritten | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def to_import(self) -> int:
        return sum(q.to_import for q in self.queues)


def _connect(url: str, what: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=10,
            application_name="queen import",
            options="-c jit=off",
        )
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImportRefused(f"cannot connect to {what}: {first}") from None


class Importer:
    def __init__(self, options: ImportOptions, progress: Progress) -> None:
        self.options = options
        self.progress = progress
        self.key = parse_key(options.encryption_key) if options.encryption_key else None
        self.cipher = PayloadCipher(self.key) if self.key else None
        kill = os.environ.get(KILL_AFTER_BATCHES_ENV)
        self.kill_after = int(kill) if kill else None
        self.batches = 0
        self.copied = 0  # messages committed by this run
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._source: psycopg.Connection[Any] | None = None

    def interrupt(self) -> None:
        """Stop at the next batch (from any thread): see the module."""
        self._stop.set()
        source = self._source
        if source is not None:
            try:
                source.cancel_safe(timeout=5.0)
            except psycopg.Error:
                pass  # the source is gone already: the import stops at its next read

    def _stop_here(self) -> None:
        if self._stop.is_set():
            raise ImportInterrupted(self.copied)

    def run(self) -> ImportReport:
        self._stop_here()
        source = _connect(self.options.source_url, "--from")
        self._source = source
        try:
            target = _connect(self.options.target_conninfo, "the target database")
            try:
                return self._run(source, target)
            except psycopg.errors.QueryCanceled:
                if self._stop.is_set():  # our cancel of a source read
                    raise ImportInterrupted(self.copied) from None
                raise
            finally:
                target.close()
        finally:
            self._source = None
            source.close()

    # --- phase 1 ---------------------------------------------------------------------------

    def _check(self, source: psycopg.Connection[Any], target: psycopg.Connection[Any]) -> None:
        problem = original_shape_problem(source)
        if problem is not None:
            raise ImportRefused(f"--from is not an original Queen database: {problem}")
        if identity(source).same_as(identity(target)):
            raise ImportRefused(
                "--from is the database this broker is configured for (DATABASE_URL, PG_* or "
                "the embedded default); import into another database"
            )
        try:
            if self.options.dry_run:
                check_foreign_schema(target)
            else:
                prepare_target(target)
        except ForeignSchemaError as exc:
            raise ImportRefused(f"the target database cannot be used: {exc}") from None

    def _run(
        self, source: psycopg.Connection[Any], target: psycopg.Connection[Any]
    ) -> ImportReport:
        self._check(source, target)
        self._stop_here()
        open_snapshot(source)
        reader = OriginalReader(source)
        queues = read_queues(source)
        partitions = read_partitions(source)
        state = import_state(target)
        existing = existing_queues(target, [q.name for q in queues])
        clash = [q.name for q in queues if q.name in existing and q.source_id not in state.queues]
        if clash:
            shown = ", ".join(clash[:5]) + (f" and {len(clash) - 5} more" if len(clash) > 5 else "")
            raise ImportRefused(
                f"queues already exist in the target and were not imported from --from: {shown}"
            )
        live = [q for q in queues if q.source_id not in state.deleted_queues]
        live_ids = {q.source_id for q in live}
        parts = [
            p
            for p in partitions
            if p.source_queue in live_ids and p.source_id not in state.deleted_partitions
        ]
        if self.key is None and any(p.encrypted for p in parts):
            count = sum(p.encrypted for p in parts)
            raise ImportRefused(
                f"{count} messages are stored encrypted; set QUEEN_ENCRYPTION_KEY to the "
                "original's key"
            )
        pending = {p.source_id: self._pending(reader, p, state) for p in parts}
        name_of = {q.source_id: q.name for q in queues}
        skipped_notes: list[str] = []
        kept = []
        for p in parts:
            imported_before = p.source_id in state.partitions
            if (p.source_id in state.served and pending[p.source_id] > 0) or (
                not imported_before and (p.source_queue, p.name) in state.served_new
            ):
                # Messages were pushed to it here since the import began: the original's
                # remaining ones cannot be put before them, nor its positions applied.
                skipped_notes.append(
                    self._served_note(f"{name_of[p.source_queue]}/{p.name}", pending[p.source_id])
                )
                pending[p.source_id] = 0
                continue
            kept.append(p)
        parts = kept
        positions = reader.positions()
        subs = reader.subscriptions()
        letters = [d for d in reader.dead_letters() if d.source_id not in state.dead_letters]
        report = ImportReport(
            self._plans(
                queues,
                partitions,
                state,
                pending=pending,
                positions=positions,
                subs=subs,
                letters=letters,
            ),
            self.options.dry_run,
        )
        for q in queues:
            if q.source_id in state.deleted_queues:
                report.notes.append(f"{q.name}: imported before and deleted here since; skipped")
        report.notes.extend(skipped_notes)
        if self.options.dry_run:
            return report

        self._stop_here()
        by_queue = {q.source_id: q for q in live}
        self.progress.start(sum(pending.values()))
        try:
            targets = self._copy(
                target, reader, queues=live, parts=parts, state=state, pending=pending
            )
        finally:
            self.progress.finish()
        self._stop_here()
        groups, cursors, wanted = cursor_plan(live, parts, positions, subs, targets)
        counts = reader.subscriptions_through([(w.source_partition, w.sub.since) for w in wanted])
        cursors += start_cursors(wanted, counts, targets)
        queue_of = {p.source_id: by_queue[p.source_queue] for p in parts}
        dead = [self._dead_letter(d, targets, queue_of) for d in letters]
        report.notes.extend(self.notes)
        report.positions = write_positions(
            target, groups, cursors, [d for d in dead if d is not None]
        )
        return report

    def _pending(self, reader: OriginalReader, p: OriginalPartition, state: ImportState) -> int:
        done = state.partitions.get(p.source_id)
        if done is None or done.last_created_at is None or done.last_id is None:
            return p.messages
        return p.messages - reader.count_through(p.source_id, (done.last_created_at, done.last_id))

    def _plans(
        self,
        queues: Sequence[OriginalQueue],
        partitions: Sequence[OriginalPartition],
        state: ImportState,
        *,
        pending: dict[str, int],
        positions: Sequence[Any],
        subs: Sequence[Any],
        letters: Sequence[OriginalDeadLetter],
    ) -> list[QueuePlan]:
        plans = []
        for q in queues:
            mine = [p for p in partitions if p.source_queue == q.source_id]
            ids = {p.source_id for p in mine}
            skipped = q.source_id in state.deleted_queues
            plans.append(
                QueuePlan(
                    name=q.name,
                    partitions=len(mine),
                    messages=sum(p.messages for p in mine),
                    imported=sum(
                        state.partitions[p.source_id].messages
                        for p in mine
                        if p.source_id in state.partitions
                    ),
                    to_import=0 if skipped else sum(pending.get(i, 0) for i in ids),
                    groups=len(named_groups(q, partitions, positions, subs)),
                    queue_mode=any(
                        pos.source_partition in ids and pos.consumer_group == "__QUEUE_MODE__"
                        for pos in positions
                    ),
                    dead_letters=0
                    if skipped
                    else sum(1 for d in letters if d.source_partition in ids),
                    note="deleted here since imported" if skipped else "",
                )
            )
        return plans

    # --- phases 2 and 3 -------------------------------------------------------------------

    def _copy(
        self,
        target: psycopg.Connection[Any],
        reader: OriginalReader,
        *,
        queues: Sequence[OriginalQueue],
        parts: Sequence[OriginalPartition],
        state: ImportState,
        pending: dict[str, int],
    ) -> dict[str, Target]:
        queue_ids = dict(state.queues)
        for q in queues:
            self._stop_here()
            if q.source_id not in queue_ids:
                queue_ids[q.source_id] = create_queue(target, q, self.options.dedup_window_s)
        by_id = {q.source_id: q for q in queues}
        targets: dict[str, Target] = {}
        for p in parts:
            self._stop_here()
            q = by_id[p.source_queue]
            where = f"{q.name}/{p.name}"
            done = state.partitions.get(p.source_id)
            if done is None:
                try:
                    pid = create_partition(target, queue_ids[q.source_id], p)
                except PartitionMoved:
                    self.notes.append(self._served_note(where, pending[p.source_id]))
                    continue
                imported, after = 0, None
            else:
                pid, imported = done.partition_id, done.messages
                after = (
                    (done.last_created_at, done.last_id)
                    if done.last_created_at is not None and done.last_id is not None
                    else None
                )
            cipher = self.cipher if q.encryption_enabled else None
            left = pending[p.source_id]
            moved = False
            while left > 0:
                self._stop_here()
                batch = reader.messages_after(p.source_id, after, self.options.batch_size)
                if not batch:
                    break
                try:
                    stored = [self._payload(m, cipher) for m in batch]
                    write_messages(
                        target,
                        partition_id=pid,
                        source_partition=p.source_id,
                        messages=batch,
                        payloads=stored,
                        dedup_window_s=self.options.dedup_window_s,
                    )
                except PartitionMoved:
                    self.notes.append(self._served_note(where, left))
                    moved = True
                    break
                imported += len(batch)
                self.copied += len(batch)
                left -= len(batch)
                after = (batch[-1].created_at, batch[-1].id)
                self.progress.advance(where, len(batch))
                self._batch_committed()
            self.progress.partition_done(where, imported)
            if moved:  # neither positions nor dead letters apply to what was not imported
                continue
            if left > 0:
                # Counted, but not readable in order: rows without a creation time.
                self.notes.append(f"{where}: {left} messages without a creation time not imported")
            base = imported - (reader.count_through(p.source_id, after) if after else 0)
            targets[p.source_id] = Target(pid, queue_ids[q.source_id], base, imported)
        return targets

    @staticmethod
    def _served_note(where: str, left: int) -> str:
        return (
            f"{where}: skipped, {left} messages not imported: it holds messages pushed here "
            "since the import began, and the original's would come after them out of order"
        )

    def _payload(self, m: OriginalMessage, cipher: PayloadCipher | None) -> str:
        try:
            return stored_payload(
                m.payload,
                encrypted=m.encrypted,
                message_id=m.id,
                original_key=self.key,
                cipher=cipher,
            )
        except OriginalPayloadUnreadable as exc:
            raise ImportRefused(str(exc)) from None

    def _batch_committed(self) -> None:
        self.batches += 1
        if self.kill_after is not None and self.batches >= self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    def _dead_letter(
        self,
        d: OriginalDeadLetter,
        targets: dict[str, Target],
        queue_of: dict[str, OriginalQueue],
    ) -> DeadLetterWrite | None:
        t = targets.get(d.source_partition)
        if t is None:
            return None
        m = d.message
        cipher = self.cipher if queue_of[d.source_partition].encryption_enabled else None
        return DeadLetterWrite(
            source_id=d.source_id,
            queue_id=t.queue_id,
            partition_id=t.partition_id,
            consumer_group=d.consumer_group,
            msg_offset=t.base + d.before,
            message_id=m.id,
            transaction_id=m.transaction_id,
            payload=self._payload(m, cipher),
            producer_sub=m.producer_sub,
            trace_id=m.trace_id,
            error=d.error,
            retry_count=d.retry_count,
            failed_at=d.failed_at,
        )

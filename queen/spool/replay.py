"""The spool replay loop (``spool-replay``, supervised by :mod:`queen.supervision`): it stores
spooled frames once PostgreSQL answers.

A pass runs while the database is up and maintenance mode is off, and only in the one process
holding the directory's replay lock (several processes may share a spool directory; they never
replay at the same time). The lock is an ``flock`` of the file ``replay.lock``: if the directory
is removed and made again meanwhile, the name leads to a new file another process can lock. So
the pass checks that the name still leads to the file it locked after taking the lock, before
removing the files it found done, and before and after each chunk; if not, it stops, and the
loop takes the lock again at once. A pass seals this process's active file, then:

1. reads the sealed spool files (every process's; oldest first, up to ``read_budget_bytes``),
   each from its progress mark;
2. lists the directory again and reads every file it did not read in step 1 (files other
   processes are still writing, files that appeared meanwhile). Their records are not replayed
   in this pass; each partition they hold gets a **barrier**, the smallest order stamp they
   hold for it. Files left out by the budget give one barrier for all partitions (their
   creation time, less a second: their records were stamped after it);
3. merges the records of step 1 by order stamp and keeps, per partition, those stamped before
   its barrier (a prefix of that partition's records in stamp order);
4. replays them in chunks of ``chunk_items`` frames: each partition's frames of a chunk go, in
   stamp order, to that partition's actor as one replay request (the normal write path, with
   the original message and transaction ids, so a frame already stored comes back
   ``duplicate`` and counts as done); chunks go one after another.

After a chunk commits, each file it touched gets its progress mark (committed prefix, plus
the committed records past it); a file whose every record is committed is removed. If a chunk
fails (the database went away again), the pass stops and the files stay, to be resumed from
their marks.

Why step 2 comes after step 1: a record answered before a record read in step 1 was written
before that read, so step 2 sees it (its file is listed, its bytes are there). So no frame is
replayed while a frame of its partition answered before it waits anywhere in the directory.

Ranges of a file that hold no readable record (a torn tail after a crash, a bad checksum) are
copied to the quarantine folder with a note, logged and counted; every readable record around
them is replayed. A file is removed only once its unreadable ranges are kept in quarantine.

Items of a queue deleted after they were spooled are not replayed (the queue is not created
again for them): they are counted in ``spool_dropped_deleted_queue_items`` and logged.

The loop also keeps the :class:`SpoolIndex` true to the directory through the
:class:`SpoolScanner`, on start and at every tick.

What goes wrong in a turn (the directory cannot be read, a progress mark cannot be saved, the
deleted queues cannot be read) is logged, and reported to the loop's supervision at the end of
the turn (``/health`` shows the loop failing until a turn goes well). Waiting while the
database is away is no failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
from trio_util import RepeatedEvent

from queen.actors.messages import PushRequest
from queen.errors import QueenError, StoreError
from queen.frames import concat
from queen.health import DatabaseHealth
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.model import PartitionKey, Status
from queen.spool import files
from queen.spool.format import SpoolRecord
from queen.spool.index import SpoolIndex
from queen.spool.plan import FileRead, Item, Plan, Planner
from queen.spool.scan import SpoolScanner
from queen.spool.writer import SpoolWriter
from queen.supervision import report_failure, report_ok

log = logging.getLogger("queen.spool")

Submit = Callable[[PartitionKey, PushRequest], Awaitable[None]]
# For queue names: those deleted, with the time of their latest deletion (Unix ns).
DeletedQueues = Callable[[list[str]], Awaitable[dict[str, int]]]


class LockLost(QueenError):
    """The directory's ``replay.lock`` no longer names the file this process locked."""


class Replayer:
    def __init__(
        self,
        directory: Path,
        index: SpoolIndex,
        *,
        writer: SpoolWriter,
        submit: Submit,
        health: DatabaseHealth,
        maintenance: MaintenanceSwitch,
        changed: RepeatedEvent,
        metrics: Metrics,
        chunk_items: int,
        tick_s: float,
        scanner: SpoolScanner | None = None,
        deleted_queues: DeletedQueues | None = None,
        read_budget_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self._dir = directory
        self._index = index
        self._writer = writer
        self._submit = submit
        self._health = health
        self._maintenance = maintenance
        self._changed = changed
        self._metrics = metrics
        self._chunk_items = chunk_items
        self._tick_s = tick_s
        self._scanner = scanner or SpoolScanner(directory, index, writer.own_names)
        self._deleted_queues = deleted_queues
        self._planner = Planner(directory, read_budget_bytes=read_budget_bytes)
        self._reported: set[tuple[str, int]] = set()  # unreadable ranges already logged
        self._idle_signature: files.Signature | None = None  # of the last fruitless pass
        self.last_rate = 0.0  # frames per second of the last pass that replayed anything
        self._trouble: str | None = None  # what went wrong in this turn, reported at its end

    def may_replay(self) -> bool:
        return self._health.up and not self._maintenance.enabled

    async def run(
        self, *, task_status: trio.TaskStatus[Replayer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Replay whenever there is something to replay and it is allowed; until cancelled."""
        await self.refresh()
        self._turn_done()
        task_status.started(self)
        while True:
            progressed = False
            if self.may_replay() and self._index.file_count:
                progressed = await self.replay_pass()
            if not progressed:
                with trio.move_on_after(self._tick_s):
                    await self._changed.wait()
            await self.refresh()
            self._turn_done()

    def _turn_done(self) -> None:
        """Tell the loop's supervision how the turn went."""
        if self._trouble is None:
            report_ok()
        else:
            report_failure(self._trouble)
            self._trouble = None

    async def refresh(self) -> None:
        """Make the index match the directory (files gone, files not yet counted, files of
        other processes that grew or were let go)."""
        try:
            dropped = self._scanner.sync(check_seals=True)
        except OSError as exc:
            log.warning("spool directory %s could not be read: %s", self._dir, exc)
            self._trouble = f"spool directory not readable: {exc}"
            return
        if dropped:
            self._changed.set()

    async def replay_pass(self) -> bool:
        """One pass over the directory; True if anything was committed or removed, or if
        the lock was lost (the loop comes straight back to take it again).

        A pass that could replay nothing (every frame waits behind a file still being
        written) is not repeated until a spool file changes."""
        try:
            with files.replay_lock(self._dir) as lock:
                return lock is not None and await self._locked_pass(lock)
        except LockLost:
            log.warning(
                "spool replay: %s is no longer the file this process locked (the directory "
                "was removed, or the lock file); the pass stops and the lock is taken again",
                self._dir / files.REPLAY_LOCK,
            )
            self._idle_signature = None
            return True
        except OSError as exc:
            log.warning("spool directory %s could not be read: %s", self._dir, exc)
            self._trouble = f"spool directory not readable: {exc}"
            return False

    async def _locked_pass(self, lock: files.ReplayLock) -> bool:
        await self._writer.seal()
        signature = await trio.to_thread.run_sync(files.signature, self._dir)
        if signature == self._idle_signature:
            return False
        plan = await trio.to_thread.run_sync(self._planner.plan)
        self._report(plan)
        started = time.monotonic()
        replayed_before = self._metrics.spool_replayed_items
        await self._still_held(lock)
        progressed = await self._remove_finished(plan, list(plan.files.values()))
        chunk: list[tuple[FileRead, Item]] = []
        frames = 0
        for entry in plan.entries:
            if not self.may_replay():
                break
            assert entry[1].record is not None
            chunk.append(entry)
            frames += len(entry[1].record)
            if frames >= self._chunk_items:
                if not await self._commit_chunk(plan, chunk, lock):
                    break
                progressed = True
                chunk, frames = [], 0
        else:
            if chunk and await self._commit_chunk(plan, chunk, lock):
                progressed = True
        frames = self._metrics.spool_replayed_items - replayed_before
        if frames:
            self.last_rate = frames / max(time.monotonic() - started, 1e-6)
            log.info(
                "spool replay: %d frames in this pass (%.0f/s), %d still spooled",
                frames,
                self.last_rate,
                self._index.total,
            )
        if plan.held_back:
            log.debug(
                "spool replay: %d frames wait for earlier frames still being written",
                plan.held_back,
            )
        fruitless = not plan.entries and not progressed
        self._idle_signature = signature if fruitless else None
        return progressed

    def _report(self, plan: Plan) -> None:
        """Log what the planning met: leftovers removed, unreadable ranges (once each)."""
        for name in plan.swept:
            log.info("spool: removed %s, left by an interrupted write", name)
        for found in plan.unreadable:
            skipped = found.skipped
            if found.kept_as is None:
                log.error(
                    "spool file %s: %d unreadable bytes at offset %d (%s) could not be put in "
                    "quarantine (%s); the file is kept",
                    found.name,
                    skipped.length,
                    skipped.offset,
                    skipped.reason,
                    found.error,
                )
                continue
            if (found.name, skipped.offset) in self._reported:
                continue
            self._reported.add((found.name, skipped.offset))
            self._metrics.spool_damaged_ranges += 1
            log.error(
                "spool file %s: %d unreadable bytes at offset %d (%s) moved to %s",
                found.name,
                skipped.length,
                skipped.offset,
                skipped.reason,
                found.kept_as,
            )

    # --- replaying ----------------------------------------------------------------------------

    async def _still_held(self, lock: files.ReplayLock) -> None:
        """Raise :class:`LockLost` unless ``replay.lock`` is still the file this process
        locked: another process may have locked the one that replaced it, and two processes
        must never replay (or mark, or remove files) at once."""
        if not await trio.to_thread.run_sync(lock.held):
            raise LockLost

    async def _commit_chunk(
        self, plan: Plan, chunk: list[tuple[FileRead, Item]], lock: files.ReplayLock
    ) -> bool:
        """Replay ``chunk``; on success record it in the index and the progress marks."""
        await self._still_held(lock)
        if not await self._replay_chunk(chunk):
            return False
        await self._still_held(lock)
        touched: dict[str, FileRead] = {}
        for file, item in chunk:
            assert item.record is not None
            item.done = True
            touched[file.name] = file
        await self._remove_finished(plan, list(touched.values()), write_marks=True)
        self._changed.set()
        return True

    async def _remove_finished(
        self, plan: Plan, touched: list[FileRead], *, write_marks: bool = False
    ) -> bool:
        """Remove the files of ``touched`` whose every record is committed; write the progress
        mark of the others (if ``write_marks``). True if a file was removed."""
        removed = False
        for file in touched:
            prefix = file.items[0].offset if file.items else file.size
            done: set[int] = set()
            complete = True
            for item in file.items:
                if item.done and complete:
                    prefix = item.end
                elif item.done:
                    done.add(item.offset)
                else:
                    complete = False
            try:
                if complete and file.kept and prefix >= file.size:
                    await trio.to_thread.run_sync(files.remove, self._dir, file.name)
                    self._scanner.forget(file.name)
                    plan.files.pop(file.name, None)
                    removed = True
                elif write_marks:
                    mark = files.Progress(prefix, frozenset(done))
                    await trio.to_thread.run_sync(files.write_progress, self._dir, file.name, mark)
                    log.debug("spool file %s: committed up to offset %d", file.name, prefix)
            except OSError as exc:  # the mark is an optimisation: replaying again is safe
                self._trouble = f"progress of {file.name} not saved: {exc.strerror or exc}"
                if file.name not in plan.unsaved:  # once per file and pass
                    plan.unsaved.add(file.name)
                    log.error(
                        "spool file %s: progress not saved (%s); replay goes on",
                        file.name,
                        exc.strerror or exc,
                    )
        if removed:
            self._changed.set()
        return removed

    async def _replay_chunk(self, chunk: list[tuple[FileRead, Item]]) -> bool:
        by_key: dict[PartitionKey, list[tuple[FileRead, SpoolRecord]]] = {}
        for file, item in chunk:
            assert item.record is not None
            by_key.setdefault(item.record.key, []).append((file, item.record))
        try:
            dropped = await self._drop_deleted(by_key)
        except StoreError as exc:
            log.warning("spool replay: could not read which queues were deleted: %s", exc)
            self._trouble = f"deleted queues not read: {exc}"
            return False
        sent: list[tuple[list[tuple[FileRead, SpoolRecord]], PushRequest]] = []
        for key, group in by_key.items():
            request = merge([record for _, record in group])
            await self._submit(key, request)
            sent.append((group, request))
        ok = True
        duplicates = 0
        for _, request in sent:
            outcome = await request.reply.wait()
            if outcome.status is not Status.QUEUED:
                ok = False
            duplicates += len(outcome.duplicates)
        if not ok:
            return False
        for group in [*(g for g, _ in sent), *dropped.values()]:
            for file, record in group:
                self._index.settle(file.name, record.key, len(record))
        for _, request in sent:
            self._metrics.spool_replayed_items += len(request)
        for key, gone in dropped.items():
            items = sum(len(r) for _, r in gone)
            self._metrics.spool_dropped_deleted_queue_items += items
            log.warning(
                "spool: %d items of %s/%s dropped: their queue was deleted after they were spooled",
                items,
                key.queue,
                key.partition,
            )
        self._metrics.spool_replay_duplicates += duplicates
        self._changed.set()
        return True

    async def _drop_deleted(
        self, by_key: dict[PartitionKey, list[tuple[FileRead, SpoolRecord]]]
    ) -> dict[PartitionKey, list[tuple[FileRead, SpoolRecord]]]:
        """Take out of ``by_key`` the records spooled before their queue was deleted; return
        them, per partition."""
        if self._deleted_queues is None:
            return {}
        deleted = await self._deleted_queues(sorted({key.queue for key in by_key}))
        dropped: dict[PartitionKey, list[tuple[FileRead, SpoolRecord]]] = {}
        for key in list(by_key):
            when = deleted.get(key.queue)
            if when is None:
                continue
            gone = [(f, r) for f, r in by_key[key] if r.stamp < when]
            if not gone:
                continue
            dropped[key] = gone
            kept = [(f, r) for f, r in by_key[key] if r.stamp >= when]
            if kept:
                by_key[key] = kept
            else:
                del by_key[key]
        return dropped


def merge(records: list[SpoolRecord]) -> PushRequest:
    """One replay request holding ``records`` (all of one partition) in order."""
    frames = concat(records)
    return PushRequest(
        message_ids=frames.message_ids,
        transaction_ids=frames.transaction_ids,
        payloads=frames.payloads,
        producer_subs=frames.producer_subs,
        trace_ids=frames.trace_ids,
        replay=True,
    )

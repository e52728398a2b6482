"""The spool replay loop: run by the supervisor, it stores spooled frames once PostgreSQL answers.

A pass runs while the database is up and maintenance mode is off, and only in the one process
holding the directory's replay lock (several processes may share a spool directory; they never
replay at the same time, so never the same file). A pass seals this process's active file,
then takes the spool files oldest first (name order is creation order). It reads each file
from its progress mark, and for every chunk of ``chunk_items`` frames sends each partition's
frames, in file order, to that partition's actor as a replay request: the normal write path,
with the original message ids and transaction ids, so a frame that is already stored (a commit
that succeeded although its answer was lost, or a replay interrupted by a crash) comes back
``duplicate`` and counts as done. Chunks go one after another, so a partition's frames commit
in file order. After a chunk commits, the file's progress mark moves past it; after the last
chunk the file is removed. If a chunk fails (the database went away again), the pass stops and
the file stays, to be resumed from its mark.

Files still being written by another process (their writer holds the exclusive lock) are
skipped: the writer's older files come first by name, so skipping its newest file never puts
its frames out of order. Damaged ranges of a file (a torn tail after a crash, a bad checksum)
are skipped and logged; every trustworthy record around them is replayed.

The loop also keeps the :class:`SpoolIndex` true to the directory: on start and on every tick it
drops files that are gone and counts files it has not seen, so "partition P still has spooled
frames" stays correct when another process replayed them or left them behind.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from queen.actors.messages import PushRequest
from queen.broadcast import Signal
from queen.frames import concat
from queen.health import DatabaseHealth
from queen.maintenance import MaintenanceSwitch
from queen.metrics import Metrics
from queen.model import PartitionKey, Status
from queen.spool import files
from queen.spool.format import Skipped, SpoolRecord, read_records
from queen.spool.index import SpoolIndex
from queen.spool.writer import SpoolWriter

log = logging.getLogger("queen.spool")

Submit = Callable[[PartitionKey, PushRequest], Awaitable[None]]


class _FileOutcome(enum.Enum):
    DONE = "done"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"


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
        changed: Signal,
        metrics: Metrics,
        chunk_items: int,
        tick_s: float,
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
        self.last_rate = 0.0  # frames per second of the last pass that replayed anything

    def may_replay(self) -> bool:
        return self._health.up and not self._maintenance.enabled

    async def run(
        self, *, task_status: trio.TaskStatus[Replayer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Replay whenever there is something to replay and it is allowed; until cancelled."""
        await self.refresh()
        task_status.started(self)
        while True:
            progressed = False
            if self.may_replay() and self._index.file_count:
                progressed = await self.replay_pass()
            if not progressed:
                with trio.move_on_after(self._tick_s):
                    await self._changed.wait()
            await self.refresh()

    async def refresh(self) -> None:
        """Make the index match the directory (files gone, files not yet counted)."""
        on_disk = await trio.to_thread.run_sync(files.list_spool_files, self._dir)
        present = set(on_disk)
        active = self._writer.active_name
        dropped = False
        for name in self._index.files():
            if name not in present and name != active:
                self._index.drop(name)
                dropped = True
        unseen = [n for n in on_disk if not self._index.knows(n) and n != active]
        if unseen:
            counted = await trio.to_thread.run_sync(self._count_files, unseen)
            for name, counts in counted.items():
                if self._index.knows(name):
                    continue
                self._index.track(name, created=files.created_at(name))
                for key, frames in counts.items():
                    self._index.add(name, key, frames)
        if dropped:
            self._changed.fire()

    def _count_files(self, names: list[str]) -> dict[str, Counter[PartitionKey]]:
        counted: dict[str, Counter[PartitionKey]] = {}
        for name in names:
            with files.readable_file(self._dir / name) as fd:
                if fd is None:
                    continue  # still being written by its process, or already gone
                data = files.read_all(fd)
            counts: Counter[PartitionKey] = Counter()
            for item in read_records(data, files.read_progress(self._dir, name)):
                if not isinstance(item, Skipped):
                    counts[item[2].key] += len(item[2])
            counted[name] = counts
        return counted

    async def replay_pass(self) -> bool:
        """One pass over the directory; True if at least one file was fully replayed."""
        with files.replay_lock(self._dir) as ours:
            if not ours:
                return False
            await self._writer.seal()
            started = time.monotonic()
            replayed_before = self._metrics.spool_replayed_items
            progressed = False
            for name in await trio.to_thread.run_sync(files.list_spool_files, self._dir):
                if not self.may_replay():
                    break
                outcome = await self._replay_file(name)
                if outcome is _FileOutcome.DONE:
                    progressed = True
                elif outcome is _FileOutcome.INTERRUPTED:
                    break
            frames = self._metrics.spool_replayed_items - replayed_before
            if frames:
                self.last_rate = frames / max(time.monotonic() - started, 1e-6)
                log.info(
                    "spool replay: %d frames in this pass (%.0f/s), %d still spooled",
                    frames,
                    self.last_rate,
                    self._index.total,
                )
            return progressed

    async def _replay_file(self, name: str) -> _FileOutcome:
        path = self._dir / name
        with files.readable_file(path) as fd:
            if fd is None:
                return _FileOutcome.SKIPPED
            data = await trio.to_thread.run_sync(files.read_all, fd)
            start = files.read_progress(self._dir, name)
            records = list(read_records(data, start))
            if not self._index.knows(name):
                self._index.track(name, created=files.created_at(name))
                for item in records:
                    if not isinstance(item, Skipped):
                        self._index.add(name, item[2].key, len(item[2]))
            chunk: list[SpoolRecord] = []
            frames = 0
            for item in records:
                if isinstance(item, Skipped):
                    self._metrics.spool_damaged_ranges += 1
                    log.error(
                        "spool file %s: skipped %d damaged bytes at offset %d (%s)",
                        name,
                        item.length,
                        item.offset,
                        item.reason,
                    )
                    continue
                _, end, record = item
                chunk.append(record)
                frames += len(record)
                if frames >= self._chunk_items:
                    if not await self._replay_chunk(name, chunk):
                        return _FileOutcome.INTERRUPTED
                    await trio.to_thread.run_sync(files.write_progress, self._dir, name, end)
                    log.debug("spool file %s: committed up to offset %d", name, end)
                    chunk, frames = [], 0
            if chunk and not await self._replay_chunk(name, chunk):
                return _FileOutcome.INTERRUPTED
        await trio.to_thread.run_sync(files.remove, self._dir, name)
        self._index.drop(name)
        self._changed.fire()
        return _FileOutcome.DONE

    async def _replay_chunk(self, name: str, records: list[SpoolRecord]) -> bool:
        by_key: dict[PartitionKey, list[SpoolRecord]] = {}
        for record in records:
            by_key.setdefault(record.key, []).append(record)
        sent: list[tuple[PartitionKey, PushRequest]] = []
        for key, group in by_key.items():
            request = merge(group)
            await self._submit(key, request)
            sent.append((key, request))
        ok = True
        duplicates = 0
        for _, request in sent:
            outcome = await request.reply.wait()
            if outcome.status is not Status.QUEUED:
                ok = False
            duplicates += len(outcome.duplicates)
        if not ok:
            return False
        for key, request in sent:
            self._index.settle(name, key, len(request))
            self._metrics.spool_replayed_items += len(request)
        self._metrics.spool_replay_duplicates += duplicates
        self._changed.fire()
        return True


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

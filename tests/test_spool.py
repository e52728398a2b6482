"""The spool inside one broker: outages, holds, group commit, write failures, damaged files,
two brokers on one spool directory. The database is the in-memory store; files are real."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from queen import open_broker
from queen.broker import Broker
from queen.http import render
from queen.http.app import create_app
from queen.model import PartitionKey
from queen.settings import Settings
from queen.spool import files
from queen.spool.format import SpoolRecord, encode, read_records
from queen.spool.writer import SpoolWriter, _ActiveFile
from tests.fakes import MemoryStore


def fast(tmp_path: Path, **changes: Any) -> Settings:
    return Settings(
        database_url="memory://",
        file_buffer_dir=str(tmp_path / "spool"),
        spool_file_max_age_s=0.05,
        spool_replay_tick_s=0.05,
        spool_hold_s=5.0,
        db_probe_min_s=0.01,
        db_probe_max_s=0.05,
    ).with_changes(**changes)


def item(partition: str, tx: str) -> dict[str, Any]:
    return {"queue": "q", "partition": partition, "payload": {"tx": tx}, "transactionId": tx}


def stored(store: MemoryStore, partition: str) -> list[str]:
    return [t for s in store.segments_of(partition) for t in s.transaction_ids]


async def until(condition: Callable[[], bool], broker: Broker, timeout_s: float = 10) -> None:
    """Wait, without polling, until ``condition`` holds (re-checked on every broker change)."""
    with trio.fail_after(timeout_s):
        while not condition():
            with trio.move_on_after(0.05):
                await broker.ops.changed.wait()


def drained(*brokers: Broker) -> Callable[[], bool]:
    def check() -> bool:
        return all(
            b.spool is not None and b.spool.index.total == 0 and b.spool.index.file_count == 0
            for b in brokers
        )

    return check


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def broker(store: MemoryStore, tmp_path: Path) -> AsyncIterator[Broker]:
    async with open_broker(fast(tmp_path), store=store) as b:
        yield b


async def test_outage_spools_then_replays_in_push_order(broker: Broker, store: MemoryStore) -> None:
    assert [r.status for r in await broker.push([item("p", "a")])] == ["queued"]
    store.unavailable = True
    during = await broker.push([item("p", "b"), item("p", "c"), item("other", "x")])
    assert [r.status for r in during] == ["buffered"] * 3
    assert not broker.db_health.up
    later = await broker.push([item("p", "d")])  # known down: straight to the spool
    assert later[0].status == "buffered"
    assert broker.spool is not None and broker.spool.index.total == 4
    assert stored(store, "p") == ["a"]

    store.unavailable = False
    await until(drained(broker), broker)
    after = await broker.push([item("p", "e")])
    assert after[0].status == "queued"
    assert stored(store, "p") == ["a", "b", "c", "d", "e"]
    assert stored(store, "other") == ["x"]
    # replay kept the ids the producers were given
    ids = {
        t: m
        for s in store.segments_of("p")
        for t, m in zip(s.transaction_ids, s.message_ids, strict=True)
    }
    assert ids["b"] == during[0].message_id and ids["d"] == later[0].message_id
    assert broker.metrics.spool_replayed_items == 4
    assert files.list_spool_files(Path(broker.settings.file_buffer_dir)) == []


async def test_push_holds_until_its_partition_is_replayed(
    tmp_path: Path, store: MemoryStore
) -> None:
    async with open_broker(fast(tmp_path, spool_hold_s=60), store=store) as broker:
        store.unavailable = True
        assert (await broker.push([item("p", "b")]))[0].status == "buffered"
        directory = Path(broker.settings.file_buffer_dir)
        lock = os.open(directory / files.REPLAY_LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the replay cannot start yet
            store.unavailable = False
            await until(lambda: broker.db_health.up, broker)
            async with trio.open_nursery() as nursery:
                results: list[Any] = []

                async def push() -> None:
                    results.extend(await broker.push([item("p", "d")]))

                nursery.start_soon(push)
                key = PartitionKey("q", "p")

                def decided() -> bool:
                    actor = broker.supervisor.actor(key)
                    held = actor is not None and actor.holding
                    return held or store.writes_started > 0 or bool(results)

                await until(decided, broker)
                # The database is up and the partition's actor is free, yet the push is held
                # behind the backlog: not written, not spooled.
                assert results == []
                assert store.writes_started == 0
                assert broker.spool is not None and broker.spool.index.total == 1
                fcntl.flock(lock, fcntl.LOCK_UN)
        finally:
            os.close(lock)
        assert results[0].status == "queued"
        assert stored(store, "p") == ["b", "d"]


async def test_hold_gives_up_and_spools_when_replay_cannot_run(
    tmp_path: Path, store: MemoryStore
) -> None:
    async with open_broker(fast(tmp_path, spool_hold_s=0.2), store=store) as broker:
        store.unavailable = True
        assert (await broker.push([item("p", "b")]))[0].status == "buffered"
        directory = Path(broker.settings.file_buffer_dir)
        lock = os.open(directory / files.REPLAY_LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # "another process" is replaying this directory
            store.unavailable = False
            await until(lambda: broker.db_health.up, broker)
            held = await broker.push([item("p", "d")])
            assert held[0].status == "buffered"  # waited 0.2 s, then kept its place on disk
            free = await broker.push([item("elsewhere", "z")])
            assert free[0].status == "queued"  # partitions without backlog are not held
        finally:
            os.close(lock)
        await until(drained(broker), broker)
    assert stored(store, "p") == ["b", "d"]


async def test_maintenance_spools_everything_and_replays_when_off(
    broker: Broker, store: MemoryStore
) -> None:
    await broker.set_maintenance(True)
    results = await broker.push([item(f"p{i % 3}", f"t{i}") for i in range(9)])
    assert {r.status for r in results} == {"buffered"}
    assert store.segments == []
    with trio.move_on_after(0.3):  # the replay loop must stay idle meanwhile
        await until(lambda: bool(store.segments), broker)
    assert store.segments == []
    await broker.set_maintenance(False)
    await until(drained(broker), broker)
    for p in range(3):
        assert stored(store, f"p{p}") == [f"t{i}" for i in range(9) if i % 3 == p]


async def test_frames_of_a_replay_write_that_fails_stay_spooled_until_a_pass_stores_them(
    broker: Broker, store: MemoryStore
) -> None:
    """A replay chunk whose write is not stored (the database refused it) stops the pass and
    settles nothing: its frames stay in the spool, and a later pass stores them. Settling a
    chunk whose writes failed would remove the file and lose them."""
    await broker.set_maintenance(True)
    results = await broker.push([item("p", "a"), item("p", "b"), item("other", "x")])
    assert {r.status for r in results} == {"buffered"}
    store.failing = {"p"}
    failures = broker.metrics.push_transaction_failures
    await broker.set_maintenance(False)
    await until(lambda: broker.metrics.push_transaction_failures > failures, broker)
    store.failing = set()  # (the failed attempt's outcome is decided: its write was refused)
    await until(drained(broker), broker)
    assert stored(store, "p") == ["a", "b"]
    assert stored(store, "other") == ["x"]
    assert broker.metrics.spool_replayed_items == 3


@pytest.mark.parametrize(("group_max", "grouped"), [(4096, True), (1, False)])
async def test_fsyncs_are_grouped(
    tmp_path: Path, store: MemoryStore, group_max: int, grouped: bool
) -> None:
    settings = fast(tmp_path, spool_group_max_records=group_max)
    async with open_broker(settings, store=store) as broker:
        assert broker.spool is not None
        writer = broker.spool.writer
        synced: list[tuple[int, int]] = []  # (file, its size) at every fsync the writer made

        def fsync(fd: int) -> None:
            synced.append((os.fstat(fd).st_ino, os.fstat(fd).st_size))
            os.fsync(fd)

        writer.fsync = fsync
        await broker.set_maintenance(True)
        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(broker.push, [item(f"p{i}", f"t{i}")])
        assert broker.metrics.spool_appended_items == 40
        for file in {ino for ino, _ in synced}:  # each fsync came after more data was written
            sizes = [size for ino, size in synced if ino == file]
            assert sizes == sorted(set(sizes)) and sizes[0] > 0
        if grouped:
            assert 1 <= len(synced) < 40
        else:
            assert len(synced) == 40


def lone_writer(directory: Path, **options: Any) -> SpoolWriter:
    """A spool writer outside any broker: groups of 16 records, no size or age limit."""
    from queen.metrics import Metrics
    from queen.spool.index import SpoolIndex

    return SpoolWriter(
        directory,
        SpoolIndex(),
        Metrics(),
        group_max_records=16,
        file_max_bytes=1 << 20,
        file_max_age_s=3600,
        **options,
    )


def one_record(i: int) -> SpoolRecord:
    mid = f"0190c7e0-0000-7000-8000-{i:012x}"
    return SpoolRecord(PartitionKey("q", "p"), 0, [mid], [f"t{i}"], [b"1"])


async def test_an_append_is_answered_only_after_the_fsync_of_its_record_returned(
    tmp_path: Path,
) -> None:
    """The writer's fsync is held in its worker thread: the append stays unanswered until it
    returns, and the record was written before it ran. Without the fsync, or with the answer
    given before it, this fails."""
    entered = trio.Event()  # set from the writer's worker thread, inside the fsync
    release = threading.Event()
    size_at_fsync: list[int] = []
    token = trio.lowlevel.current_trio_token()

    def held_fsync(fd: int) -> None:
        size_at_fsync.append(os.fstat(fd).st_size)
        trio.from_thread.run_sync(entered.set, trio_token=token)
        release.wait()
        os.fsync(fd)

    writer = lone_writer(tmp_path, fsync=held_fsync)
    answered = trio.Event()
    first_step = trio.Event()  # whichever comes first: the fsync or the answer

    async def append() -> None:
        await writer.append([one_record(1)])
        answered.set()
        first_step.set()

    async def note_fsync() -> None:
        await entered.wait()
        first_step.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        nursery.start_soon(note_fsync)
        nursery.start_soon(append)
        try:
            await first_step.wait()
            assert entered.is_set(), "the append was answered and no fsync ran"
            await trio.testing.wait_all_tasks_blocked()
            assert not answered.is_set(), "the append was answered while its fsync ran"
        finally:
            release.set()  # never leave the worker thread waiting (it cannot be cancelled)
        await answered.wait()
        assert writer.active_name is not None
        written = (tmp_path / writer.active_name).stat().st_size
        nursery.cancel_scope.cancel()
    assert size_at_fsync == [written]  # one fsync, after the record was written
    assert written > 0


async def test_unwritable_spool_answers_failed_not_buffered(
    broker: Broker, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def open_full_disk(self: SpoolWriter) -> _ActiveFile:
        fd = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
        return _ActiveFile(name=files.new_name(), fd=fd, opened=0.0)

    await broker.set_maintenance(True)
    with monkeypatch.context() as patch:
        patch.setattr(SpoolWriter, "_open", open_full_disk)
        results = await broker.push([item("p", "a"), item("p", "b")])
    assert [r.status for r in results] == ["failed", "failed"]
    assert broker.metrics.spool_write_failures >= 1
    assert broker.spool is not None and broker.spool.index.total == 0
    assert broker.spool.state().healthy is False
    again = await broker.push([item("p", "c")])  # a new file on a good disk
    assert again[0].status == "buffered"
    await broker.set_maintenance(False)
    await until(drained(broker), broker)
    assert stored(store, "p") == ["c"]


async def test_spool_reports_healthy_again_once_the_disk_takes_writes_without_a_push(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def open_full_disk(self: SpoolWriter) -> _ActiveFile:
        fd = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
        return _ActiveFile(name=files.new_name(), fd=fd, opened=0.0)

    assert broker.spool is not None
    await broker.set_maintenance(True)
    with monkeypatch.context() as patch:
        patch.setattr(SpoolWriter, "_open", open_full_disk)
        results = await broker.push([item("p", "a")])
        assert [r.status for r in results] == ["failed"]
        assert broker.spool.state().healthy is False

        probes: list[Path] = []

        def refuse(directory: Path) -> None:
            probes.append(directory)
            raise OSError(28, "No space left on device")

        patch.setattr(files, "probe_writable", refuse)
        await until(lambda: len(probes) >= 2, broker)  # two probes, both refused
        assert broker.spool.state().healthy is False
    spooled_before = broker.metrics.spool_appended_items
    await until(lambda: broker.spool is not None and broker.spool.writer.healthy, broker)
    assert broker.spool.state().healthy is True
    assert broker.metrics.spool_appended_items == spooled_before  # no push was needed


def test_failed_progress_write_leaves_no_tmp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    name = files.new_name()
    files.write_progress(tmp_path, name, files.Progress(10))
    monkeypatch.setattr(files.os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        files.write_progress(tmp_path, name, files.Progress(20, frozenset({30})))
    assert sorted(p.name for p in tmp_path.iterdir()) == [name.replace(".log", ".done")]
    assert files.read_progress(tmp_path, name) == files.Progress(10)


def test_scanner_counts_another_process_file_while_it_grows_and_drops_it_when_gone(
    tmp_path: Path,
) -> None:
    from queen.spool.index import SpoolIndex
    from queen.spool.scan import SpoolScanner

    def record(partition: str, i: int) -> bytes:
        mid = f"0190c7e0-0000-7000-8000-{i:012x}"
        return encode(SpoolRecord(PartitionKey("q", partition), 0, [mid], [f"t{i}"], [b"1"]))

    index = SpoolIndex()
    scanner = SpoolScanner(tmp_path, index, set())
    name = files.new_name()
    fd = os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process is writing it
        os.write(fd, record("a", 1))
        scanner.sync()
        assert index.pending(PartitionKey("q", "a")) == 1
        second = record("b", 2)
        os.write(fd, record("a", 3) + second[:10])  # the second record is half written
        scanner.sync()
        assert index.pending(PartitionKey("q", "a")) == 2
        assert index.pending(PartitionKey("q", "b")) == 0
        os.write(fd, second[10:])
        scanner.sync()
        assert index.pending(PartitionKey("q", "b")) == 1
    finally:
        os.close(fd)
    (tmp_path / name).unlink()
    scanner.sync(check_seals=True)
    assert index.total == 0 and index.file_count == 0


def test_a_route_looks_at_the_spool_again_for_pushes_that_arrived_since_its_last_look(
    tmp_path: Path,
) -> None:
    """Pushes that arrived before a look began share it (the partitions of one request are
    routed in one pass); a push that arrived later is routed on a new look, which sees what
    another process spooled before it arrived."""
    import time
    from types import SimpleNamespace

    from trio_util import RepeatedEvent

    from queen.primitives import Route
    from queen.spool.index import SpoolIndex
    from queen.spool.router import SpoolRouter
    from queen.spool.scan import SpoolScanner

    index = SpoolIndex()
    scanner = SpoolScanner(tmp_path, index, set())
    looks = 0
    sync = scanner.sync

    def counted(**kwargs: Any) -> bool:
        nonlocal looks
        looks += 1
        return sync(**kwargs)

    scanner.sync = counted  # type: ignore[method-assign]
    router = SpoolRouter(
        index,
        SimpleNamespace(directory=tmp_path, own_names=set()),  # type: ignore[arg-type]
        SimpleNamespace(up=True),  # type: ignore[arg-type]
        SimpleNamespace(enabled=False),  # type: ignore[arg-type]
        RepeatedEvent(),
        scanner=scanner,
    )
    a, b = PartitionKey("q", "a"), PartitionKey("q", "b")
    arrived = time.monotonic()
    assert router.route(a, arrived) is Route.DATABASE
    assert router.route(b, arrived) is Route.DATABASE
    assert looks == 1  # one look for the pushes of one request
    name = files.new_name()  # another process spools a record of "a", then answers buffered
    fd = os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        mid = "0190c7e0-0000-7000-8000-000000000001"
        os.write(fd, encode(SpoolRecord(a, 0, [mid], ["t1"], [b"1"])))
        os.fsync(fd)
        later = time.monotonic()  # a push of "a" that arrives after that answer
        assert router.route(a, later) is Route.HOLD
        assert looks == 2
        assert router.route(a) is Route.HOLD  # arrival unknown: always a new look
        assert looks == 3
    finally:
        os.close(fd)


def test_scanner_counts_again_a_file_its_writer_cut_back_and_wrote_again(tmp_path: Path) -> None:
    from queen.spool.index import SpoolIndex
    from queen.spool.scan import SpoolScanner

    def record(partition: str, i: int, payload: bytes = b"1") -> bytes:
        mid = f"0190c7e0-0000-7000-8000-{i:012x}"
        return encode(SpoolRecord(PartitionKey("q", partition), 0, [mid], [f"t{i}"], [payload]))

    index = SpoolIndex()
    scanner = SpoolScanner(tmp_path, index, set())
    name = files.new_name()
    fd = os.open(tmp_path / name, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        first = record("a", 1)
        os.write(fd, first + record("a", 2))  # the second one's fsync fails...
        scanner.sync()
        assert index.pending(PartitionKey("q", "a")) == 2
        os.ftruncate(fd, len(first))  # ...so its writer cuts it back
        os.write(fd, record("b", 3, b"12345678") + record("b", 4, b"12345678"))
        scanner.sync()
        assert index.pending(PartitionKey("q", "a")) == 1
        assert index.pending(PartitionKey("q", "b")) == 2
    finally:
        os.close(fd)


def test_sweep_removes_leftovers_but_not_a_file_being_created(tmp_path: Path) -> None:
    name = files.new_name()
    (tmp_path / name.replace(".log", ".tmp")).write_text("12")
    (tmp_path / files.creating_name(files.new_name())).write_bytes(b"")  # its process died
    held = tmp_path / files.creating_name(name)
    fd = os.open(held, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a writer about to rename it
        removed = files.sweep(tmp_path)
    finally:
        os.close(fd)
    assert len(removed) == 2
    assert [p.name for p in tmp_path.iterdir()] == [held.name]


async def test_a_file_swept_before_its_writer_locked_it_is_created_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's replay sweeps the new file in the instant between its creation and
    its lock (it looks like one whose writer died): the append still lands, in a file of
    its own, and is answered (a writer that did not check after locking would fail its
    rename, and the push would be answered ``failed``)."""
    from queen.spool import writer as writer_module

    real_flock = fcntl.flock
    swept: list[str] = []

    def flock_after_a_sweep(fd: int, operation: int) -> None:
        if not swept and operation == fcntl.LOCK_EX:  # the sweep's own locks are shared
            swept.extend(files.sweep(tmp_path))  # the other process, just before our lock
        real_flock(fd, operation)

    monkeypatch.setattr(writer_module.fcntl, "flock", flock_after_a_sweep)
    writer = lone_writer(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        with trio.fail_after(10):
            await writer.append([one_record(1)])
        active = writer.active_name
        nursery.cancel_scope.cancel()
    assert len(swept) == 1 and swept[0].endswith(files.CREATING_SUFFIX)
    assert active is not None and files.creating_name(active) != swept[0]
    assert os.listdir(tmp_path) == [active]
    read = list(read_records((tmp_path / active).read_bytes()))
    assert [r[2].transaction_ids for r in read if isinstance(r, tuple)] == [["t1"]]
    assert len(read) == 1
    assert writer.healthy


async def test_damaged_file_replays_every_complete_record(
    tmp_path: Path, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    records = [
        SpoolRecord(
            PartitionKey("q", "p"),
            0,
            [f"0190c7e0-0000-7000-8000-00000000000{i}"],
            [f"t{i}"],
            [b'{"i": %d}' % i],
        )
        for i in range(4)
    ]
    whole = b"".join(encode(r) for r in records[:3])
    torn = encode(records[3])[:-3]
    (directory / files.new_name()).write_bytes(whole + torn)
    caplog.set_level(logging.ERROR, logger="queen.spool")
    async with open_broker(fast(tmp_path), store=store) as broker:
        await until(drained(broker), broker)
        assert broker.metrics.spool_damaged_ranges == 1
    assert stored(store, "p") == ["t0", "t1", "t2"]
    assert any("unreadable bytes" in r.getMessage() for r in caplog.records)
    assert not list(directory.glob("spool-*"))
    assert [p.read_bytes() for p in (directory / "quarantine").glob("*.bin")] == [torn]


async def test_two_brokers_sharing_a_spool_directory_replay_each_file_once(
    tmp_path: Path, store: MemoryStore
) -> None:
    settings = fast(tmp_path)
    async with open_broker(settings, store=store) as a, open_broker(settings, store=store) as b:
        await a.set_maintenance(True)
        await b.set_maintenance(True)
        for i in range(30):
            await (a if i % 2 else b).push([item(f"p{i % 3}", f"t{i}")])
        await a.set_maintenance(False)
        await b.set_maintenance(False)
        await until(drained(a, b), a)
        replayed = a.metrics.spool_replayed_items + b.metrics.spool_replayed_items
        assert replayed == 30
        assert a.metrics.spool_replay_duplicates + b.metrics.spool_replay_duplicates == 0
    assert sorted(t for p in range(3) for t in stored(store, f"p{p}")) == sorted(
        f"t{i}" for i in range(30)
    )


async def test_brokers_sharing_a_spool_directory_replay_a_partition_in_answer_order(
    tmp_path: Path, store: MemoryStore
) -> None:
    settings = fast(tmp_path, spool_file_max_age_s=60)
    async with open_broker(settings, store=store) as a, open_broker(settings, store=store) as b:
        await a.set_maintenance(True)
        await b.set_maintenance(True)
        await b.push([item("other", "x")])  # b's file is the older one
        for i in range(20):
            results = await (a if i % 2 == 0 else b).push([item("p", f"t{i:02d}")])
            assert results[0].status == "buffered"
        await a.set_maintenance(False)
        await b.set_maintenance(False)
        await until(drained(a, b), a)
    assert stored(store, "p") == [f"t{i:02d}" for i in range(20)]
    assert stored(store, "other") == ["x"]


async def test_spool_directory_that_cannot_be_created_names_the_variable(tmp_path: Path) -> None:
    from queen.spool import SpoolError

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    settings = fast(tmp_path, file_buffer_dir=str(blocker / "buffers"))
    with pytest.raises(SpoolError, match="FILE_BUFFER_DIR"):
        async with open_broker(settings, store=MemoryStore()):
            pass


async def test_a_spool_directory_removed_under_the_broker_is_made_again_for_the_next_outage(
    tmp_path: Path, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    directory.chmod(0o750)
    synced: list[Path] = []  # directories whose entries were made durable
    fsync_directory = files.fsync_directory

    def noting_fsync(path: Path) -> None:
        synced.append(Path(path))
        fsync_directory(path)

    monkeypatch.setattr(files, "fsync_directory", noting_fsync)
    async with open_broker(fast(tmp_path), store=store) as broker:
        assert (await broker.push([item("p", "a")]))[0].status == "queued"
        shutil.rmtree(directory)  # an operator, or a cleaner of temporary files
        store.unavailable = True
        during = await broker.push([item("p", "b"), item("p", "c")])
        assert [r.status for r in during] == ["buffered", "buffered"]
        assert stat.S_IMODE(directory.stat().st_mode) == 0o750  # made again as it was
        assert files.list_spool_files(directory) != []
        # its entry in its parent made durable before the spool file's entry in it
        assert synced.index(tmp_path) < synced.index(directory)
        store.unavailable = False
        await until(drained(broker), broker)
        assert not any(broker.ops.loops.errors().values())  # the replay loop never failed
        health = render.health(await broker.ops.health())
    assert stored(store, "p") == ["a", "b", "c"]
    assert health["spool"]["healthy"] is True and health["spool"]["problem"] is None
    assert files.list_spool_files(directory) == []


async def test_a_replay_pass_stops_once_its_directory_is_made_again_and_another_takes_the_lock(
    tmp_path: Path, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The spool directory is removed and made again during a pass: its ``replay.lock`` is a
    new file, and another process locks it. The pass stops: going on with the frames it read
    before would replay while the other process replays."""
    caplog.set_level(logging.WARNING, logger="queen.spool")
    settings = fast(tmp_path, spool_replay_chunk_items=1)  # a chunk per push
    async with open_broker(settings, store=store) as broker:
        directory = Path(broker.settings.file_buffer_dir)
        await broker.set_maintenance(True)
        for tx in ("a", "b", "c"):
            assert (await broker.push([item("p", tx)]))[0].status == "buffered"
        gate = store.gate = trio.Event()
        await broker.set_maintenance(False)
        await until(lambda: store.writes_started == 1, broker)  # the first chunk waits
        shutil.rmtree(directory)
        os.mkdir(directory)
        other = os.open(directory / files.REPLAY_LOCK, os.O_RDWR | os.O_CREAT)
        try:
            assert files.try_lock(other)  # the other process's replay lock
            store.gate = None
            gate.set()

            def lost() -> bool:
                return any("no longer the file" in r.getMessage() for r in caplog.records)

            await until(lambda: store.writes_started > 1 or lost(), broker)
            assert stored(store, "p") == ["a"]  # nothing more while the other holds the lock
            assert store.writes_started == 1
        finally:
            os.close(other)


def test_the_replay_lock_is_the_file_its_name_leads_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory is removed and made again between the opening of ``replay.lock`` and
    its locking, and another process locks the new file: the old file's lock is not the
    directory's lock."""
    directory = tmp_path / "spool"
    directory.mkdir()
    try_lock = files.try_lock
    other: list[int] = []

    def replaced_first(fd: int, *, shared: bool = False) -> bool:
        if not other:
            shutil.rmtree(directory)
            directory.mkdir()
            other.append(os.open(directory / files.REPLAY_LOCK, os.O_RDWR | os.O_CREAT))
            assert try_lock(other[0])
        return try_lock(fd, shared=shared)

    monkeypatch.setattr(files, "try_lock", replaced_first)
    try:
        with files.replay_lock(directory) as lock:
            assert not lock  # the other process holds the directory's lock
    finally:
        os.close(other[0])
    with files.replay_lock(directory) as lock:  # once it lets it go
        assert lock and lock.held()


async def test_a_spool_file_removed_while_being_written_is_not_answered_buffered(
    tmp_path: Path, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The directory goes with the file this process is still writing: a record appended to
    the removed file would be answered ``buffered`` and never replayed."""
    async with open_broker(fast(tmp_path, spool_file_max_age_s=3600), store=store) as broker:
        await broker.set_maintenance(True)
        assert (await broker.push([item("p", "a")]))[0].status == "buffered"
        assert broker.spool is not None and broker.spool.writer.active_name is not None
        shutil.rmtree(tmp_path / "spool")
        assert (await broker.push([item("p", "b")]))[0].status == "buffered"
        assert len(files.list_spool_files(tmp_path / "spool")) == 1
        await broker.set_maintenance(False)
        await until(drained(broker), broker)
    assert stored(store, "p") == ["b"]  # "a" went with the directory
    assert any(
        "answered buffered from it before (1) went with it" in r.message for r in caplog.records
    )


async def test_health_reports_the_spool_unhealthy_while_its_directory_cannot_be_made(
    tmp_path: Path, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    parent = tmp_path / "parent"
    directory = parent / "spool"
    async with open_broker(fast(tmp_path, file_buffer_dir=str(directory)), store=store) as broker:
        http = create_app(broker).test_client()
        assert broker.spool is not None
        writer = broker.spool.writer
        shutil.rmtree(parent)
        parent.write_text("a regular file where the spool's parent was\n")  # mkdir: ENOTDIR
        await until(lambda: not writer.healthy, broker)  # no push needed to notice
        spool = (await (await http.get("/health")).get_json())["spool"]
        assert spool["healthy"] is False
        assert spool["problem"] == (
            f"spool directory {directory} is missing and cannot be made: Not a directory"
        )
        store.unavailable = True
        assert (await broker.push([item("p", "a")]))[0].status == "failed"
        parent.unlink()
        await until(lambda: writer.healthy, broker)  # made again by the writer's own probe
        spool = (await (await http.get("/health")).get_json())["spool"]
        assert spool["healthy"] is True and spool["problem"] is None
        assert directory.is_dir()
        assert (await broker.push([item("p", "b")]))[0].status == "buffered"
        store.unavailable = False
        await until(drained(broker), broker)
        assert not any(broker.ops.loops.errors().values())
    assert stored(store, "p") == ["b"]
    # no directory is no spool file to count, not an error to log at every look
    assert not [r.message for r in caplog.records if "could not be read" in r.message]

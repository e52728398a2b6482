"""Supervised background loops (with fake loops and Trio's mock clock), the database probe's
bounded answer, and the pool's deadline on a call stuck in a worker thread."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from trio_util import RepeatedEvent

from queen import open_broker
from queen.encryption import QueueEncryption
from queen.errors import StoreUnavailable
from queen.health import DatabaseHealth
from queen.http import render
from queen.http.app import create_app
from queen.maintenance import MaintenanceSwitch
from queen.metrics import LocalFigures, Metrics
from queen.retention import RetentionLoop
from queen.settings import Settings
from queen.storage.listener import PushListener
from queen.storage.pool import ConnectionPool
from queen.storage.retention import PassOutcome, PgRetentionStore
from queen.supervision import Loops, LoopStatus, report_failure


class FlakyLoop:
    """Fails ``failures`` times (the first time before reporting ready), then runs."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.starts: list[float] = []
        self.running = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        if len(self.starts) == 1:
            raise OSError(28, "No space left on device")
        task_status.started()
        if len(self.starts) <= self.failures:
            raise OSError(24, "Too many open files")
        self.running.set()
        await trio.sleep_forever()


async def test_a_failing_loop_is_restarted_with_back_off_and_reported(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    loops = Loops(retry_min_s=0.1, retry_max_s=0.4, recover_s=5.0)
    loop = FlakyLoop(failures=5)
    caplog.set_level(logging.WARNING, "queen.supervisor")
    async with trio.open_nursery() as nursery:
        await nursery.start(loops.run, "replay", loop.run)  # ready although it failed at once
        await loop.running.wait()
        pauses = [round(b - a, 3) for a, b in zip(loop.starts, loop.starts[1:], strict=False)]
        assert pauses == [0.1, 0.2, 0.4, 0.4, 0.4]  # doubling, capped
        state = loops.statuses()["replay"]
        assert state.state == "failing" and state.errors == 5
        assert state.last_error == "OSError: [Errno 24] Too many open files"
        assert state.failing_since is not None
        assert loops.failing() == ["replay"] and loops.errors() == {"replay": 5.0}
        await trio.sleep(5)
        assert loops.statuses()["replay"].state == "ok"
        assert loops.failing() == []
        nursery.cancel_scope.cancel()
    with_traceback = [r for r in caplog.records if r.exc_info]
    assert len(with_traceback) == 1, "the traceback is logged once per streak"
    assert len(caplog.records) == 5


async def test_a_new_streak_starts_from_the_shortest_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    failures = 0

    async def sometimes(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal failures
        task_status.started()
        await trio.sleep(10 if failures == 2 else 0)  # the third run lasts past recover_s
        failures += 1
        raise RuntimeError(f"failure {failures}")

    loops = Loops(retry_min_s=1.0, retry_max_s=8.0, recover_s=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(loops.run, "retention", sometimes)
        await trio.sleep(1 + 2 + 10 + 0.5)  # two failures, then a long run that fails
        state = loops.states["retention"]
        assert state.errors == 3 and state.streak == 1
        nursery.cancel_scope.cancel()


async def test_a_loop_that_returns_is_done_not_restarted() -> None:
    loops = Loops(retry_min_s=0.01)
    runs = 0

    async def nothing_to_do(
        *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        nonlocal runs
        runs += 1
        task_status.started()

    async with trio.open_nursery() as nursery:
        await nursery.start(loops.run, "encryption-refresh", nothing_to_do)
    assert runs == 1
    assert loops.statuses()["encryption-refresh"] == LoopStatus("done", 0)
    assert loops.failing() == []


async def test_cancellation_is_never_caught() -> None:
    loops = Loops()
    cancelled = trio.Event()

    async def forever(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    with trio.move_on_after(0.05) as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(loops.run, "listener", forever)
    assert scope.cancelled_caught and cancelled.is_set()
    assert loops.states["listener"].errors == 0


def test_metrics_render_labelled_families() -> None:
    text = LocalFigures(Metrics()).exposition(
        {"database_up": 1.0},
        {
            "background_errors": ("loop", {"spool-replay": 3.0}),
            "background_loop_failing": ("loop", {"spool-replay": 1.0}),
        },
    )
    assert 'queen_background_errors_total{loop="spool-replay"} 3.0' in text
    assert "# TYPE queen_background_loop_failing gauge" in text
    assert 'queen_background_loop_failing{loop="spool-replay"} 1.0' in text


async def test_health_check_answers_from_the_flag_when_the_probe_hangs() -> None:
    release = trio.Event()
    pings = 0

    async def hanging_ping() -> None:
        nonlocal pings
        pings += 1
        await release.wait()

    health = DatabaseHealth(
        hanging_ping, probe_min_s=0.01, probe_max_s=60, probe_timeout_s=60, changed=RepeatedEvent()
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(health.run)
        with trio.fail_after(1):
            answers = [await health.check(0.05) for _ in range(3)]
        assert answers == [True, True, True]
        assert pings == 1, "checks join the probe in flight"
        release.set()
        nursery.cancel_scope.cancel()


async def test_a_probe_without_answer_marks_the_database_down() -> None:
    async def hanging_ping() -> None:
        await trio.sleep_forever()

    health = DatabaseHealth(
        hanging_ping,
        probe_min_s=0.01,
        probe_max_s=60,
        probe_timeout_s=0.05,
        changed=RepeatedEvent(),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(health.run)
        with trio.fail_after(5):
            while await health.check(1.0):
                pass
        assert not health.up
        nursery.cancel_scope.cancel()


async def test_a_call_past_its_deadline_drops_its_connection(pg_url: str) -> None:
    """A statement the server holds past the deadline (a lock wait stands in for a hung
    server): the call raises StoreUnavailable at the deadline, its worker thread is woken (the
    socket is shut down) while the server still holds the statement, and the next call gets a
    new connection instead of the stuck one."""
    pool = ConnectionPool(
        pg_url, size=2, connect_timeout_s=3, statement_timeout_ms=60_000, call_timeout_s=0.5
    )
    holder_ready = threading.Event()
    release = threading.Event()

    def hold_lock() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(424242)")
            holder_ready.set()
            release.wait(30)

    waiter_done = threading.Event()

    def waiter(conn: psycopg.Connection[Any]) -> None:
        try:
            conn.execute("SELECT pg_advisory_lock(424242)")
        finally:
            waiter_done.set()

    def backend(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, hold_lock)
            await trio.to_thread.run_sync(holder_ready.wait)
            first = await pool.run(backend)
            with trio.fail_after(10), pytest.raises(StoreUnavailable, match="did not answer"):
                await pool.run(waiter)  # takes the idle connection of the first call
            woken = await trio.to_thread.run_sync(waiter_done.wait, 10)
            assert woken and not release.is_set(), "the stuck thread was not woken"
            second = await pool.run(backend)
            release.set()
        assert second != first, "the stuck connection was used again"
    finally:
        release.set()
        await pool.aclose()


def test_accept_errors_are_logged_once_per_period() -> None:
    from queen.serving.accept import RepeatThrottle

    now = [0.0]
    throttle = RepeatThrottle(period_s=10, clock=lambda: now[0])

    def record() -> logging.LogRecord:
        exc = OSError(24, "Too many open files")
        return logging.LogRecord(
            "queen.http.accept",
            logging.ERROR,
            __file__,
            1,
            "accept returned %s",
            ("EMFILE",),
            (OSError, exc, None),
        )

    kept = []
    for _ in range(30):  # 0.1 s apart, as Trio retries
        r = record()
        if throttle.filter(r):
            kept.append(r)
        now[0] += 0.1
    now[0] = 10.0
    r = record()
    assert throttle.filter(r)
    kept.append(r)
    assert len(kept) == 2
    assert kept[0].exc_info is not None, "the first one keeps its traceback"
    assert kept[1].getMessage() == "accept returned EMFILE (29 more since the last report)"


async def test_a_failing_loop_of_a_running_broker_is_reported_and_recovers(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real broker whose retention pass raises something no loop expects (OSError): the
    routes go on, /health says degraded (200) with the loop's error, /metrics counts it, and
    once the cause is gone the loop is ok again."""

    async def disk_full(self: PgRetentionStore, *args: object) -> PassOutcome:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PgRetentionStore, "run_pass", disk_full)
    settings = settings.with_changes(retention_interval_s=0.01, loop_retry_max_s=0.05)
    async with open_broker(settings) as broker:
        client = create_app(broker).test_client()
        loops = broker.ops.loops
        with trio.fail_after(10):
            while True:
                if loops.states["retention"].errors >= 2:
                    break
                await trio.sleep(0.01)
        resp = await client.get("/health")
        body = await resp.get_json()
        assert resp.status_code == 200 and body["status"] == "degraded"
        retention = body["loops"]["retention"]
        assert retention["state"] == "failing"
        assert retention["lastError"] == "OSError: [Errno 28] No space left on device"
        assert body["loops"]["spool-replay"]["state"] == "ok"
        text = (await (await client.get("/metrics")).get_data()).decode()
        assert 'queen_background_errors_total{loop="retention"}' in text
        assert 'queen_background_loop_failing{loop="retention"} 1.0' in text
        pushed = await broker.push([{"queue": "still-served", "payload": 1}])
        assert pushed[0].status == "queued"

        monkeypatch.undo()
        with trio.fail_after(10):
            while True:
                if not loops.failing():
                    break
                await trio.sleep(0.01)
        body = await (await client.get("/health")).get_json()
        assert body["status"] == "healthy" and body["loops"]["retention"]["state"] == "ok"


# --- loops that handle their own failures ----------------------------------------------------


class Outage:
    """The database the fakes below share: while ``down`` every call fails as PostgreSQL's
    would when unreachable."""

    def __init__(self) -> None:
        self.down = True

    def answer(self) -> None:
        if self.down:
            raise StoreUnavailable("connection refused")

    async def run_pass(self, batch_limit: int, max_batches: int) -> PassOutcome:
        self.answer()
        return PassOutcome(ran=True)

    async def get_state(self, key: str) -> Any:
        self.answer()
        return None

    async def set_state(self, key: str, value: Any) -> None:
        self.answer()

    async def encrypted_queues(self) -> set[str]:
        self.answer()
        return set()


async def test_loops_that_log_and_go_on_in_an_outage_are_shown_failing_until_it_ends(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention and the switches' refreshes catch the database's errors themselves (nothing
    reaches supervision): each failed turn still counts, the loop is failing from its first
    one, and ok again after a turn that goes well."""
    outage = Outage()
    retention = RetentionLoop(
        outage,  # type: ignore[arg-type]
        Metrics(),
        interval_s=10,
        batch_limit=100,
        max_batches=1,
    )
    maintenance = MaintenanceSwitch(outage, refresh_s=1, changed=RepeatedEvent())
    encryption = QueueEncryption(None, outage.encrypted_queues, refresh_s=1)
    loops = Loops(retry_min_s=0.1, retry_max_s=30, recover_s=5)
    caplog.set_level(logging.INFO, "queen.retention")
    async with trio.open_nursery() as nursery:
        await nursery.start(loops.host)
        await loops.start("retention", retention.run)
        await loops.start("maintenance-switch", maintenance.run)
        await loops.start("encryption-refresh", encryption.run)
        await trio.sleep(35.5)  # three retention passes, 35 refreshes, all failed
        assert "retention pass failed: connection refused" in caplog.text

        statuses = loops.statuses()
        assert sorted(loops.failing()) == sorted(statuses)
        failing = statuses["retention"]
        assert (failing.state, failing.errors) == ("failing", 3)
        assert failing.last_error == "StoreUnavailable: connection refused"
        assert failing.failing_since is not None
        assert statuses["maintenance-switch"].errors == 35
        assert render.loop_status(failing) == {
            "state": "failing",
            "errors": 3,
            "failingSince": failing.failing_since.isoformat(),
            "lastError": "StoreUnavailable: connection refused",
        }

        outage.down = False
        await trio.sleep(10)  # one pass, ten refreshes, all well
        assert loops.failing() == []
        statuses = loops.statuses()
        assert {s.state for s in statuses.values()} == {"ok"}
        assert statuses["retention"].errors == 3  # what happened stays counted
        assert "retention pass done again after 3 failed passes" in caplog.text

        outage.down = True  # a new outage: a new streak, since its own first failure
        await trio.sleep(10)
        again = loops.statuses()["retention"]
        assert again.state == "failing" and again.errors == 4
        assert again.failing_since is not None and again.failing_since > failing.failing_since
        nursery.cancel_scope.cancel()


async def test_a_pass_run_outside_a_loop_reports_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    loops = Loops()
    retention = RetentionLoop(
        Outage(),  # type: ignore[arg-type]
        Metrics(),
        interval_s=10,
        batch_limit=100,
        max_batches=1,
    )
    with pytest.raises(StoreUnavailable):
        await retention.run_pass()  # an operator's pass: the error is the caller's
    report_failure("not in a loop")
    assert loops.states == {}


async def test_the_push_listener_is_failing_while_it_cannot_listen(pg_url: str) -> None:
    down = True
    attempts = 0
    fourth_attempt, reconnected = trio.Event(), trio.Event()

    def connect() -> psycopg.Connection[Any]:  # in a worker thread
        nonlocal attempts
        attempts += 1
        if attempts == 4:  # the third failure is reported before the next attempt
            trio.from_thread.run_sync(fourth_attempt.set)
        if down:
            raise psycopg.OperationalError("connection refused")
        return psycopg.connect(pg_url, autocommit=True)

    listener = PushListener(
        connect, lambda names: None, on_reconnect=reconnected.set, retry_s=0.02, remind_s=60
    )
    loops = Loops()
    async with trio.open_nursery() as nursery:
        await nursery.start(loops.host)
        await loops.start("push-listener", listener.run)
        with trio.fail_after(10):
            await fourth_attempt.wait()
        status = loops.statuses()["push-listener"]
        assert status.state == "failing" and status.errors >= 3
        assert status.last_error == "cannot connect: connection refused"
        down = False
        with trio.fail_after(10):
            await reconnected.wait()
        assert loops.statuses()["push-listener"].state == "ok"
        nursery.cancel_scope.cancel()


async def test_a_loop_failing_in_another_worker_makes_this_workers_health_say_so(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --workers N any worker answers /health and the dashboard: a loop another worker
    publishes as failing is shown failing (and the status degraded) by this one too."""
    async with open_broker(settings) as broker:
        client = create_app(broker).test_client()
        body = await (await client.get("/health")).get_json()
        assert body["status"] == "healthy"
        assert body["loops"]["retention"]["state"] == "ok"
        elsewhere = {"retention"}
        monkeypatch.setattr(broker.ops.figures, "failing_elsewhere", lambda: elsewhere)
        body = await (await client.get("/health")).get_json()
        assert body["status"] == "degraded"
        assert body["loops"]["retention"]["state"] == "failing"
        assert "another worker" in body["loops"]["retention"]["lastError"]
        assert body["loops"]["spool-replay"]["state"] == "ok"
        standing = await broker.admin.system.standing()
        assert standing.loops["retention"].state == "failing"
        elsewhere.clear()  # that worker's loop recovered
        body = await (await client.get("/health")).get_json()
        assert body["status"] == "healthy"

"""The push listener's log during an outage: the change of state, then rarely (virtual time)."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

from queen.errors import StoreError
from queen.storage.listener import PushListener


class _Lost(Exception):
    pass


async def test_an_outage_is_logged_once_then_reminded_rarely_then_its_end(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="queen.consume")
    attempts = 0
    back = trio.Event()
    reconnects = 0

    def reconnected() -> None:
        nonlocal reconnects
        reconnects += 1

    listener = PushListener(
        lambda: None,  # type: ignore[arg-type,return-value]
        lambda names: None,
        on_reconnect=reconnected,
        retry_s=1.0,
        remind_s=60.0,
    )

    async def open_bounded() -> psycopg.Connection[Any]:
        nonlocal attempts
        attempts += 1
        if attempts <= 150:  # about 150 s of outage, one attempt a second
            raise StoreError("PostgreSQL unavailable: connection refused")
        back.set()
        raise _Lost  # ends the test's listener once it has logged its way back

    async def listen_forever(conn: Any) -> None:
        await trio.sleep_forever()

    listener._open_bounded = open_bounded  # type: ignore[method-assign]
    listener._listen = listen_forever  # type: ignore[method-assign]
    with pytest.raises(_Lost):
        await listener.run()
    assert back.is_set()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 3, [r.getMessage() for r in warnings]  # the change, 60 s, 120 s
    assert "cannot connect" in warnings[0].getMessage()
    assert "still down after 60 s (61 attempts)" in warnings[1].getMessage()
    assert "still down after 120 s (121 attempts)" in warnings[2].getMessage()
    assert reconnects == 0


async def test_the_end_of_an_outage_is_logged_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="queen.consume")
    attempts = 0

    class Conn:
        def close(self) -> None:
            pass

    async def open_bounded() -> Any:
        nonlocal attempts
        attempts += 1
        if attempts <= 5:
            raise StoreError("refused")
        return Conn()

    listening = trio.Event()
    connected_while_listening: list[bool] = []

    async def listen(conn: Any) -> None:
        connected_while_listening.append(listener.connected)
        listening.set()
        await trio.sleep_forever()

    listener = PushListener(lambda: None, lambda names: None)  # type: ignore[arg-type,return-value]
    listener._open_bounded = open_bounded  # type: ignore[method-assign]
    listener._listen = listen  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(listener.run)
        await listening.wait()
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("cannot connect" in x for x in lines) == 1
    assert [x for x in lines if "connected again" in x] == [
        "push listener connected again after 5.0 s (5 failed attempts)"
    ]
    assert connected_while_listening == [True]

"""A request's messages from the server to the app (:mod:`queen.serving.inbox`): queued for
``receive()`` in order, or handed to a listener at once in the server's task; nothing for an
app that has ended; and the connection guard's rules kept when the app listens (a chunked
body the byte budget refuses reads as the client leaving, a disconnect after the answer is
not the app's)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from queen.budget import ByteBudget
from queen.serving.guard import ConnectionGuard
from queen.serving.inbox import LISTEN, RequestInbox, request_listener

BODY = {"type": "http.request", "body": b"ab", "more_body": True}
END = {"type": "http.request", "body": b"", "more_body": False}
GONE = {"type": "http.disconnect"}


async def _receive_into(inbox: RequestInbox, got: list[Any]) -> None:
    got.append(await inbox.receive())


async def test_receive_gives_what_was_queued_in_order_then_waits_for_more() -> None:
    inbox = RequestInbox()
    await inbox.put(BODY)  # type: ignore[arg-type]
    await inbox.put(END)  # type: ignore[arg-type]
    assert await inbox.receive() == BODY
    assert await inbox.receive() == END
    got: list[Any] = []

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_receive_into, inbox, got)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        await inbox.put(GONE)  # type: ignore[arg-type]
    assert got == [GONE]


async def test_a_listener_gets_the_queued_messages_then_each_one_as_it_is_put() -> None:
    inbox = RequestInbox()
    await inbox.put(BODY)  # type: ignore[arg-type]
    heard: list[Any] = []
    inbox.listen(heard.append)
    assert heard == [BODY]
    with trio.testing.assert_no_checkpoints():  # handed over in the putting task
        await inbox.put(END)  # type: ignore[arg-type]
    assert heard == [BODY, END]
    inbox.listen(None)
    await inbox.put(GONE)  # type: ignore[arg-type]
    assert heard == [BODY, END]
    assert await inbox.receive() == GONE


async def test_after_the_app_ended_nothing_is_kept_or_handed_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    inbox = RequestInbox()
    heard: list[Any] = []
    inbox.listen(heard.append)
    await inbox.put(BODY)  # type: ignore[arg-type]
    inbox.close()
    await inbox.put(GONE)  # type: ignore[arg-type]
    assert heard == [BODY]
    with trio.move_on_after(1) as waited:
        await inbox.receive()
    assert waited.cancelled_caught


async def test_one_reader_at_a_time_and_a_cancelled_wait_leaves_the_inbox_usable() -> None:
    inbox = RequestInbox()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(inbox.receive)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await inbox.receive()
        nursery.cancel_scope.cancel()
    await inbox.put(END)  # type: ignore[arg-type]
    assert await inbox.receive() == END


def _scope(headers: list[tuple[bytes, bytes]], inbox: RequestInbox) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": headers,
        "extensions": {LISTEN: {"listen": inbox.listen}},
    }


async def test_the_guard_passes_a_chunked_body_the_budget_refuses_as_a_disconnect() -> None:
    inbox = RequestInbox()
    heard: list[Any] = []
    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        listen = request_listener(scope)
        assert listen is not None and listen != inbox.listen  # the guard's, around it
        listen(heard.append)
        await inbox.put({"type": "http.request", "body": b"x" * 100, "more_body": True})
        await inbox.put({"type": "http.request", "body": b"y" * 100, "more_body": True})
        listen(None)

    async def send(message: Any) -> None:
        sent.append(message)

    guard = ConnectionGuard(app, ByteBudget(150), max_body_bytes=1000)
    scope = _scope([(b"transfer-encoding", b"chunked")], inbox)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(guard, scope, inbox.receive, send)
            await trio.testing.wait_all_tasks_blocked()
            await inbox.put(GONE)  # type: ignore[arg-type]  # the client, told 503, leaves
    assert heard == [{"type": "http.request", "body": b"x" * 100, "more_body": True}, GONE]
    assert sent[0]["status"] == 503  # the guard answered for the refused body


async def test_the_guard_keeps_a_disconnect_after_the_answer_from_a_listening_app() -> None:
    inbox = RequestInbox()
    heard: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        listen = request_listener(scope)
        assert listen is not None
        listen(heard.append)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})
        await inbox.put(GONE)  # type: ignore[arg-type]  # the server, closing after the answer
        listen(None)

    async def send(message: Any) -> None:
        pass

    guard = ConnectionGuard(app, ByteBudget(1000), max_body_bytes=1000)
    await inbox.put(END)  # type: ignore[arg-type]
    with trio.fail_after(5):
        await guard(_scope([(b"content-length", b"0")], inbox), inbox.receive, send)
    assert heard == [END]


async def test_a_reader_woken_for_a_message_a_listener_took_waits_for_the_next() -> None:
    inbox = RequestInbox()
    got: list[Any] = []
    heard: list[Any] = []

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_receive_into, inbox, got)
        await trio.testing.wait_all_tasks_blocked()
        await inbox.put(BODY)  # type: ignore[arg-type]  # wakes the reader...
        inbox.listen(heard.append)  # ...but a listener takes it before the reader runs
        inbox.listen(None)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and heard == [BODY]
        await inbox.put(END)  # type: ignore[arg-type]
    assert got == [END]

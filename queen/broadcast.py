"""A broadcast "something changed" signal: many waiters, woken together, no payload."""

from __future__ import annotations

import trio


class Signal:
    """``await signal.wait()`` returns after the next :meth:`fire`.

    Waiters re-check whatever state they care about after waking; a fire with no waiter is
    simply lost, so check the state before waiting (Trio runs both steps without a checkpoint
    in between when nothing awaits between them).
    """

    def __init__(self) -> None:
        self._event = trio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()

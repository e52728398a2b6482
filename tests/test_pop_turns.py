"""Turns among the waiting pops of one kind (queen.consume.turns), on Trio alone, and how a
woken pop comes to ask for one (queen.consume.looks)."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from queen.consume.looks import PopKey, SharedLooks
from queen.consume.turns import Turn, Turns
from queen.consume.wakeups import Wakeups

KEY = ("q", None)


async def _ask_all(turns: Turns, arrivals: list[int], order: list[int]) -> None:
    """Each arrival asks for a turn (in the order given, all within one tick), and ends it
    once given; ``order`` notes the arrivals in the order their turns came."""
    granted: list[Turn] = []

    async def ask(arrival: int) -> None:
        turn = await turns.take(KEY, arrival)
        order.append(arrival)
        granted.append(turn)

    async with trio.open_nursery() as nursery:
        for arrival in arrivals:
            nursery.start_soon(ask, arrival)
        await trio.testing.wait_all_tasks_blocked()
        while granted:
            granted.pop(0).end()
            await trio.testing.wait_all_tasks_blocked()


async def test_pops_asking_together_are_given_turns_oldest_first() -> None:
    turns = Turns(at_most=4)
    order: list[int] = []
    await _ask_all(turns, [5, 3, 9, 1, 7], order)
    assert order == [1, 3, 5, 7, 9]


async def test_a_turn_held_keeps_a_newer_pop_waiting_and_passes_to_the_oldest_asking() -> None:
    turns = Turns(at_most=4)
    first = await turns.take(KEY, 10)
    order: list[int] = []

    async def ask(arrival: int) -> None:
        turn = await turns.take(KEY, arrival)
        order.append(arrival)
        turn.end()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, 30)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ask, 20)  # asked later, arrived earlier
        await trio.testing.wait_all_tasks_blocked()
        assert order == []  # one turn at a time to begin with
        first.end()
    assert order == [20, 30]


async def test_looks_that_deliver_let_more_pops_look_at_once_and_empty_ones_fewer() -> None:
    turns = Turns(at_most=3)
    assert turns.limit(KEY) == 1
    turns.waiting(KEY, 1)  # (keeps the line while no turn is held)
    for expected in (2, 3, 3):
        (await turns.take(KEY, 1)).end(more=True)
        assert turns.limit(KEY) == expected
    held = [await turns.take(KEY, n) for n in (1, 2, 3)]  # three at once now
    for turn, expected in zip(held, (2, 1, 1), strict=True):
        turn.end(more=False)
        assert turns.limit(KEY) == expected
    (await turns.take(KEY, 1)).end()  # a turn that made no look changes nothing
    assert turns.limit(KEY) == 1


async def test_a_pop_that_gives_up_asking_takes_no_turn_from_the_others() -> None:
    turns = Turns(at_most=1)
    first = await turns.take(KEY, 1)
    got: list[int] = []

    async def ask(arrival: int, scope: trio.CancelScope) -> None:
        with scope:
            await turns.take(KEY, arrival)
            got.append(arrival)

    gives_up, stays = trio.CancelScope(), trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, 2, gives_up)
        nursery.start_soon(ask, 3, stays)
        await trio.testing.wait_all_tasks_blocked()
        gives_up.cancel()  # its client left
        await trio.testing.wait_all_tasks_blocked()
        first.end()
    assert got == [3]


@pytest.mark.parametrize("more", [True, False, None])
async def test_a_kind_with_nobody_waiting_or_asking_is_forgotten(more: bool | None) -> None:
    turns = Turns(at_most=2)
    turns.waiting(KEY, 1)
    turn = await turns.take(KEY, 1)
    assert turns.others_wait(KEY)
    turn.end(more)
    turn.end(more)  # (a second end changes nothing)
    turns.waiting(KEY, -1)
    assert not turns.others_wait(KEY)
    assert turns.limit(KEY) == 1  # the next crowd begins one at a time


async def test_a_woken_pop_waits_for_one_like_look_only_then_asks_for_its_turn() -> None:
    """Where like looks follow each other without a gap (each delivering), a pop that waited
    for each in turn would never ask for a turn of its own."""
    looks = SharedLooks(Wakeups())
    key = PopKey("q", None, "", "", "__QUEUE_MODE__")
    mine = looks.start(key)
    looks.finish(mine, found_nothing=True, holds_until=math.inf)
    first = looks.start(key)  # another pop's, in flight
    done = trio.Event()

    async def woken() -> None:
        await looks.wait_for_like(key, mine.number)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(woken)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()  # its answer may do for this pop too
        looks.finish(first, found_nothing=False)  # it delivered
        looks.start(key)  # and the next pop's look begins at once
        await trio.testing.wait_all_tasks_blocked()
        assert done.is_set()

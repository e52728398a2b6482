"""The byte budget of request bodies and pop answers, as a counter."""

from __future__ import annotations

from queen.budget import ByteBudget


def test_charges_fit_under_the_limit_and_release_makes_room_again() -> None:
    budget = ByteBudget(100)
    assert budget.try_charge(60)
    assert budget.try_charge(40)
    assert not budget.try_charge(1)
    assert budget.in_use_bytes == 100 and budget.refused == 1
    budget.release(60)
    assert budget.try_charge(50)
    assert budget.in_use_bytes == 90


def test_a_refused_charge_takes_nothing() -> None:
    budget = ByteBudget(100)
    assert budget.try_charge(30)
    assert not budget.try_charge(71)
    assert budget.in_use_bytes == 30
    assert budget.try_charge(70)


def test_an_empty_body_is_always_free() -> None:
    budget = ByteBudget(10)
    assert budget.try_charge(10)
    assert budget.try_charge(0)
    assert budget.in_use_bytes == 10

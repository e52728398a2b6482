"""The broker's errors have one base: every exception class the ``queen`` package defines
derives from :class:`queen.errors.QueenError`, and keeps the built-in base its callers catch."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import queen
from queen.consume.errors import InvalidRequest, NotFound
from queen.errors import QueenError, StoreError, StoreUnavailable
from queen.model import InvalidPush

# The operator commands are a client of the broker: their one error is click's, which click
# itself prints and turns into an exit status.
NOT_THE_BROKERS = {"queen.ctl.client.CtlError"}


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(queen.__path__, "queen."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_error_of_the_broker_derives_from_one_base() -> None:
    found = _defined_exceptions()
    assert "queen.consume.errors.InvalidRequest" in found  # the walk sees the package
    outside = sorted(
        name
        for name, cls in found.items()
        if name not in NOT_THE_BROKERS and not issubclass(cls, QueenError)
    )
    assert outside == []


def test_the_errors_keep_the_bases_their_callers_catch() -> None:
    assert issubclass(InvalidRequest, ValueError) and issubclass(InvalidPush, ValueError)
    assert issubclass(NotFound, LookupError)
    assert issubclass(StoreUnavailable, StoreError)

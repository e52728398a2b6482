"""Queen on Trio: a partitioned, durable message broker backed by PostgreSQL.

Embedding::

    import queen, trio

    async def main() -> None:
        async with queen.open_broker(queen.Settings(database_url="postgresql://...")) as broker:
            print(await broker.push([{"queue": "orders", "payload": {"id": 1}}]))

    trio.run(main)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queen.broker import Broker
    from queen.gctune import tune_gc
    from queen.lifecycle import open_broker
    from queen.model import InvalidPush, PartitionKey, Status
    from queen.push import BrokerClosed, PartitionsBusy, PushedItem
    from queen.settings import Settings

# Imported on first use, so that a program importing one module of the package (the ``queen``
# command's operator subcommands, say) does not load the whole broker.
_EXPORTS = {
    "Broker": "queen.broker",
    "BrokerClosed": "queen.push",
    "InvalidPush": "queen.model",
    "PartitionKey": "queen.model",
    "PartitionsBusy": "queen.push",
    "PushedItem": "queen.push",
    "Settings": "queen.settings",
    "Status": "queen.model",
    "open_broker": "queen.lifecycle",
    "tune_gc": "queen.gctune",
}

__all__ = [
    "Broker",
    "BrokerClosed",
    "InvalidPush",
    "PartitionKey",
    "PartitionsBusy",
    "PushedItem",
    "Settings",
    "Status",
    "open_broker",
    "tune_gc",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'queen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

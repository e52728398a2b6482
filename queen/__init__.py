"""Queen on Trio: a partitioned, durable message broker backed by PostgreSQL.

Embedding::

    import queen, trio

    async def main() -> None:
        async with queen.open_broker(queen.Settings(database_url="postgresql://...")) as broker:
            print(await broker.push([{"queue": "orders", "payload": {"id": 1}}]))

    trio.run(main)
"""

from queen.broker import Broker
from queen.gctune import tune_gc
from queen.lifecycle import open_broker
from queen.model import InvalidPush, PartitionKey, Status
from queen.push import BrokerClosed, PartitionsBusy, PushedItem
from queen.settings import Settings

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

"""The push service (:mod:`queen.push.service`): pushes into the partition actors, typed
answers, and the hold through which every other writer of a partition takes its turn."""

from queen.push.service import (
    BrokerClosed,
    PartitionsBusy,
    PushAnswer,
    PushedItem,
    PushService,
)

__all__ = ["BrokerClosed", "PartitionsBusy", "PushAnswer", "PushService", "PushedItem"]

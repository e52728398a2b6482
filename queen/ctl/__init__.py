"""The ``queen`` operator commands: a client of a running broker's HTTP API.

Nothing here imports the broker: every command is HTTP calls through
:class:`~queen.ctl.client.BrokerClient` (``httpx``), with arguments parsed by ``click`` and
tables drawn by ``tabulate``. ``queen serve`` itself stays in :mod:`queen.cli`. queenctl's
words work beside ours (:data:`ALIASES`, and each group's own), with its flags, environment,
output formats and exit statuses (``docs/command.md`` has the table).
"""

from queen.ctl.client import CtlError, Exit
from queen.ctl.consume import ack, lease, pop, tail
from queen.ctl.inspect import lag, metrics, ping, status, traces, version
from queen.ctl.messages import groups, messages
from queen.ctl.operate import dlq, maintenance
from queen.ctl.push import push
from queen.ctl.queues import namespaces, partitions, queues, replay, seek, tasks

COMMANDS = (
    status,
    ping,
    version,
    queues,
    partitions,
    push,
    pop,
    tail,
    ack,
    lease,
    lag,
    groups,
    seek,
    replay,
    dlq,
    messages,
    maintenance,
    traces,
    metrics,
    namespaces,
    tasks,
)

ALIASES = {
    "queue": "queues",
    "q": "queues",
    "partition": "partitions",
    "p": "partitions",
    "cg": "groups",
    "group": "groups",
    "consumer-group": "groups",
    "consumer-groups": "groups",
    "msg": "messages",
    "msgs": "messages",
    "maint": "maintenance",
    "namespace": "namespaces",
    "ns": "namespaces",
    "task": "tasks",
}

__all__ = ["ALIASES", "COMMANDS", "CtlError", "Exit"]

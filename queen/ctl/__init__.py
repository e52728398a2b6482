"""The ``queen`` operator commands: a client of a running broker's HTTP API.

Nothing here imports the broker: every command is HTTP calls through
:class:`~queen.ctl.client.BrokerClient` (``httpx``), with arguments parsed by ``click`` and
tables drawn by ``tabulate``. ``queen serve`` itself stays in :mod:`queen.cli`.
"""

from queen.ctl.client import CtlError, Exit
from queen.ctl.consume import ack, pop, tail
from queen.ctl.inspect import lag, metrics, status, traces
from queen.ctl.operate import dlq, maintenance
from queen.ctl.push import push
from queen.ctl.queues import queues, seek

COMMANDS = (status, queues, push, pop, tail, ack, lag, dlq, seek, maintenance, traces, metrics)

__all__ = ["COMMANDS", "CtlError", "Exit"]

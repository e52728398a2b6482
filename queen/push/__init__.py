"""The push path: a push body's frames go, per partition, through that partition's actor to the
batcher and one database transaction.

- :mod:`queen.push.supervisor`: the registry of partition actors (spawn, idle stop, crashes).
- :mod:`queen.push.partition`: one actor per active partition; one write in flight.
- :mod:`queen.push.resolver`: partition ids for new partitions, in batches.
- :mod:`queen.push.batcher`: ready segments of many partitions in one transaction.
- :mod:`queen.push.messages`, :mod:`~queen.push.policy`: what actors are asked, pure rules.

Validation happens before (:mod:`queen.intake`); the spool (:mod:`queen.spool`) takes over
when the database is away.
"""

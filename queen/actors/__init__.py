"""The actors of the push path: a push body's frames go, per partition, through that
partition's actor to the batcher and one database transaction.

- :mod:`queen.actors.supervisor`: the registry of partition actors (spawn, idle stop, crashes).
- :mod:`queen.actors.partition`: one actor per active partition; one write in flight.
- :mod:`queen.actors.resolver`: partition ids for new partitions, in batches.
- :mod:`queen.actors.batcher`: ready segments of many partitions in one transaction.
- :mod:`queen.actors.messages`, :mod:`~queen.actors.policy`: what actors are asked, pure rules.

Validation happens before (:mod:`queen.intake`); the spool (:mod:`queen.spool`) takes over
when the database is away.
"""

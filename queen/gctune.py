"""Python's cyclic collector tuned for a long-running broker process."""

from __future__ import annotations

import gc


def tune_gc(gen0_threshold: int = 10_000) -> None:
    """Make Python's cyclic collector cheap for a long-running broker.

    Every partition actor is a task with its inbox and frames: with thousands of actors, the
    collector's default rhythm (a young collection every 700 allocations, full ones often
    enough) spent a third of the process's time and added 0.5 s pauses (measured with 10,000
    partitions). Objects alive once the server is ready are frozen out of collection and young
    collections come every ``gen0_threshold`` allocations (default 10,000: each request leaves
    a few objects only a collection frees, and with 50,000 the young collections came every
    few seconds, paused 25-30 ms and added 10 ms to the p99 of 1-item pushes; 10,000 gave
    the same throughput and a p99 of 53 ms instead of 62). Middle collections come every 5
    young ones: they then carry fewer survivors each (with 20, the first one after 10,000
    actors had started paused the process for 0.45 s). With 10,000 actors busy, young pauses
    measured 14 ms at most and middle ones 27 ms. Full collections are rare (every 2,000
    young ones). Applied by ``queen serve``; an application embedding the broker keeps its
    own policy unless it calls this (``queen.tune_gc()``) once its set-up is done: with 32
    tasks pushing 10-item bodies in process, Python's default rhythm cost about a quarter of
    the broker's CPU per message.
    """
    if gen0_threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0_threshold, 5, 400)

"""The garbage collector's settings for the daemon's own process, once it serves.

A daemon's cache is made of long-lived objects by design (entries, keys, routes, each kept
for the address and route lifetimes). CPython's default thresholds (700, 10, 10) collect the
whole heap after about 70,000 net allocations whenever it grew by a quarter, so a job start,
whose burst adds a cache entry per peer, pays several traversals of a heap that only grows:
at 40,000 nodes (``python -m tests.bench.scale --one-process 40000 2 acm``) three full
collections took 0.12-0.18 s of a daemon's ~2 s, and the collector 0.23-0.27 s in all.

So once the daemon serves (``settle``), what start-up made (modules, options, providers,
sockets: it lives as long as the process) is moved out of every later collection
(``gc.freeze``), and the youngest generation is collected every ``YOUNG_THRESHOLD`` net
allocations: a full collection then comes after about a million (and the quarter's growth),
which a job start's burst does not reach. Cyclic garbage is still collected, later.

Only the ``ibacm`` process does this (``core.cli``); a library user's or a test's process
keeps its own settings.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Net allocations of container objects between two collections of the youngest generation
(CPython's default: 700). The older generations keep their default ratios (10, 10)."""


def settle() -> None:
    """Freeze what start-up made and collect less often from now on (see the module)."""
    gc.collect()  # what start-up left as garbage goes now, not into the frozen set
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)

"""The seven ACM counters of an endpoint, bumped together with the daemon-wide set.

behavior.md §14: most events count both globally (core) and on the endpoint that saw them.
Counters are unbounded Python ints reported modulo 2**64 (C used 32-bit signed ints, defect 15).
"""

from __future__ import annotations

from ibacm.provider.api import Counter, Counters

_RESOLVE = int(Counter.RESOLVE)
_ROUTE_CACHE = int(Counter.ROUTE_CACHE)


class EndpointCounters:
    """An endpoint's counters plus a link to the global ones."""

    __slots__ = ("global_counters", "local")

    def __init__(self, global_counters: Counters) -> None:
        self.global_counters = global_counters
        self.local = Counters()

    def both(self, counter: Counter) -> None:
        """Count an event that the spec counts globally and on the endpoint."""
        self.local.increment(counter)
        self.global_counters.increment(counter)

    def cache_hit(self) -> None:
        """A RESOLVE answered from the cache: RESOLVE on the endpoint (the core counts its
        own), ROUTE_CACHE on both. One call: it runs for every cache hit."""
        local = self.local.values
        local[_RESOLVE] += 1
        local[_ROUTE_CACHE] += 1
        self.global_counters.values[_ROUTE_CACHE] += 1

    def endpoint_only(self, counter: Counter) -> None:
        """Count an event that only the endpoint set sees (the core counts the reply)."""
        self.local.increment(counter)

    def snapshot(self) -> list[int]:
        return self.local.snapshot()

"""What an endpoint counts: the seven ACM counters, bumped together with the daemon-wide set,
and its own statistics beyond them (``EndpointStats``: the admin snapshot's ``stats``).

behavior.md §14: most events count both globally (core) and on the endpoint that saw them.
Counters are unbounded Python ints reported modulo 2**64 (C used 32-bit signed ints, defect 15).
"""

from __future__ import annotations

from ibacm.provider.api import Counter, Counters
from ibacm.provider.route_table import RouteTable
from ibacm.wire.counters import COUNTER_MASK

_RESOLVE = int(Counter.RESOLVE)
_ROUTE_CACHE = int(Counter.ROUTE_CACHE)


class EndpointCounters:
    """An endpoint's counters plus a link to the global ones, and to its route table: the
    cache hits the client loop answers from the table count on the endpoint as RESOLVE and
    ROUTE_CACHE (the table's ``hits``, which the client loop alone writes; the global
    counters of those hits are the client loop's own tally)."""

    __slots__ = ("global_counters", "local", "table")

    def __init__(self, global_counters: Counters, table: RouteTable | None = None) -> None:
        self.global_counters = global_counters
        self.local = Counters()
        self.table = table

    def both(self, counter: Counter) -> None:
        """Count an event that the spec counts globally and on the endpoint."""
        self.local.increment(counter)
        self.global_counters.increment(counter)

    def endpoint_only(self, counter: Counter) -> None:
        """Count an event that only the endpoint set sees (the core counts the reply)."""
        self.local.increment(counter)

    def snapshot(self) -> list[int]:
        """The endpoint's PERF_QUERY: its own counts plus the route table's hits."""
        values = self.local.snapshot()
        table = self.table
        if table is not None:
            hits = table.hits
            values[_RESOLVE] = (values[_RESOLVE] + hits) & COUNTER_MASK
            values[_ROUTE_CACHE] = (values[_ROUTE_CACHE] + hits) & COUNTER_MASK
        return values


_STATS = (
    "announcements",
    "bad_mads",
    "credit_overdrafts",
    "join_attempts",
    "peer_moves",
    "requests_received",
    "responses_dropped",
    "responses_received",
    "responses_sent",
    "send_errors",
    "unmatched_responses",
)


class EndpointStats:
    """Things worth knowing that are not among the seven ACM counters."""

    __slots__ = _STATS

    def __init__(self) -> None:
        self.bad_mads = 0
        self.requests_received = 0
        self.responses_received = 0
        self.unmatched_responses = 0
        self.responses_sent = 0
        self.responses_dropped = 0
        self.send_errors = 0
        self.join_attempts = 0
        self.credit_overdrafts = 0
        """ACM requests sent without a resolve_depth credit (see ``ResolveCredits``)."""
        self.peer_moves = 0
        """Peers seen at a new LID, whose other cached routes were dropped."""
        self.announcements = 0
        """Gratuitous requests sent for our own addresses (see ``endpoint``'s docstring)."""

    def as_dict(self) -> dict[str, int]:
        # The names from the module: a compiled class has no ``__slots__`` to read.
        return {name: getattr(self, name) for name in _STATS}

    def add(self, name: str) -> None:
        """One more of ``name`` (the peer protocol's ``Count``)."""
        setattr(self, name, getattr(self, name) + 1)

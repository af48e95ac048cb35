"""The routes a provider has at hand, as the client loop's thread reads them (cache hits).

Part of the provider API (``Provider.route_table``; re-exported by ``ibacm.provider.api``),
in a module of its own so that it is compiled with the client loop (``ibacm.compiled``):
the loop reads these objects for every cache hit.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any


class Hit:
    """One route a cache hit answers with, as a provider publishes it in a ``RouteTable``.

    Made when its entry becomes ready and never changed after, except ``count``: the client
    loop's thread is its only writer (the provider reads it, for the admin snapshot and its
    eviction's second chance)."""

    __slots__ = ("count", "expiry", "packed")

    def __init__(self, packed: bytes, expiry: float) -> None:
        self.packed = packed
        """The route's 64 PathRecord bytes, as a RESOLVE reply carries them."""
        self.expiry = expiry
        """Trio clock: from then on the route is not answered from here (``resolve`` is)."""
        self.count = 0
        """Requests the client loop answered with it."""


class RouteTable:
    """An endpoint's routes at hand, shared between the provider and the client loop.

    The client loop answers cache hits in its own thread, with no provider code on the way.
    What it reads the provider only ever replaces whole, never changes in place: ``routes``,
    an immutable mapping from the table's key of a destination to its ``Hit``, and ``key``,
    a pure function from a destination (address type, address bytes) to that key (None:
    never answered from the table, e.g. a GID that may be the endpoint's own). The client
    loop's own writes are ``hits`` here and ``Hit.count``, which nobody else writes.
    """

    __slots__ = ("hits", "key", "routes")

    def __init__(
        self, key: Callable[[int, bytes], Hashable | None], routes: Mapping[Any, Hit]
    ) -> None:
        self.key = key
        self.routes = routes
        self.hits = 0
        """RESOLVEs the client loop answered from this table (the endpoint's RESOLVE and
        ROUTE_CACHE counters include them)."""

    def find(self, dest_type: int, dest: bytes, now: float) -> Hit | None:
        """The route to the destination at trio time ``now``, or None. Reads only."""
        key = self.key(dest_type, dest)
        if key is None:
            return None
        hit = self.routes.get(key)
        if hit is None or now >= hit.expiry:
            return None
        return hit

"""What a destination cache publishes for the client loop: its READY entries' routes.

The client loop answers cache hits in its own thread from ``RoutePublication.table``, a
``RouteTable`` whose ``routes`` (an immutable map, replaced whole on every change, never
changed in place) hold each READY entry's ``Hit``: its route packed once when it became READY
and its expiry (the earlier of the two lifetimes). The cache (``DestCache``) calls ``renew``,
``put`` and ``drop`` from each of its transitions, so no change of state, route, lifetime or
membership can leave the table behind; while the endpoint does not serve
(``set_serving(False)``) the table answers nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import immutables

from ibacm.provider.acmp.entry import USED, DestEntry
from ibacm.provider.acmp.keys import CacheKey, table_key
from ibacm.provider.route_table import Hit, RouteTable

_NO_ROUTES: immutables.Map[CacheKey, Hit] = immutables.Map()


class RoutePublication:
    """The route table of one cache, and the Hits of its entries (see the module docstring)."""

    def __init__(self) -> None:
        self.serving = False
        """The endpoint answers resolutions (READY): only then does the table hold routes."""
        self._routes = _NO_ROUTES
        """What ``table.routes`` is (typed here; the table's is any mapping)."""
        self._batch: immutables.MapMutation[CacheKey, Hit] | None = None
        """Changes of a batch (``batch``), published together when it ends."""
        self._batch_depth = 0
        self.table = RouteTable(table_key, _NO_ROUTES)
        """Kept for the cache's lifetime, which is the endpoint's and beyond (a reopened
        endpoint gets its cache back)."""

    def set_serving(self, serving: bool, entries: Iterable[DestEntry]) -> None:
        """The endpoint became ready (the table answers the Hits of ``entries``, all of the
        cache's) or stopped being so (the table answers nothing: ``resolve`` says ENODATA)."""
        if serving == self.serving:
            return
        self.serving = serving
        if not serving:
            self._routes = _NO_ROUTES
        else:
            mutation = _NO_ROUTES.mutate()
            for entry in entries:
                if entry.hit is not None:
                    mutation[entry.key] = entry.hit
            self._routes = mutation.finish()
        if self._batch is not None:
            self._batch = self._routes.mutate()  # a batch open meanwhile goes on from here
        self.table.routes = self._routes

    def batch(self) -> RouteBatch:
        """``with publication.batch():`` the route changes of many entries (a flush, an SM
        change) are made in one mutation of the map and published once, at the end."""
        return RouteBatch(self)

    def begin(self) -> None:
        if self._batch_depth == 0:
            self._batch = self._routes.mutate()
        self._batch_depth += 1

    def end(self) -> None:
        self._batch_depth -= 1
        if self._batch_depth == 0 and self._batch is not None:
            batch, self._batch = self._batch, None
            if self.serving:
                self._routes = batch.finish()
                self.table.routes = self._routes

    def renew(self, entry: DestEntry, packed: bytes | None = None) -> Hit | None:
        """(Re)make the Hit of a READY entry: with ``packed`` (a new route), else the
        current Hit's bytes with the entry's current lifetimes. The new Hit, for ``put``;
        None when nothing changed."""
        old = entry.hit
        if packed is None:
            if old is None:  # pragma: no cover - callers renew READY entries only
                return None
            packed = old.packed
        expiry = math.inf if entry.loopback else min(entry.addr_expiry, entry.route_expiry)
        if old is not None:
            if old.packed is packed and old.expiry == expiry:
                return None
            fold(entry, old)
        hit = entry.hit = Hit(packed, expiry)
        return hit

    def put(self, key: CacheKey, hit: Hit) -> None:
        """Answer ``hit`` for ``key`` from now on (while serving)."""
        if not self.serving:
            return
        batch = self._batch
        if batch is not None:
            batch[key] = hit
        else:
            self._routes = self._routes.set(key, hit)
            self.table.routes = self._routes

    def drop(self, entries: Iterable[DestEntry]) -> None:
        """Take the Hits of entries that left READY or the cache out of the table."""
        mutation = self._batch
        own = mutation is None and self.serving
        for entry in entries:
            hit = entry.hit
            if hit is None:
                continue
            entry.hit = None
            fold(entry, hit)
            if not self.serving:
                continue
            if mutation is None:
                mutation = self._routes.mutate()
            if mutation.get(entry.key) is hit:  # not a newer entry's under the same key
                del mutation[entry.key]
        if own and mutation is not None:
            self._routes = mutation.finish()
            self.table.routes = self._routes


def fold(entry: DestEntry, hit: Hit) -> None:
    """A Hit leaves: its count joins the entry's own. The client loop may still count a
    request or two on it while it goes (racing increments of a Hit no longer in the map are
    lost: admin figures only). A count grown since the bound's last pass counts as a use."""
    count = hit.count
    entry.hits += count
    if entry.seen != count:
        entry.seen = USED
    else:
        entry.seen = 0


class RouteBatch:
    """See ``RoutePublication.batch``."""

    __slots__ = ("publication",)

    def __init__(self, publication: RoutePublication) -> None:
        self.publication = publication

    def __enter__(self) -> None:
        self.publication.begin()

    def __exit__(self, *exc_info: object) -> None:
        self.publication.end()

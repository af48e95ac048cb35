"""The destination cache of one endpoint: its entries and their state machine (behavior.md §9).

Its parts, each in a module of its own: the keys (``keys``: canonical addresses, defect 34),
the entry and what waits on it (``entry``), the deadlines grouped by the second
(``deadlines``), which entries a full cache drops (``eviction``, defect 32), and the route
table published for the client loop (``publication``). ``DestCache`` holds them together:

* every change of an entry's state, route or lifetimes goes through one of its methods (the
  transitions of behavior.md §9.3: ``set_state``, ``make_ready``, ``address_resolved``,
  ``forget``, ``check_lifetimes``, ``expire``), and each keeps the published table equal to
  its READY entries at once, for the hit path and the resolution path alike;
* entries leave through it too (evicted, expired, removed, flushed, replaced by a loopback
  entry), leaving the deadline lists and the table in the same call;
* loopback entries live in a map of their own and are never evicted.

Times are trio clock seconds; ``math.inf`` means "never".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ibacm.provider.acmp.deadlines import ExpirySchedule, deadline
from ibacm.provider.acmp.entry import USED, DestEntry, EntryState
from ibacm.provider.acmp.eviction import evict
from ibacm.provider.acmp.keys import CacheKey
from ibacm.provider.acmp.publication import RouteBatch, RoutePublication

if TYPE_CHECKING:
    from ibacm.provider.route_table import RouteTable
    from ibacm.wire.path_record import AimablePath, PathRecord

Listener = Callable[[DestEntry, bool], None]
"""Told about changes the cache makes by itself: (entry, removed)."""


class DestCache:
    """The entries of one endpoint (see the module docstring) and its route table.

    The destination entry's state machine lives here: every change of an entry's state,
    route or lifetimes goes through a method of the cache (``DestEntry.state`` and ``path``
    are read-only), and each keeps ``table.routes`` equal to what ``Resolver.resolve_address``
    answers at once: the READY entries of the cache, each as the ``Hit`` made when it became
    READY, while the endpoint serves (``set_serving``), else nothing.
    """

    def __init__(self, max_entries: int = 0, listener: Listener | None = None) -> None:
        self.max_entries = max_entries
        """0 = unbounded (as C)."""
        self.listener = listener
        self._loopback: dict[CacheKey, DestEntry] = {}
        self._entries: dict[CacheKey, DestEntry] = {}
        """Learned entries, oldest first (insertion order; a second chance moves to the end)."""
        self._schedule = ExpirySchedule()
        self.evicted = 0
        self.expired = 0
        self._last_addr_deadline: tuple[float, float, float] = (math.nan, math.nan, math.nan)
        """(now, lifetime, deadline) of the last ``set_addr_timeout``."""
        self._publication = RoutePublication()
        self.table: RouteTable = self._publication.table
        """What the client loop answers hits from (``publication``); kept for the cache's
        lifetime, which is the endpoint's and beyond (a reopened endpoint gets its cache
        back)."""

    def __len__(self) -> int:
        return len(self._entries) + len(self._loopback)

    def __iter__(self) -> Iterator[DestEntry]:
        yield from self._loopback.values()
        yield from self._entries.values()

    def learned(self) -> Iterator[DestEntry]:
        """Entries other than loopback entries."""
        return iter(tuple(self._entries.values()))

    # -- lookups --------------------------------------------------------------------------

    def get(self, key: CacheKey) -> DestEntry | None:
        # Learned entries first: the two maps never share a key, and most lookups are peers.
        entry = self._entries.get(key)
        if entry is None:
            return self._loopback.get(key)
        entry.seen = USED
        return entry

    def acquire(self, key: CacheKey) -> DestEntry:
        """The entry for ``key``, created in INIT if missing (may evict an idle one)."""
        entry = self.get(key)
        if entry is None:
            entry = DestEntry(key)
            entries = self._entries
            entries[key] = entry
            limit = self.max_entries
            if limit and len(entries) > limit:
                self._leave(evict(entries, limit, key), evicted=True)
        return entry

    def put_loopback(self, entry: DestEntry, path: PathRecord, now: float) -> None:
        """``entry`` (not in the cache yet) READY with ``path`` for good: one of our own
        addresses (behavior.md §9.4)."""
        entry.loopback = True
        learned = self._entries.pop(entry.key, None)
        if learned is not None:
            self._schedule.unschedule((learned,), self._entries)
            self._publication.drop((learned,))
        self._loopback[entry.key] = entry
        entry._path, entry.group_route = path, None
        entry._state = EntryState.READY
        entry.ready_at = now
        self._publish(entry, path.encode())

    def remove(self, key: CacheKey) -> DestEntry | None:
        entry = self._loopback.pop(key, None)
        if entry is not None:
            self._publication.drop((entry,))
            self._tell(entry, True)
            return entry
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._leave([entry])
        return entry

    def clear_learned(self) -> int:
        """Drop every learned entry nobody waits on; returns how many were dropped."""
        idle = [entry for entry in self._entries.values() if not entry.busy]
        for entry in idle:
            del self._entries[entry.key]
        self._leave(idle)
        return len(idle)

    def _leave(self, gone: list[DestEntry], evicted: bool = False) -> None:
        """Entries taken out of ``_entries`` leave the deadline lists and the table."""
        if evicted:
            self.evicted += len(gone)
        self._schedule.unschedule(gone, self._entries)
        self._publication.drop(gone)
        for entry in gone:
            self._tell(entry, True)

    def scheduled_entries(self) -> int:
        """Slots in the deadline lists (an entry may hold more than one): what the bound
        and the tests check never outgrows the cache."""
        return len(self._schedule)

    def _tell(self, entry: DestEntry, removed: bool) -> None:
        if self.listener is not None:
            self.listener(entry, removed)

    # -- the entry state machine ----------------------------------------------------------

    def set_state(self, entry: DestEntry, state: EntryState) -> None:
        """Any state but READY (``make_ready``); the route, if any, is kept for the record
        (a READY entry sent back to ADDR_RESOLVED re-queries it on its next use)."""
        if state is EntryState.READY:
            raise ValueError("an entry becomes READY through make_ready, with its route")
        entry._state = state
        if entry.hit is not None:
            self._publication.drop((entry,))

    def make_ready(
        self,
        entry: DestEntry,
        now: float,
        addr_lifetime: float,
        route_lifetime: float,
        path: PathRecord | None = None,
        group_route: AimablePath | None = None,
    ) -> None:
        """READY with ``path``, or (route_prot acm) with the group record ``group_route``
        aimed at the peer when asked for (``DestEntry.path``); its lifetimes start at
        ``now``. The route is packed here, once, for the route table."""
        entry._path = path
        entry.group_route = group_route
        entry._state = EntryState.READY
        entry.ready_at = now
        packed = entry.packed_path()
        self._set_timeouts(entry, now, addr_lifetime, route_lifetime)
        if packed is None:  # pragma: no cover - a READY entry always has a route
            raise ValueError("a READY entry needs a route")
        self._publish(entry, packed)

    def address_resolved(self, entry: DestEntry) -> None:
        """The peer's address is (re)learned: ADDR_RESOLVED, without a route."""
        entry._path = None
        entry.group_route = None
        self.set_state(entry, EntryState.ADDR_RESOLVED)

    def forget(self, entry: DestEntry) -> None:
        """Back to INIT: drop everything learned (address expiry, failures)."""
        entry._reset()
        if entry.hit is not None:
            self._publication.drop((entry,))

    def check_lifetimes(self, entry: DestEntry, now: float) -> None:
        """Expiry on use (behavior.md §9.3): address gone -> INIT, route gone -> ADDR_RESOLVED.
        The route table's Hit expires at the same instants (``RouteTable.find``)."""
        if entry.loopback or entry.op is not None:
            return
        state = entry._state
        if state is EntryState.READY or state is EntryState.ADDR_RESOLVED:
            if now >= entry.addr_expiry:
                self.forget(entry)
            elif state is EntryState.READY and now >= entry.route_expiry:
                self.set_state(entry, EntryState.ADDR_RESOLVED)

    # -- the published route table --------------------------------------------------------

    @property
    def serving(self) -> bool:
        """The endpoint answers resolutions (READY): only then does the table hold routes."""
        return self._publication.serving

    def set_serving(self, serving: bool) -> None:
        """The endpoint became ready (the table answers its READY entries) or stopped being
        so (the table answers nothing: ``resolve`` says ENODATA)."""
        self._publication.set_serving(serving, self)

    def batch(self) -> RouteBatch:
        """``with cache.batch():`` the route changes of many entries (a flush, an SM
        change) are made in one mutation of the map and published once, at the end."""
        return self._publication.batch()

    def _publish(self, entry: DestEntry, packed: bytes | None = None) -> None:
        """(Re)make the Hit of a READY entry (``RoutePublication.renew``) and answer it while
        the entry is this cache's: a resolution that ends on an entry removed meanwhile (its
        address became local) publishes nothing."""
        publication = self._publication
        hit = publication.renew(entry, packed)
        if hit is None or not publication.serving:
            return
        key = entry.key
        if self._entries.get(key) is entry or self._loopback.get(key) is entry:
            publication.put(key, hit)

    # -- timeouts -------------------------------------------------------------------------

    def set_timeouts(
        self, entry: DestEntry, now: float, addr_lifetime: float, route_lifetime: float
    ) -> None:
        """Start the address and route lifetimes of ``entry`` at ``now``."""
        self._set_timeouts(entry, now, addr_lifetime, route_lifetime)
        if entry.hit is not None:
            self._publish(entry)

    def _set_timeouts(
        self, entry: DestEntry, now: float, addr_lifetime: float, route_lifetime: float
    ) -> None:
        addr_expiry = deadline(now, addr_lifetime)
        if addr_expiry != entry.addr_expiry:
            # Equal when the address was learned just now: keep the float already scheduled.
            entry.addr_expiry = addr_expiry
        route_expiry = entry.route_expiry = deadline(now, route_lifetime)
        # A deadline no earlier than the pending wake-up waits for it (``schedule``): the
        # common case (address just scheduled, routes never expire) costs no call.
        if entry.addr_expiry < entry.scheduled:
            self._schedule.schedule(entry, entry.addr_expiry)
        if route_expiry < entry.scheduled:
            self._schedule.schedule(entry, route_expiry)

    def set_addr_timeout(self, entry: DestEntry, now: float, addr_lifetime: float) -> None:
        last = self._last_addr_deadline
        if last[0] is now and last[1] == addr_lifetime:
            # The same batch of received MADs: entries share its deadline float (24 bytes
            # each, and a job start learns N-1 peers in a few batches).
            due = last[2]
        else:
            due = deadline(now, addr_lifetime)
            self._last_addr_deadline = (now, addr_lifetime, due)
        entry.addr_expiry = due
        self._schedule.schedule(entry, due)
        if entry.hit is not None:
            self._publish(entry)

    def next_deadline(self) -> float:
        return self._schedule.next_deadline()

    def expire(self, now: float) -> int:
        """Apply every deadline due at ``now``; returns how many entries changed.

        A due address lifetime removes the entry; a due route lifetime sends a READY entry
        back to ADDR_RESOLVED. Entries with a resolution in progress are left to it.
        """
        changed = 0
        with self.batch():
            for entry in self._schedule.take_due(now):
                changed += self._apply_deadlines(entry, now)
        return changed

    def _apply_deadlines(self, entry: DestEntry, now: float) -> int:
        if self._entries.get(entry.key) is not entry or entry.busy:
            return 0  # gone, replaced, or being worked on (it will get new deadlines)
        if entry.addr_expiry <= now and entry.state >= EntryState.ADDR_RESOLVED:
            del self._entries[entry.key]
            # Out of its due list already; a later deadline's may hold it.
            self._schedule.unschedule((entry,), self._entries)
            self._publication.drop((entry,))
            self.expired += 1
            self._tell(entry, True)
            return 1
        changed = 0
        if entry.route_expiry <= now and entry.state == EntryState.READY:
            self.set_state(entry, EntryState.ADDR_RESOLVED)
            changed = 1
            self._tell(entry, False)
        later = [d for d in (entry.addr_expiry, entry.route_expiry) if d > now]
        if later:
            self._schedule.schedule(entry, min(later))
        return changed

    # -- fabric changes -------------------------------------------------------------------

    def invalidate_routes(self) -> int:
        """Every learned route back to ADDR_RESOLVED (an SM change): the next use re-queries
        it. Entries without a route query (the route file's) and busy ones keep theirs.
        Returns how many entries changed."""
        count = 0
        with self.batch():
            for entry in self.learned():
                if (
                    entry.state is EntryState.READY
                    and entry.route_dest() is not None
                    and not entry.busy
                ):
                    self.set_state(entry, EntryState.ADDR_RESOLVED)
                    count += 1
        return count

    def forget_gid(self, gid: bytes) -> int:
        """The SM says ``gid`` is out of service: drop the entries whose address or route is
        that GID, except what a resolution is working on. An entry with a configured address
        (a query: hosts file, path request) keeps it and loses its route. Returns how many
        entries went."""
        count = 0
        with self.batch():
            for entry in self.learned():
                if entry.busy:
                    continue
                route = entry.path if entry.state is EntryState.READY else None
                if entry.route_gid() != gid and (route is None or route.dgid != gid):
                    continue
                if entry.query is not None:
                    if entry.state is not EntryState.READY:
                        continue
                    # The next use asks the SA again.
                    self.set_state(entry, EntryState.ADDR_RESOLVED)
                else:
                    self.remove(entry.key)
                count += 1
        return count

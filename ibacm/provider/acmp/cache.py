"""The destination cache of one endpoint: keys, entries, states, timeouts, bound and expiry.

behavior.md §9. Differences from C, all invisible on the wire:

* Keys are canonical (defect 34): one bytes object, the address type's byte followed by the
  address; a name lower-cased and cut at its first NUL, every other type only its
  significant bytes (IPv4 4, IPv6/GID 16, LID 2), zero-filled to that size. Not padded to
  the wire's 64 bytes: at 40,000 peers the padding was 2 MB of a daemon's cache (the codecs
  pad when a key goes on the wire); not a (type, address) tuple: 56 bytes an entry, and a
  second object to compare in every dict probe. Lookups are one dict access.
* Entries carry both the route (``path``) and what the SA query that finds it is made of
  (``route_query``): an explicit template (hosts file, path form, restored cache), or, for a
  peer learned through ACM, the group record and the peer's GID, from which the query is
  built only when it is sent. Address data recorded again replaces both, so a re-resolved
  entry never sends stale path fields to the SA (defect 33), and an all-to-all job start
  does not keep N^2 query records nobody sends.
* A bound (``cache_max_entries``) evicts a learned entry nobody is waiting on and nobody
  used lately (defect 32): the oldest ones not used since they were last passed over, in the
  "second chance" (CLOCK) approximation of least recently used, as page caches do, down to
  1/64 below the bound at once. A use is a lookup here (it marks the entry) or a request the
  client loop answered from the entry's Hit (its count grew since the last pass); an exact
  order cost an OrderedDict (twice a dict's memory per entry) and a reordering per lookup.
  Loopback entries live in their own map and are never evicted.
* Expiry runs in the background from deadlines grouped by the second (``expire``), besides
  the on-lookup checks of C, so entries of peers nobody asks for again do not stay forever.
  The on-lookup checks are exact; the background sweep may come up to a second late, which
  costs an entry a list slot instead of a heap item of its own.
* An entry that leaves the cache (evicted, expired, flushed, replaced by a loopback entry)
  leaves the deadline lists too, at once: otherwise an evicted entry stayed in its list with
  its address vector and route until its deadline (24 hours by default), and a bound on
  entries bounded nothing of the memory under a flood of new sources. The lists it may be in
  (its pending wake-up's and its deadlines') are rebuilt without it, once per batch of
  evictions, and a second whose list empties leaves the heap when half of it is such seconds.

* The cache publishes its READY entries for the client loop, which answers cache hits in
  its own thread: ``DestCache.table``, a ``RouteTable`` whose ``routes`` (an immutable map,
  replaced whole on every change) hold each READY entry's ``Hit``, its route packed once
  when it became READY and its expiry (the earlier of the two lifetimes). The entry's
  state machine is the cache's methods alone (``state`` and ``path`` are read-only), so
  no change of state, route, lifetime or membership can leave the table behind.

Times are trio clock seconds; ``math.inf`` means "never".
"""

from __future__ import annotations

import enum
import heapq
import ipaddress
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import immutables
import trio

from ibacm.log import get_logger
from ibacm.provider.acmp.routes import address_query
from ibacm.provider.route_table import Hit, RouteTable

if TYPE_CHECKING:
    from ibacm.fabric.api import AddressVector
    from ibacm.wire.path_record import AimablePath, PathRecord

log = get_logger("ibacm.provider.acmp.cache")

ADDRESS_LEN = 64

# Address types of the peer protocol (ACM_ADDRESS_*), and how many bytes of each are significant.
NAME, IP, IP6, GID, LID = 1, 2, 3, 4, 5
SIGNIFICANT: dict[int, int] = {NAME: ADDRESS_LEN, IP: 4, IP6: 16, GID: 16, LID: 2}
TYPE_NAMES: dict[int, str] = {NAME: "name", IP: "ip", IP6: "ip6", GID: "gid", LID: "lid"}

NO_MGID = bytes(16)
"""The MGID of an entry that knows none (shared: bytes are immutable)."""
NO_GID = NO_MGID
"""A peer GID not known yet (the same shared 16 zero bytes)."""

CacheKey = bytes
"""The address type's byte, then the canonical address (see the module docstring)."""

_TYPE_BYTE = {addr_type: bytes((addr_type,)) for addr_type in SIGNIFICANT}


class CacheKeyError(ValueError):
    """An address cannot be a cache key (unknown type, too long)."""


def cache_key(addr_type: int, address: bytes) -> CacheKey:
    """The canonical key of an address (see the module docstring).

    Not memoised: a memo (an LRU of 16,384 keys until bench-scale) held each address it was
    asked for besides the key, about 245 bytes a peer and 3.8 MB from 16,384 peers on, and a
    job start of more nodes walks it in ring order, so every lookup missed and cost twice
    the key it was to save. A daemon holds a key once, in its cache."""
    if addr_type == NAME and len(address) <= ADDRESS_LEN:
        # Names first: an all-to-all job start makes two keys per resolution (ours, peers').
        return _NAME_BYTE + address.split(b"\0", 1)[0].lower()
    size = SIGNIFICANT.get(int(addr_type))
    if size is None:
        raise CacheKeyError(f"address type {addr_type} cannot be cached (expected 1..5)")
    if len(address) > ADDRESS_LEN:
        raise CacheKeyError(f"address is {len(address)} bytes, at most {ADDRESS_LEN} fit")
    return _TYPE_BYTE[int(addr_type)] + address[:size].ljust(size, b"\0")


_NAME_BYTE = _TYPE_BYTE[NAME]


def key_type(key: CacheKey) -> int:
    return key[0]


def key_address(key: CacheKey) -> bytes:
    """The canonical address of a key (unpadded; see ``cache_key``)."""
    return key[1:]


def lid_key(lid: int) -> CacheKey:
    return _TYPE_BYTE[LID] + lid.to_bytes(2, "big")


def gid_key(gid: bytes) -> CacheKey:
    return cache_key(GID, gid)


def describe_key(key: CacheKey) -> str:
    """Human form of a key for logs and the admin snapshot."""
    addr_type, address = key[0], key[1:]
    try:
        if addr_type == NAME:
            return address.rstrip(b"\0").decode("ascii", "backslashreplace")
        if addr_type == IP:
            return ".".join(str(octet) for octet in address[:4])
        if addr_type in (IP6, GID):
            return str(ipaddress.IPv6Address(address[:16]))
        if addr_type == LID:
            return f"lid {int.from_bytes(address[:2], 'big')}"
    except ValueError:  # pragma: no cover - every canonical key formats
        pass
    return address.hex()


class KeyText:
    """A key formatted only if a log record is really written (debug logs per request)."""

    __slots__ = ("key",)

    def __init__(self, key: CacheKey) -> None:
        self.key = key

    def __str__(self) -> str:
        return describe_key(self.key)

    def __repr__(self) -> str:
        return describe_key(self.key)


class EntryState(enum.IntEnum):
    """behavior.md §9.3."""

    INIT = 0
    QUERY_ADDR = 1
    ADDR_RESOLVED = 2
    QUERY_ROUTE = 3
    READY = 4


class Operation:
    """One resolution of an entry in progress; parked client requests wait for its end.

    ``finish`` is idempotent, so whoever ends the operation first (the resolution task, a
    peer message, a port going down) decides the status and every waiter sees exactly that.
    """

    __slots__ = ("callbacks", "done", "path", "reason", "status", "waiters")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.status = 0
        self.reason = ""
        """Why it failed, in words (logs, the admin snapshot's ``recent_failures``)."""
        self.path: PathRecord | None = None
        """The route on success (the entry itself may change again before waiters run)."""
        self.waiters = 0
        self.callbacks: list[Callable[[Operation], None]] = []
        """Requests waiting without a task (``Resolver.begin_address``): called by
        ``finish``, in the round that ends the operation."""

    @property
    def finished(self) -> bool:
        return self.done.is_set()

    def finish(self, status: int, reason: str = "") -> bool:
        if self.done.is_set():
            return False
        self.status = int(status)
        self.reason = reason
        self.done.set()
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                # One waiter's bug must not keep the others (or the resolution) from ending.
                log.exception("a resolution's waiter failed")
        return True


class PendingQuery:
    """A resolution task waiting for news about an entry: the answer to our ACM request, or
    the peer's own request (which tells us its address just as well)."""

    __slots__ = ("done", "entry", "reason", "status")

    def __init__(self, entry: DestEntry) -> None:
        self.entry = entry
        self.done = trio.Event()
        self.status = 0
        self.reason = ""
        """Why the news is a failure, in words."""

    def complete(self, status: int, reason: str = "") -> None:
        if not self.done.is_set():
            self.status = int(status)
            self.reason = reason
            self.done.set()


class DestEntry:
    """One destination (behavior.md §9.2)."""

    # Not sorted: what a cache hit reads comes first and together (a few cache lines fewer
    # per hit when N daemons' entries do not fit in the CPU's caches), then what learning a
    # peer writes.
    __slots__ = (  # noqa: RUF023
        "_state",
        "hit",
        "loopback",
        "op",
        "addr_expiry",
        "route_expiry",
        "seen",
        "hits",
        "_path",
        "group_route",
        "query",
        "peer_gid",
        "peer_lid",
        "key",
        "remote_qpn",
        "learned_from",
        "mgid",
        "av",
        "route_av",
        "peer_path_bits",
        "preloaded",
        "scheduled",
        "ready_at",
        "reply_tid",
        "wake",
    )

    def __init__(self, key: CacheKey) -> None:
        self.key = key
        self._state = EntryState.INIT
        """Written by ``DestCache`` only (see ``state``)."""
        self.hit: Hit | None = None
        """What the cache's ``RouteTable`` answers for this entry while it is READY (its
        packed route, made once when it became READY), else None."""
        self._path: PathRecord | None = None
        self.group_route: AimablePath | None = None
        """route_prot acm: the record (packed once) of the group the route comes from. The
        route itself (``path``) is that record aimed at the peer, made when asked for: a job
        start of N nodes holds N-1 such routes per daemon, and a PathRecord each was a third
        of an entry's memory."""
        self.query: PathRecord | None = None
        """Explicit template of the SA PathRecord query, when the address did not come
        through ACM (see ``route_query``)."""
        self.learned_from: PathRecord | None = None
        """The record of the multicast group the peer's address was learned through."""
        self.peer_gid = NO_GID
        self.av: AddressVector | None = None
        """Unicast address vector to the peer (responses), once built: an endpoint makes it
        when first needed (``protocol.peer_av``), most peers never need one."""
        self.route_av = False
        """The address vector follows ``path`` (an SA or table route), not the group the
        peer was learned through."""
        self.peer_path_bits = 0
        """DLID path bits the peer's request came to (the source path bits of our answer)."""
        self.mgid = NO_MGID
        self.remote_qpn = 0
        self.peer_lid = 0
        self.reply_tid: int | None = None
        """TID of a peer request for our address still to be answered when the route is known."""
        self.addr_expiry = math.inf
        self.route_expiry = math.inf
        self.op: Operation | None = None
        self.wake: PendingQuery | None = None
        """Set by the resolution task while it waits for the peer; poked when data arrives."""
        self.loopback = False
        self.preloaded = False
        self.hits = 0
        """Requests answered straight from this entry on the trio side, plus the counts of
        the Hits it had before its current one (``total_hits``)."""
        self.ready_at = math.nan
        """When the entry last became READY (trio clock)."""
        self.scheduled = math.inf
        """The deadline of this entry's pending wake-up in the cache's expiry heap."""
        self.seen = 0
        """The Hit's count when the cache's bound last passed over the entry, or USED: looked
        up on the trio side since then. Either way of use gives it a second chance."""

    @property
    def state(self) -> EntryState:
        """behavior.md §9.3. Changed only through ``DestCache`` (``set_state``, ``make_ready``,
        ``address_resolved``, ``forget``...), which keeps the route table in step."""
        return self._state

    @property
    def total_hits(self) -> int:
        """Requests answered from this entry, by the trio side and by the client loop."""
        hit = self.hit
        return self.hits + (hit.count if hit is not None else 0)

    @property
    def path(self) -> PathRecord | None:
        """The route (valid in READY; set through ``DestCache.make_ready``)."""
        path = self._path
        if path is None:
            group = self.group_route
            if group is not None:
                return group.aimed_at(self.route_gid(), self.peer_lid)
        return path

    def packed_path(self) -> bytes | None:
        """``path``'s 64 bytes; a group route's without building the record (cache hits)."""
        path = self._path
        if path is not None:
            return path.encode()
        group = self.group_route
        if group is None:
            return None
        return group.packed_aimed_at(self.route_gid(), self.peer_lid)

    def route_gid(self) -> bytes:
        """The DGID a route to this peer has: the query's, else the learned GID."""
        query = self.query
        return query.dgid if query is not None else self.peer_gid

    @property
    def addr_type(self) -> int:
        return key_type(self.key)

    @property
    def busy(self) -> bool:
        """Someone depends on this entry staying in the cache."""
        return self.op is not None or self.reply_tid is not None

    def route_dest(self) -> tuple[bytes, int] | None:
        """(DGID, DLID) the route query asks for; None before the address is known."""
        query = self.query
        if query is not None:
            return query.dgid, query.dlid
        if self.learned_from is not None:
            return self.peer_gid, 0
        return None

    def route_query(self) -> PathRecord | None:
        """The SA PathRecord query for this entry's route (valid from ADDR_RESOLVED): the
        explicit template, else sgid/tclass/pkey of the group the peer came through and the
        peer's GID (mad-protocol.md §9.5), built fresh each time it is asked for."""
        if self.query is not None:
            return self.query
        base = self.learned_from
        if base is None:
            return None
        return address_query(base.sgid, self.peer_gid, base.tclass, base.pkey)

    def poke(self, status: int = 0, reason: str = "") -> None:
        """Wake the resolution task waiting for the peer, if any, with ``status``."""
        if self.wake is not None:
            self.wake.complete(status, reason)

    def _reset(self) -> None:
        """Back to INIT: drop everything learned (``DestCache.forget``)."""
        self._state = EntryState.INIT
        self._path = None
        self.group_route = None
        self.query = None
        self.learned_from = None
        self.peer_gid = NO_GID
        self.av = None
        self.route_av = False
        self.peer_path_bits = 0
        self.mgid = NO_MGID
        self.remote_qpn = 0
        self.peer_lid = 0
        self.addr_expiry = math.inf
        self.route_expiry = math.inf
        self.preloaded = False

    def describe(self, now: float) -> dict[str, Any]:
        """The entry as the admin protocol shows it (docs/admin-protocol.md)."""
        path = self.path
        age = now - self.ready_at
        return {
            "dest": describe_key(self.key),
            "type": TYPE_NAMES.get(self.addr_type, str(self.addr_type)),
            "state": self.state.name,
            "age": None if math.isnan(age) else round(age, 3),
            "hits": self.total_hits,
            "dlid": path.dlid if path is not None else None,
            "sl": path.sl if path is not None else None,
            "mtu": path.mtu if path is not None else None,
            "rate": path.rate if path is not None else None,
            "remote_qpn": self.remote_qpn,
            "loopback": self.loopback,
            "pending": self.op is not None,
        }


def _deadline(now: float, lifetime: float) -> float:
    # "Never" is the one shared math.inf rather than a new float per entry (routes never
    # expire by default, and an all-to-all makes N^2 entries).
    return math.inf if lifetime == math.inf else now + lifetime


BOUND_SLACK = 64
"""A full cache drops its oldest idle entries down to 1/BOUND_SLACK below the bound."""

Listener = Callable[[DestEntry, bool], None]
"""Told about changes the cache makes by itself: (entry, removed)."""


USED = -1
"""``DestEntry.seen`` of an entry looked up on the trio side since the bound's last pass."""

_NO_ROUTES: immutables.Map[CacheKey, Hit] = immutables.Map()


def table_key(dest_type: int, dest: bytes) -> CacheKey | None:
    """``RouteTable.key`` of an endpoint: the cache key of a destination, or None for a GID
    or LID (it may be our own port's, which ``resolve`` answers) and for what cannot be a
    key (``resolve`` says why). Pure: the client loop's thread calls it."""
    if dest_type in (GID, LID):
        return None
    try:
        return cache_key(dest_type, dest)
    except CacheKeyError:
        return None


class DestCache:
    """The entries of one endpoint (see the module docstring) and its route table.

    The destination entry's state machine lives here: every change of an entry's state,
    route or lifetimes goes through a method of the cache (``DestEntry.state`` and ``path``
    are read-only), and each keeps ``table.routes`` equal to what ``Resolver.resolve_address``
    answers at once: the READY entries of the cache, each as the ``Hit`` made when it became
    READY, while the endpoint serves (``set_serving``), else nothing. ``routes`` is replaced
    whole on every change, never changed in place: the client loop reads it from its own
    thread.
    """

    def __init__(self, max_entries: int = 0, listener: Listener | None = None) -> None:
        self.max_entries = max_entries
        """0 = unbounded (as C)."""
        self.listener = listener
        self._loopback: dict[CacheKey, DestEntry] = {}
        self._entries: dict[CacheKey, DestEntry] = {}
        """Learned entries, oldest first (insertion order; a second chance moves to the end)."""
        self._due: dict[float, list[DestEntry]] = {}
        """Entries to look at, by the whole second their earliest deadline falls in."""
        self._seconds: list[float] = []
        """Heap of the keys of ``_due``."""
        self._second_of: dict[float, float] = {}
        """Each key of ``_due`` by itself (see ``_schedule``)."""
        self._empty_seconds = 0
        """Seconds in the heap whose list emptied (see ``_unschedule``)."""
        self.evicted = 0
        self.expired = 0
        self._last_addr_deadline: tuple[float, float, float] = (math.nan, math.nan, math.nan)
        """(now, lifetime, deadline) of the last ``set_addr_timeout``."""
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
            self._entries[key] = entry
            self._enforce_bound(keep=key)
        return entry

    def put_loopback(self, entry: DestEntry, path: PathRecord, now: float) -> None:
        """``entry`` (not in the cache yet) READY with ``path`` for good: one of our own
        addresses (behavior.md §9.4)."""
        entry.loopback = True
        learned = self._entries.pop(entry.key, None)
        if learned is not None:
            self._unschedule((learned,))
            self._drop_hits((learned,))
        self._loopback[entry.key] = entry
        entry._path, entry.group_route = path, None
        entry._state = EntryState.READY
        entry.ready_at = now
        self._publish(entry, path.encode())

    def remove(self, key: CacheKey) -> DestEntry | None:
        entry = self._loopback.pop(key, None)
        if entry is None:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._unschedule((entry,))
        if entry is not None:
            self._drop_hits((entry,))
            self._tell(entry, True)
        return entry

    def clear_learned(self) -> int:
        """Drop every learned entry nobody waits on; returns how many were dropped."""
        idle = [entry for entry in self._entries.values() if not entry.busy]
        for entry in idle:
            del self._entries[entry.key]
        self._unschedule(idle)
        self._drop_hits(idle)
        for entry in idle:
            self._tell(entry, True)
        return len(idle)

    def scheduled_entries(self) -> int:
        """Slots in the deadline lists (an entry may hold more than one): what the bound
        and the tests check never outgrows the cache."""
        return sum(len(due) for due in self._due.values())

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
            self._drop_hits((entry,))

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
            self._drop_hits((entry,))

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

    def set_serving(self, serving: bool) -> None:
        """The endpoint became ready (the table answers its READY entries) or stopped being
        so (the table answers nothing: ``resolve`` says ENODATA)."""
        if serving == self.serving:
            return
        self.serving = serving
        if not serving:
            self._routes = _NO_ROUTES
        else:
            mutation = _NO_ROUTES.mutate()
            for entry in self:
                if entry.hit is not None:
                    mutation[entry.key] = entry.hit
            self._routes = mutation.finish()
        if self._batch is not None:
            self._batch = self._routes.mutate()  # a batch open meanwhile goes on from here
        self.table.routes = self._routes

    def batch(self) -> RouteBatch:
        """``with cache.batch():`` the route changes of many entries (a flush, an SM
        change) are made in one mutation of the map and published once, at the end."""
        return RouteBatch(self)

    def _begin(self) -> None:
        if self._batch_depth == 0:
            self._batch = self._routes.mutate()
        self._batch_depth += 1

    def _end(self) -> None:
        self._batch_depth -= 1
        if self._batch_depth == 0 and self._batch is not None:
            batch, self._batch = self._batch, None
            if self.serving:
                self._routes = batch.finish()
                self.table.routes = self._routes

    def _publish(self, entry: DestEntry, packed: bytes | None = None) -> None:
        """(Re)make the Hit of a READY entry: with ``packed`` (a new route), else the
        current Hit's bytes with the entry's current lifetimes."""
        old = entry.hit
        if packed is None:
            if old is None:  # pragma: no cover - callers publish READY entries only
                return
            packed = old.packed
        expiry = math.inf if entry.loopback else min(entry.addr_expiry, entry.route_expiry)
        if old is not None:
            if old.packed is packed and old.expiry == expiry:
                return
            self._fold(entry, old)
        hit = entry.hit = Hit(packed, expiry)
        key = entry.key
        if not self.serving or (
            self._entries.get(key) is not entry and self._loopback.get(key) is not entry
        ):
            # Not answered now, or no longer this cache's entry: a resolution that ends on an
            # entry removed meanwhile (its address became local) publishes nothing.
            return
        batch = self._batch
        if batch is not None:
            batch[key] = hit
        else:
            self._routes = self._routes.set(key, hit)
            self.table.routes = self._routes

    def _drop_hits(self, entries: Iterable[DestEntry]) -> None:
        """Take the Hits of entries that left READY or the cache out of the table."""
        mutation = self._batch
        own = mutation is None and self.serving
        for entry in entries:
            hit = entry.hit
            if hit is None:
                continue
            entry.hit = None
            self._fold(entry, hit)
            if not self.serving:
                continue
            if mutation is None:
                mutation = self._routes.mutate()
            if mutation.get(entry.key) is hit:  # not a newer entry's under the same key
                del mutation[entry.key]
        if own and mutation is not None:
            self._routes = mutation.finish()
            self.table.routes = self._routes

    @staticmethod
    def _fold(entry: DestEntry, hit: Hit) -> None:
        """A Hit leaves: its count joins the entry's own. The client loop may still count a
        request or two on it while it goes (racing increments of a Hit no longer in the map
        are lost: admin figures only). A count grown since the bound's last pass counts as
        a use."""
        count = hit.count
        entry.hits += count
        if entry.seen != count:
            entry.seen = USED
        else:
            entry.seen = 0

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
        addr_expiry = _deadline(now, addr_lifetime)
        if addr_expiry != entry.addr_expiry:
            # Equal when the address was learned just now: keep the float already scheduled.
            entry.addr_expiry = addr_expiry
        route_expiry = entry.route_expiry = _deadline(now, route_lifetime)
        # A deadline no earlier than the pending wake-up waits for it (see _schedule): the
        # common case (address just scheduled, routes never expire) costs no call.
        if entry.addr_expiry < entry.scheduled:
            self._schedule(entry, entry.addr_expiry)
        if route_expiry < entry.scheduled:
            self._schedule(entry, route_expiry)

    def set_addr_timeout(self, entry: DestEntry, now: float, addr_lifetime: float) -> None:
        last = self._last_addr_deadline
        if last[0] is now and last[1] == addr_lifetime:
            # The same batch of received MADs: entries share its deadline float (24 bytes
            # each, and a job start learns N-1 peers in a few batches).
            deadline = last[2]
        else:
            deadline = _deadline(now, addr_lifetime)
            self._last_addr_deadline = (now, addr_lifetime, deadline)
        entry.addr_expiry = deadline
        self._schedule(entry, deadline)
        if entry.hit is not None:
            self._publish(entry)

    def _schedule(self, entry: DestEntry, deadline: float) -> None:
        # One pending wake-up per entry: a later deadline waits for the earlier wake-up,
        # which schedules what is left (an all-to-all would queue 3 wake-ups per entry).
        if deadline == math.inf or entry.loopback:
            return
        second = float(math.ceil(deadline))
        if entry.scheduled <= second:
            return
        due = self._due.get(second)
        if due is None:
            self._due[second] = [entry]
            self._second_of[second] = second
            heapq.heappush(self._seconds, second)
        else:
            due.append(entry)
            # The bucket's own float: entries of one second share it (24 bytes each, and a
            # job start schedules N-1 entries in the same second or two).
            second = self._second_of[second]
        entry.scheduled = second

    def _unschedule(self, gone: Iterable[DestEntry]) -> None:
        """Take entries that left the cache out of every deadline list they may be in: their
        pending wake-up's, and their deadlines' (a wake-up that came earlier than a deadline
        leaves the entry in that deadline's list too)."""
        seconds: set[float] = set()
        for entry in gone:
            for deadline in (entry.scheduled, entry.addr_expiry, entry.route_expiry):
                if deadline != math.inf:
                    seconds.add(float(math.ceil(deadline)))
            entry.scheduled = math.inf
        entries = self._entries
        for second in seconds:
            due = self._due.get(second)
            if due is None:
                continue
            # Kept: what is still this very entry of the cache (a replaced key's new entry
            # may share the list).
            kept = [entry for entry in due if entries.get(entry.key) is entry]
            if kept:
                due[:] = kept
                continue
            del self._due[second]
            del self._second_of[second]
            self._empty_seconds += 1
        if self._empty_seconds * 2 > len(self._seconds):
            # Seconds without a list go from the heap once they are half of it.
            self._seconds = [second for second in self._seconds if second in self._due]
            heapq.heapify(self._seconds)
            self._empty_seconds = 0

    def next_deadline(self) -> float:
        return self._seconds[0] if self._seconds else math.inf

    def expire(self, now: float) -> int:
        """Apply every deadline due at ``now``; returns how many entries changed.

        A due address lifetime removes the entry; a due route lifetime sends a READY entry
        back to ADDR_RESOLVED. Entries with a resolution in progress are left to it.
        """
        changed = 0
        with self.batch():
            changed = self._expire(now)
        return changed

    def _expire(self, now: float) -> int:
        changed = 0
        while self._seconds and self._seconds[0] <= now:
            second = heapq.heappop(self._seconds)
            self._second_of.pop(second, None)
            due = self._due.pop(second, None)
            if due is None:
                self._empty_seconds = max(0, self._empty_seconds - 1)
                continue  # its entries all left the cache before
            for entry in due:
                if entry.scheduled != second:
                    continue  # an earlier wake-up of this entry took over
                entry.scheduled = math.inf
                changed += self._apply_deadlines(entry, now)
        return changed

    def _apply_deadlines(self, entry: DestEntry, now: float) -> int:
        if self._entries.get(entry.key) is not entry or entry.busy:
            return 0  # gone, replaced, or being worked on (it will get new deadlines)
        if entry.addr_expiry <= now and entry.state >= EntryState.ADDR_RESOLVED:
            del self._entries[entry.key]
            # Its own list is being emptied by ``expire``; a later deadline's may hold it.
            self._unschedule((entry,))
            self._drop_hits((entry,))
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
            self._schedule(entry, min(later))
        return changed

    # -- bound ----------------------------------------------------------------------------

    def _enforce_bound(self, keep: CacheKey) -> None:
        limit = self.max_entries
        entries = self._entries
        if not limit or len(entries) <= limit:
            return
        # Down to 1/64 below the bound at once: a pass starts at the oldest end, behind the
        # holes the young-end moves leave in a dict, so it is paid once per batch.
        excess = len(entries) - (limit - limit // BOUND_SLACK)
        # Used entries (looked up here, or their Hit counted by the client loop since the
        # last pass) are marked seen and go to the young end, busy ones and the new one just
        # go there: the second pass finds entries to drop unless all are busy.
        evicted: list[DestEntry] = []
        for _ in range(2):
            for key in list(entries):
                if excess <= 0:
                    break
                entry = entries.pop(key)
                hit = entry.hit
                count = hit.count if hit is not None else 0
                used = entry.seen != count
                if used or entry.busy or key == keep:
                    entry.seen = count
                    entries[key] = entry
                    continue
                excess -= 1
                evicted.append(entry)
            if excess <= 0:
                break
        self.evicted += len(evicted)
        self._unschedule(evicted)
        self._drop_hits(evicted)
        for entry in evicted:
            self._tell(entry, True)


class RouteBatch:
    """See ``DestCache.batch``."""

    __slots__ = ("cache",)

    def __init__(self, cache: DestCache) -> None:
        self.cache = cache

    def __enter__(self) -> None:
        self.cache._begin()

    def __exit__(self, *exc_info: object) -> None:
        self.cache._end()

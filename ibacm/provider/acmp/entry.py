"""A destination of the cache: its entry, the states it goes through, and what waits on it.

behavior.md §9.2 and §9.3. Entries carry both the route (``path``) and what the SA query that
finds it is made of (``route_query``): an explicit template (hosts file, path form, restored
cache), or, for a peer learned through ACM, the group record and the peer's GID, from which
the query is built only when it is sent. Address data recorded again replaces both, so a
re-resolved entry never sends stale path fields to the SA (defect 33), and an all-to-all job
start does not keep N^2 query records nobody sends.

An entry's state and route are read-only here: they change through the cache's transitions
(``DestCache.set_state``, ``make_ready``, ``address_resolved``, ``forget``), which keep the
route table in step; ``_state``, ``_path`` and ``_reset`` are the cache's to use.

Times are trio clock seconds; ``math.inf`` means "never".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ibacm.log import get_logger
from ibacm.provider.acmp.keys import TYPE_NAMES, CacheKey, describe_key, key_type
from ibacm.provider.acmp.routes import address_query

if TYPE_CHECKING:
    from ibacm.fabric.api import AddressVector
    from ibacm.provider.route_table import Hit
    from ibacm.wire.path_record import AimablePath, PathRecord

log = get_logger("ibacm.provider.acmp.entry")

NO_MGID = bytes(16)
"""The MGID of an entry that knows none (shared: bytes are immutable)."""
NO_GID = NO_MGID
"""A peer GID not known yet (the same shared 16 zero bytes)."""

USED = -1
"""``DestEntry.seen`` of an entry looked up on the trio side since the bound's last pass."""


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
        """Requests waiting without a task (``Resolver.begin_address``), and an ACM request
        in flight without one (``AddressFlight``): called by ``finish``, in the round that
        ends the operation."""

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

    __slots__ = ("done", "entry", "on_done", "reason", "status")

    def __init__(self, entry: DestEntry) -> None:
        self.entry = entry
        self.done = trio.Event()
        self.status = 0
        self.reason = ""
        """Why the news is a failure, in words."""
        self.on_done: Callable[[], None] | None = None
        """A resolution waiting without a task (``resolution.AddressFlight``): called by
        ``complete``, in the round that brings the news."""

    def complete(self, status: int, reason: str = "") -> None:
        if not self.done.is_set():
            self.status = int(status)
            self.reason = reason
            self.done.set()
            on_done = self.on_done
            if on_done is not None:
                self.on_done = None
                on_done()


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

"""An endpoint of ibacmp (port, partition): its lifecycle, its multicast joins, its local
addresses, and what its peer protocol and resolver see of it; and the port it is on.

An endpoint owns a UD QP, its multicast groups, its destination cache (``cache``), its
counters and statistics (``counters``). Its tasks run in a nursery of their own inside the
port's nursery: the QP's receive loop and ``send_depth`` response senders (``traffic``), the
cache expiry task, one join task per group and, when enabled, the bulk route preload
(``bulk``). Closing the endpoint cancels exactly these; the resolutions in progress then end
their parked requests with ENODATA (``DOWN_STATUS``).

The endpoint is the host of its peer protocol (``PeerView``) and of its resolver
(``ResolverHost``); neither module imports this one. Its traffic hands each MAD received to
``PeerProtocol.receive`` and applies the actions it returns in the same round.

Unlike C (defect 24), a closed endpoint is really closed; when the core opens it again the
provider creates a new QP, joins again and preloads again. What it learned (the cache) is kept
for the reopened endpoint unless the port's LID or GID changed.

Beyond C, an endpoint whose port has a new LID or GID, or whose groups were joined again after
a client reregister, announces itself as a host sends gratuitous ARP: as each group is joined,
it multicasts on it one ACM request per local address, from that address and for that address
(nobody else claims it, so nobody answers). Every peer caches the requester of any request
(mad-protocol.md §6.2): peers that hold us learn our new LID, QPN and GID at once instead of
serving the old route until our next request of our own or their expiry. A C peer records a
READY requester again only when its QPN changed, which a reopened endpoint's new QP gives.
"""

from __future__ import annotations

import collections
import enum
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ibacm.config.option_values import LoopbackProt
from ibacm.fabric.api import MULTICAST_QPN, AddressVector, FabricError, UdQp
from ibacm.log import get_logger
from ibacm.provider.acmp.bulk import BulkRoutes
from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.counters import EndpointCounters, EndpointStats
from ibacm.provider.acmp.entry import DestEntry, EntryState, PendingQuery
from ibacm.provider.acmp.groups import (
    McGroup,
    build_join,
    join_forever,
    joined_mgids,
    parse_join_reply,
    plan_groups,
)
from ibacm.provider.acmp.keys import (
    GID,
    IP,
    IP6,
    LID,
    NAME,
    CacheKey,
    CacheKeyError,
    cache_key,
    key_address,
)
from ibacm.provider.acmp.protocol import PeerProtocol, peer_av
from ibacm.provider.acmp.resolution import NOT_READY, Resolver
from ibacm.provider.acmp.routes import SaOutcome, SaPaths, SaQuery, av_from_path, loopback_path
from ibacm.provider.acmp.timers import Timers
from ibacm.provider.acmp.traffic import EndpointTraffic, ResolveCredits
from ibacm.wire.acm_mad import acm_request
from ibacm.wire.client import AcmStatus
from ibacm.wire.path_record import PathRecord
from ibacm.wire.rates import get_rate

if TYPE_CHECKING:
    from ibacm.config.options import Options
    from ibacm.fabric.api import ReceivedMad
    from ibacm.provider.api import CoreAddress, CoreEndpoint, CorePort, CoreServices

log = get_logger("ibacm.provider.acmp")

DOWN_STATUS = AcmStatus.ENODATA
"""What parked requests get when their endpoint closes or their port goes down: ENODATA is
what a not-ready endpoint answers, and what ``ib_acme -c`` style clients retry on."""

EXPIRY_PERIOD = 60.0
"""Lifetimes are whole minutes; the expiry task looks at least this often."""
RECENT_FAILURES = 32
"""Failed resolutions an endpoint remembers for the admin snapshot (``recent_failures``)."""


class EndpointState(enum.Enum):
    INIT = "init"
    """Open, group 0 not joined: resolutions answer ENODATA."""
    READY = "ready"
    CLOSED = "closed"


class AcmpPort:
    """The provider's view of one ACTIVE port."""

    def __init__(self, core: CoreServices, port: CorePort) -> None:
        self.core = core
        self.core_port = port
        self.sa = SaPaths(core, port)
        self.endpoints: dict[int, AcmpEndpoint] = {}
        """Open endpoints by partition (low 15 bits of the P_Key)."""
        self.closed = False
        self.serving = trio.Event()
        """Set once one of its endpoints has joined group 0. Other SA work of the port (the SM
        event subscription) waits for it, so it never holds a join back (``sa_depth`` 1)."""

    @property
    def attrs(self) -> Any:
        return self.core_port.attrs

    @property
    def lid(self) -> int:
        return int(self.core_port.attrs.lid)

    @property
    def lid_mask(self) -> int:
        return int(self.core_port.attrs.lid_mask)

    @property
    def gid(self) -> bytes:
        gids = self.core_port.attrs.gids
        return bytes(gids[0]) if gids else bytes(16)

    @property
    def mtu(self) -> int:
        return int(self.core_port.attrs.active_mtu)

    @property
    def rate(self) -> int:
        attrs = self.core_port.attrs
        return get_rate(attrs.active_width, attrs.active_speed)

    @property
    def subnet_timeout_ms(self) -> int:
        """2^(SubnetTimeout - 8) ms (behavior.md §8), 0 below 8."""
        value = int(self.core_port.attrs.subnet_timeout)
        return 1 << (value - 8) if value >= 8 else 0

    def sgid_index(self, gid: bytes) -> int:
        index = self.core_port.attrs.gid_index(gid)
        return 0 if index is None else int(index)

    def owns_lid(self, lid: int) -> bool:
        return lid != 0 and (lid & self.lid_mask) == self.lid


class AcmpAddress:
    """A local address as the provider keeps it (the add_address context)."""

    __slots__ = ("core", "endpoint", "key")

    def __init__(self, endpoint: AcmpEndpoint, core: CoreAddress, key: CacheKey) -> None:
        self.endpoint = endpoint
        self.core = core
        self.key = key


class AcmpEndpoint:
    """One endpoint of the provider (see the module docstring)."""

    def __init__(
        self,
        port: AcmpPort,
        core_endpoint: CoreEndpoint,
        cache: DestCache,
        counters: EndpointCounters,
        stats: EndpointStats | None = None,
    ) -> None:
        self.port = port
        self.core: CoreServices = port.core
        self.options: Options = port.core.options
        self.core_endpoint = core_endpoint
        self.pkey = core_endpoint.pkey
        self.cache = cache
        self.counters = counters
        self.stats = EndpointStats() if stats is None else stats
        """Kept by the provider across reopenings, as the counters."""
        self.state = EndpointState.INIT
        self.ready = False
        """``state`` is READY (a plain attribute: every MAD received reads it)."""
        self.groups = [
            McGroup(index, spec, self.pkey)
            for index, spec in enumerate(plan_groups(self.options, port.rate, port.mtu))
        ]
        self.joined: dict[bytes, McGroup] = {}
        """Joined groups by MGID: the only groups we advertise and accept."""
        self.addresses: dict[CacheKey, AcmpAddress] = {}
        self.outstanding: dict[int, PendingQuery] = {}
        """Our ACM requests awaiting a response, by TID."""
        self.timers = Timers()
        """Retransmissions and time-outs of the ACM requests sent without a task."""
        self.resolve_credits = ResolveCredits(
            max(1, self.options.resolve_depth), self._credit_wait, self.stats
        )
        self.bulk = BulkRoutes(self.name, self.pkey, self.options)
        self.scope: trio.CancelScope | None = None
        self.nursery: trio.Nursery | None = None
        self._join_scope: trio.CancelScope | None = None
        self._announce: set[int] = set()
        """Groups (by index) to announce our addresses on once joined."""
        self.failures: collections.deque[tuple[float, str, int, str]] = collections.deque(
            maxlen=RECENT_FAILURES
        )
        """(trio time, destination, status, reason) of the last failed resolutions."""
        self.resolver = Resolver(self)
        self.protocol = PeerProtocol(self)
        self.traffic = EndpointTraffic(
            self.protocol,
            self.resolver,
            self.stats,
            self.group0,
            max(64, self.options.recv_depth),
        )
        cache.listener = self._cache_changed

    def apply_options(self, options: Options) -> None:
        """A reload: later reads of the options (timeouts, retries, loopback, join backoff)
        see ``options``; entries learned from now on get the new lifetimes."""
        depth = max(1, options.resolve_depth)
        if depth != max(1, self.options.resolve_depth):
            # Holders release into the credits they took (``async with`` keeps the object),
            # so the old and new limits overlap only while those answers are out.
            self.resolve_credits = ResolveCredits(depth, self._credit_wait, self.stats)
        self.options = options
        # Read for every entry learned: copied there, renewed only by a reload.
        self.resolver.reload(options)
        self.protocol.reload(options)
        self.bulk.reload(options)

    @property
    def addr_lifetime(self) -> float:
        return self.resolver.addr_lifetime

    @property
    def route_lifetime(self) -> float:
        return self.resolver.route_lifetime

    # -- identity -------------------------------------------------------------------------

    @property
    def partition(self) -> int:
        return self.pkey & 0x7FFF

    @property
    def group0(self) -> McGroup:
        return self.groups[0]

    @property
    def qp(self) -> UdQp | None:
        """The endpoint's UD QP while it is open (kept by its traffic)."""
        return self.traffic.qp

    @property
    def qpn(self) -> int:
        qp = self.traffic.qp
        return qp.qpn if qp is not None else 0

    @property
    def lid(self) -> int:
        return self.port.lid

    @property
    def gid(self) -> bytes:
        return self.port.gid

    @property
    def subnet_timeout_ms(self) -> int:
        return self.port.subnet_timeout_ms

    def next_tid(self) -> int:
        return self.core.next_tid()

    def _credit_wait(self) -> float:
        """How long a resolution waits for a resolve credit: half a response window, so the
        ``retries + 1`` transmissions still fit its budget and the last one keeps at least
        half a window for its answer."""
        return self.resolver.attempt_wait / 2

    def local_match(self, addr_type: int, address: bytes) -> bool:
        """Whether a peer asking for (type, address) asks for us.

        Names, IPv4 and IPv6 are our addresses; beyond C (defect 45) a GID request is ours
        when it names a GID of our port, and a LID request when it names our LID.
        """
        try:
            key = cache_key(addr_type, address)
        except CacheKeyError:
            return False
        if addr_type in (NAME, IP, IP6):
            return key in self.addresses
        if addr_type == GID:
            return self.port.core_port.attrs.gid_index(key_address(key)) is not None
        if addr_type == LID:
            return self.port.owns_lid(int.from_bytes(key_address(key), "big"))
        return False

    # -- lifecycle ------------------------------------------------------------------------

    async def open(self) -> None:
        """Create the QP and start the endpoint's tasks in the port's nursery."""
        attrs = self.port.core_port.attrs
        pkey_index = attrs.pkeys.index(self.pkey) if self.pkey in attrs.pkeys else 0
        self.traffic.qp = await self.port.core_port.port.open_ud(
            pkey_index, recv_depth=max(1, self.options.recv_depth)
        )
        try:
            await self.port.core_port.nursery.start(self._run)
        except BaseException:
            await self._close_qp()
            raise

    async def _run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            self.scope = scope
            try:
                async with trio.open_nursery() as nursery:
                    self.nursery = nursery
                    nursery.start_soon(self.traffic.receive_loop)
                    for _ in range(max(1, self.options.send_depth)):
                        nursery.start_soon(self.traffic.queued_sender)
                    nursery.start_soon(self._expiry_loop)
                    nursery.start_soon(self.timers.run)
                    self.start_joins()
                    if self.options.route_bulk_preload:
                        nursery.start_soon(self.bulk.keep_loaded, self.port.sa, self._own_gid)
                    task_status.started()
            finally:
                self.nursery = None

    async def close(self) -> None:
        """Stop everything; parked requests end with DOWN_STATUS."""
        if self.state is EndpointState.CLOSED:
            return
        self.set_state(EndpointState.CLOSED)
        if self.scope is not None:
            self.scope.cancel()
        # Tasks that never got to run still leave operations behind: end them here.
        for entry in list(self.cache):
            if entry.op is not None:
                entry.op.finish(DOWN_STATUS, "the endpoint closed")
                entry.op = None
                if entry.state in (EntryState.QUERY_ADDR, EntryState.QUERY_ROUTE):
                    self.cache.forget(entry)
            entry.reply_tid = None
        # A copy: a request sent without a task leaves ``outstanding`` as it completes.
        for pending in list(self.outstanding.values()):
            pending.complete(DOWN_STATUS, "the endpoint closed")
        self.outstanding.clear()
        await self._close_qp()

    async def _close_qp(self) -> None:
        traffic = self.traffic
        qp, traffic.qp = traffic.qp, None
        if qp is not None:
            with trio.CancelScope(shield=True):
                try:
                    await qp.aclose()
                except FabricError as exc:
                    log.debug("closing the QP failed", error=str(exc))

    def spawn(self, fn: Any, *args: Any) -> bool:
        """Start a task in the endpoint's nursery; False once the endpoint stopped."""
        nursery = self.nursery
        if nursery is None or self.state is EndpointState.CLOSED:
            return False
        try:
            nursery.start_soon(fn, *args)
        except RuntimeError:
            return False
        return True

    # -- groups ---------------------------------------------------------------------------

    def start_joins(self) -> None:
        """(Re)start one join task per group; joins still running from before are stopped."""
        if self._join_scope is not None:
            self._join_scope.cancel()
        self._join_scope = trio.CancelScope()
        self.spawn(self._joins, self._join_scope)

    async def _joins(self, scope: trio.CancelScope) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                for group in self.groups:
                    nursery.start_soon(self._join, group)

    async def _join(self, group: McGroup) -> None:
        await join_forever(
            group,
            self._join_once,
            self.options.join_retry_initial_ms,
            self.options.join_retry_max_ms,
        )

    async def _join_once(self, group: McGroup) -> None:
        self.stats.join_attempts += 1
        port = self.port
        tid = self.core.next_tid()
        raw = await self.core.sa_request(
            port.core_port, build_join(tid, group, port.gid, self.pkey)
        )
        granted = parse_join_reply(raw, tid, group.mgid)
        if group.index == 0 and self.qp is not None:
            # Requests come to us through group 0 only: attach before we call ourselves ready.
            await self.qp.attach_mcast(granted.mgid, granted.mlid)
        group.apply(granted, port.sgid_index(granted.port_gid), port.lid)
        self.joined[group.mgid] = group
        log.info(
            "joined multicast group",
            group=group.index,
            mgid=group.mgid.hex(),
            mlid=group.mlid,
            pkey=f"0x{self.pkey:04x}",
        )
        self.core.publish("group", {"endpoint": self.name, **group.describe()})
        if group.index == 0:
            port.serving.set()
            if self.state is EndpointState.INIT:
                self.set_state(EndpointState.READY)
        if group.index in self._announce:
            self._announce.discard(group.index)
            self.spawn(self._announce_on, group)

    def announce_when_joined(self) -> None:
        """Announce our addresses on every group as it is joined (see the module docstring):
        our LID, GID or QPN changed, or the SA forgot our groups."""
        self._announce = {group.index for group in self.groups}

    async def _announce_on(self, group: McGroup) -> None:
        qp, av = self.qp, group.av
        if qp is None or av is None:
            return
        mgids = joined_mgids(self.groups)
        sent = 0
        for address in list(self.addresses.values()):
            kind, info = address.core.type, address.core.info
            mad = acm_request(self.core.next_tid(), kind, info, kind, info, mgids).encode()
            try:
                await qp.send(mad, av, MULTICAST_QPN)
            except FabricError as exc:
                self.stats.send_errors += 1
                log.debug("announcement not sent", error=str(exc))
                continue
            sent += 1
        self.stats.announcements += sent
        log.info("addresses announced", endpoint=self.name, group=group.index, requests=sent)

    async def rejoin(self) -> None:
        """Client reregister: the SA forgot our groups; join them again.

        Resolutions answer ENODATA until group 0 is back (as C); the cache is kept.
        """
        if self.state is EndpointState.CLOSED:
            return
        group0 = self.group0
        if group0.joined and self.qp is not None:
            try:
                await self.qp.detach_mcast(group0.mgid, group0.mlid)
            except FabricError as exc:
                log.debug("detach failed", error=str(exc))
        for group in self.groups:
            group.reset()
            self.core.publish("group", {"endpoint": self.name, **group.describe()})
        self.joined.clear()
        self.set_state(EndpointState.INIT)
        # Peers may have lost track of us too (an SM that restarted may have given new LIDs).
        self.announce_when_joined()
        self.start_joins()

    def set_state(self, state: EndpointState) -> None:
        self.state = state
        self.ready = state is EndpointState.READY
        # The route table answers only while we do (``resolve_address`` checks ``ready``).
        self.cache.set_serving(self.ready)
        self.core.publish("endpoint", {"id": self.name, "state": state.value})

    def publish_entry(self, entry: DestEntry, removed: bool = False) -> None:
        """Tell admin subscribers about a cache entry that changed."""
        if not self.core.wants("cache"):
            return  # nobody listens: spare the description (an all-to-all makes N^2 of them)
        data = entry.describe(trio.current_time())
        data["endpoint"] = self.name
        if removed:
            data["removed"] = True
        self.core.publish("cache", data)

    def note_failure(self, dest: object, status: int, reason: str) -> None:
        """A resolution failed: logged (with why) and kept for the snapshot. Requests refused
        while group 0 is not joined are only debug lines (a client may retry in a loop)."""
        text = str(dest)
        self.failures.append((trio.current_time(), text, int(status), reason))
        if reason == NOT_READY:
            log.debug("resolution failed", dest=text, status=int(status), reason=reason)
        else:
            log.info("resolution failed", dest=text, status=int(status), reason=reason)

    def _cache_changed(self, entry: DestEntry, removed: bool) -> None:
        self.publish_entry(entry, removed)

    @property
    def name(self) -> str:
        return f"{self.port.core_port.device.name}/{self.port.core_port.port_num}/0x{self.pkey:04x}"

    # -- addresses ------------------------------------------------------------------------

    def add_address(self, address: CoreAddress) -> AcmpAddress:
        key = cache_key(address.type, address.info)
        acmp_address = AcmpAddress(self, address, key)
        self.addresses[key] = acmp_address
        if self.loopback_local:
            self._put_loopback(key)
        return acmp_address

    @property
    def loopback_local(self) -> bool:
        return self.options.loopback_prot is LoopbackProt.LOCAL

    def loopback_route(self) -> PathRecord:
        """The path to ourselves (behavior.md §9.4)."""
        port = self.port
        return loopback_path(port.gid, port.lid, self.pkey, port.mtu, port.rate)

    def _put_loopback(self, key: CacheKey) -> None:
        port = self.port
        entry = DestEntry(key)
        path = self.loopback_route()
        entry.av = av_from_path(path, 0, port.lid_mask)
        entry.remote_qpn = self.qpn
        entry.peer_lid = port.lid
        self.cache.put_loopback(entry, path, trio.current_time())

    def remove_address(self, address: AcmpAddress) -> None:
        self.addresses.pop(address.key, None)
        entry = self.cache.remove(address.key)
        if entry is not None and entry.op is not None:
            entry.op.finish(AcmStatus.ENODATA)

    # -- traffic, the SA, background tasks ------------------------------------------------

    def receive_mad(self, received: ReceivedMad, now: float | None = None) -> None:
        """One MAD as the receive loop takes it (``now``: the trio clock by default)."""
        self.traffic.receive_mad(received, trio.current_time() if now is None else now)

    def respond(self, entry: DestEntry, tid: int, status: int) -> None:
        """Answer a peer's request ``tid`` for our address (``PeerProtocol.response``)."""
        self.traffic.respond(entry, tid, status)

    @property
    def can_ask(self) -> bool:
        group0 = self.group0
        return group0.joined and group0.av is not None and self.qp is not None

    def post_request(self, mad: bytes) -> bool:
        """Multicast an ACM request on group 0 (``EndpointTraffic.post_request``)."""
        return self.traffic.post_request(mad)

    async def sa_get(self, query: PathRecord) -> SaOutcome:
        return await self.port.sa.get(query)

    def sa_begin(
        self, query: PathRecord, on_outcome: Callable[[SaOutcome], None]
    ) -> SaQuery | None:
        return self.port.sa.begin(query, on_outcome)

    async def _expiry_loop(self) -> None:
        while True:
            now = trio.current_time()
            self.cache.expire(now)
            wake = min(self.cache.next_deadline(), now + EXPIRY_PERIOD)
            await trio.sleep_until(max(wake, now))

    def _own_gid(self) -> bytes:
        return self.port.gid

    def peer_av(self, entry: DestEntry) -> AddressVector | None:
        """The unicast address vector to an entry's peer (``protocol.peer_av``)."""
        port = self.port
        return peer_av(entry, self.joined, port.sgid_index, port.lid_mask)

    def bulk_route(self, dgid: bytes, dlid: int, now: float) -> PathRecord | None:
        """A route from the bulk table (``BulkRoutes.route``)."""
        return self.bulk.route(dgid, dlid, now)

    def invalidate_routes(self) -> int:
        """Forget every learned route, the bulk table's too (SM change): the next use
        re-queries it (``DestCache.invalidate_routes``)."""
        self.bulk.clear()
        return self.cache.invalidate_routes()

    def forget_gid(self, gid: bytes) -> int:
        """The SM says ``gid`` is out of service: drop what leads to it, in the bulk table
        and in the cache (``DestCache.forget_gid``)."""
        self.bulk.forget_gid(gid)
        return self.cache.forget_gid(gid)

    # -- observability --------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """State for the admin snapshot (docs/admin-protocol.md); the cache list is capped."""
        now = trio.current_time()
        return {
            "id": self.name,
            "state": self.state.value,
            "pkey": self.pkey,
            "qpn": self.qpn,
            "groups": [group.describe() for group in self.groups],
            "cache": [entry.describe(now) for entry in itertools.islice(self.cache, 1024)],
            "cache_entries": len(self.cache),
            "cache_evicted": self.cache.evicted,
            "cache_expired": self.cache.expired,
            "outstanding": len(self.outstanding),
            "recent_failures": [
                {"dest": dest, "status": status, "reason": reason, "age": round(now - at, 3)}
                for at, dest, status, reason in self.failures
            ],
            "bulk_routes": len(self.bulk.by_gid),
            "counters": self.counters.snapshot(),
            "stats": {**self.stats.as_dict(), "completion_errors": self._completion_errors()},
        }

    def _completion_errors(self) -> int:
        """Sends and receives whose completion failed after they were posted (the QP's)."""
        qp = self.qp
        return qp.completion_errors if qp is not None else 0

"""``ibacmp``, the default resolution provider: the Provider API mapped onto the endpoint
machinery of this package.

Contexts: ``open_device`` returns the CoreDevice, ``open_port`` an ``AcmpPort``,
``open_endpoint`` an ``AcmpEndpoint``, ``add_address`` an ``AcmpAddress``.

What survives an endpoint closing (port down, LID/GID/P_Key change): its counters and stats
(they never reset) and its cache, handed to the endpoint when the core opens it again. If the
port's LID changed meanwhile, every learned route is dropped back to ADDR_RESOLVED (their SLID
is ours), and the reopened endpoint announces its addresses to its peers (``AcmpEndpoint``);
if its GID changed, everything learned is forgotten (and the endpoint announces itself too).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from ibacm.config.options import Options
from ibacm.config.paths import state_dir
from ibacm.fabric.api import PortEventType
from ibacm.log import get_logger
from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.counters import EndpointCounters, EndpointStats
from ibacm.provider.acmp.endpoint import AcmpAddress, AcmpEndpoint, AcmpPort
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.events import SmEvents
from ibacm.provider.acmp.keys import CacheKeyError, cache_key
from ibacm.provider.acmp.persistence import (
    CacheFileError,
    CacheStore,
    Records,
    endpoint_id,
    restore,
    snapshot,
)
from ibacm.provider.acmp.preload import run_preloads
from ibacm.provider.api import (
    CoreAddress,
    CoreDevice,
    CoreEndpoint,
    CorePort,
    CoreServices,
    Counter,
    Provider,
    ResolveRequest,
    ResolveResult,
)
from ibacm.provider.route_table import RouteTable
from ibacm.wire.client import AcmStatus, AddrType, EpFlag
from ibacm.wire.errors import WireError
from ibacm.wire.path_record import PathRecord

log = get_logger("ibacm.provider.acmp")

EndpointIdentity = tuple[int, int, int]
"""(node GUID, port number, partition)."""


@dataclass(eq=False)
class _Retained:
    """What an endpoint leaves behind for its next opening."""

    cache: DestCache
    counters: EndpointCounters
    gid: bytes
    lid: int
    pkey: int
    stats: EndpointStats = field(default_factory=EndpointStats)
    restored: bool = False
    moved: bool = False
    """The port's LID or GID differed at the last opening."""


class AcmpProvider(Provider):
    """The default provider (see the module docstring and ``ibacm.provider.acmp``)."""

    name = "ibacmp"

    def __init__(self, core: CoreServices) -> None:
        super().__init__(core)
        self.wall_clock: Callable[[], float] = time.time
        """Wall-clock time for the cache file (tests replace it)."""
        self._retained: dict[EndpointIdentity, _Retained] = {}
        self._ports: list[AcmpPort] = []
        self._events: dict[AcmpPort, SmEvents] = {}
        """The SM event subscription of every open port."""
        self._saved: Records = {}
        """Cache file contents: loaded at start, waiting for their endpoints to open."""
        self._store: CacheStore | None = None
        self._saving = trio.Lock()
        self._saved_at = -math.inf

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        path = self.core.options.cache_file
        if not path:
            return
        self._store = CacheStore(path, self.wall_clock, state_dir(os.environ))
        log.info("cache file", path=str(self._store.path))
        try:
            self._saved = await self._store.load()
        except CacheFileError as exc:
            log.warning("cache file not restored", error=str(exc))
            self._saved = {}

    async def stop(self) -> None:
        await self.save_cache()

    def options_changed(self, options: Options) -> bool:
        """A reload: every open endpoint takes the new timeouts, retries, lifetimes,
        loopback, join backoff and resolve depth (ibacm.core.daemon.PROVIDER_OPTIONS)."""
        for port in self._ports:
            for endpoint in port.endpoints.values():
                endpoint.apply_options(options)
        return True

    async def save_cache(self) -> None:
        """Write every endpoint's cache to ``cache_file`` (if configured)."""
        store = self._store
        if store is None:
            return
        async with self._saving:
            now, wall_now = trio.current_time(), self.wall_clock()
            self._saved_at = now
            records: Records = dict(self._saved)
            for retained in self._retained.values():
                ident = endpoint_id(retained.gid, retained.pkey)
                records[ident] = snapshot(retained.cache, now, wall_now)
            try:
                await store.save(records)
            except CacheFileError as exc:
                log.warning("cache file not saved", error=str(exc))

    async def _saver(self, interval: int) -> None:
        """Periodic save, one task per open port (the port's nursery owns it); whichever
        port's task is due first saves for all, so the file is written about once per
        ``interval`` whatever ports come and go."""
        while True:
            await trio.sleep(interval)
            if trio.current_time() - self._saved_at >= interval * 0.9:
                await self.save_cache()

    @property
    def ports(self) -> tuple[AcmpPort, ...]:
        """The open ports."""
        return tuple(self._ports)

    # -- devices and ports ----------------------------------------------------------------

    async def open_device(self, device: CoreDevice) -> object:
        return device

    async def close_device(self, dev_ctx: object) -> None:
        return None

    async def open_port(self, port: CorePort, dev_ctx: object) -> object:
        acmp_port = AcmpPort(self.core, port)
        self._ports.append(acmp_port)
        log.info(
            "port up",
            device=port.device.name,
            port=port.port_num,
            lid=acmp_port.lid,
            mtu=acmp_port.mtu,
            rate=acmp_port.rate,
        )
        interval = self.core.options.cache_save_interval
        if self._store is not None and interval > 0:
            port.nursery.start_soon(self._saver, interval)
        events = self._events[acmp_port] = SmEvents(acmp_port)
        port.nursery.start_soon(events.run)
        return acmp_port

    async def close_port(self, port_ctx: object) -> None:
        port = _port(port_ctx)
        port.closed = True
        for endpoint in list(port.endpoints.values()):
            await self.close_endpoint(endpoint)
        if port in self._ports:
            self._ports.remove(port)
        self._events.pop(port, None)

    # -- endpoints ------------------------------------------------------------------------

    async def open_endpoint(self, endpoint: CoreEndpoint, port_ctx: object) -> object:
        port = _port(port_ctx)
        identity = (endpoint.port.device.node_guid, endpoint.port.port_num, endpoint.pkey & 0x7FFF)
        retained = self._retain(identity, port)
        acmp_endpoint = AcmpEndpoint(
            port, endpoint, retained.cache, retained.counters, retained.stats
        )
        if retained.moved:
            # Peers still hold our old LID/GID: tell them (AcmpEndpoint, gratuitous requests).
            acmp_endpoint.announce_when_joined()
        if not retained.restored:
            retained.restored = True
            self._restore(acmp_endpoint)
        await run_preloads(acmp_endpoint)
        await acmp_endpoint.open()
        port.endpoints[acmp_endpoint.partition] = acmp_endpoint
        log.info("endpoint open", endpoint=acmp_endpoint.name, qpn=acmp_endpoint.qpn)
        return acmp_endpoint

    def _retain(self, identity: EndpointIdentity, port: AcmpPort) -> _Retained:
        retained = self._retained.get(identity)
        if retained is None:
            cache = DestCache(self.core.options.cache_max_entries)
            retained = _Retained(
                cache,
                EndpointCounters(self.core.counters, cache.table),
                port.gid,
                port.lid,
                identity[2],
            )
            self._retained[identity] = retained
            return retained
        retained.moved = (retained.gid, retained.lid) != (port.gid, port.lid)
        if retained.gid != port.gid:
            dropped = retained.cache.clear_learned()
            log.info("port GID changed: cache dropped", entries=dropped)
        elif retained.lid != port.lid:
            cache = retained.cache
            with cache.batch():
                for entry in cache.learned():
                    if entry.preloaded:
                        cache.remove(entry.key)
                    elif entry.state is EntryState.READY:
                        cache.set_state(entry, EntryState.ADDR_RESOLVED)
            log.info("port LID changed: routes dropped", old=retained.lid, new=port.lid)
        retained.gid, retained.lid = port.gid, port.lid
        return retained

    def _restore(self, endpoint: AcmpEndpoint) -> None:
        records = self._saved.pop(endpoint_id(endpoint.port.gid, endpoint.pkey), None)
        if not records:
            return
        count = restore(
            endpoint.cache, endpoint.port, records, trio.current_time(), self.wall_clock()
        )
        log.info("cache restored", endpoint=endpoint.name, entries=count, saved=len(records))

    async def close_endpoint(self, ep_ctx: object) -> None:
        endpoint = _endpoint(ep_ctx)
        port = endpoint.port
        if port.endpoints.get(endpoint.partition) is endpoint:
            del port.endpoints[endpoint.partition]
        await endpoint.close()

    def add_address(self, address: CoreAddress, ep_ctx: object) -> object:
        return _endpoint(ep_ctx).add_address(address)

    def remove_address(self, addr_ctx: object) -> None:
        address = _address(addr_ctx)
        address.endpoint.remove_address(address)
        # C purges the address from every endpoint's cache: it is local now.
        for port in self._ports:
            for endpoint in port.endpoints.values():
                if endpoint is not address.endpoint:
                    endpoint.cache.remove(address.key)

    # -- requests -------------------------------------------------------------------------

    async def resolve(self, addr_ctx: object, request: ResolveRequest) -> ResolveResult:
        endpoint = _address(addr_ctx).endpoint
        first = request.entries[0]
        resolver = endpoint.resolver
        if first.type == AddrType.PATH:
            try:
                path = first.path()
            except WireError:
                endpoint.counters.endpoint_only(Counter.ERROR)
                return ResolveResult(AcmStatus.EINVAL)
            nodelay = bool(first.flags & EpFlag.NODELAY)
            status, found = await resolver.resolve_path(path, nodelay)
        else:
            dest = request.dest
            nodelay = bool(dest.flags & EpFlag.NODELAY)
            status, found = await resolver.resolve_address(request.source, dest, nodelay)
        return ResolveResult(_status(status), (found,) if found is not None else ())

    def begin_resolve(
        self, addr_ctx: object, request: ResolveRequest, done: Callable[[ResolveResult], None]
    ) -> bool:
        """Address form without a task: the ACM request goes out from here (``_start``
        spawns the resolution, whose first MAD is posted in its first step) and the answer
        comes from the round that ends the resolution."""
        if request.entries[0].type == AddrType.PATH:
            return False
        dest = request.dest

        def answered(answer: tuple[int, PathRecord | None]) -> None:
            status, found = answer
            done(ResolveResult(_status(status), (found,) if found is not None else ()))

        nodelay = bool(dest.flags & EpFlag.NODELAY)
        endpoint = _address(addr_ctx).endpoint
        endpoint.resolver.begin_address(request.source, dest, nodelay, answered)
        return True

    def route_table(self, addr_ctx: object) -> RouteTable:
        """The endpoint's route table (``DestCache.table``): its READY entries while it is
        ready, kept in step by the cache's state machine; the same object for the
        endpoint's lifetime (and its reopenings: the cache is retained)."""
        return _address(addr_ctx).endpoint.cache.table

    async def query(self, addr_ctx: object, path: PathRecord) -> tuple[int, PathRecord | None]:
        endpoint = _address(addr_ctx).endpoint
        counters = endpoint.counters
        if not endpoint.ready:
            counters.endpoint_only(Counter.NODATA)
            return AcmStatus.ENODATA, None
        counters.both(Counter.ROUTE_QUERY)
        outcome = await endpoint.port.sa.get(path)
        if outcome.status != AcmStatus.SUCCESS:
            counters.endpoint_only(Counter.ERROR)
            log.debug("QUERY_SA failed", status=outcome.status, reason=outcome.reason)
        return outcome.status, outcome.record

    async def handle_event(self, port_ctx: object, event: PortEventType) -> None:
        port = _port(port_ctx)
        endpoints = list(port.endpoints.values())
        if event in (PortEventType.CLIENT_REREGISTER, PortEventType.SM_CHANGE):
            events = self._events.get(port)
            if events is not None:
                events.resubscribe()  # the SM may know no subscriptions now
        if event is PortEventType.CLIENT_REREGISTER:
            log.info("client reregister: joining again", port=port.core_port.port_num)
            for endpoint in endpoints:
                await endpoint.rejoin()
        elif event is PortEventType.SM_CHANGE:
            # The core already sends SA MADs to the new SM; its routes may differ.
            dropped = sum(endpoint.invalidate_routes() for endpoint in endpoints)
            log.info("SM changed: routes dropped", port=port.core_port.port_num, routes=dropped)

    def query_perf(self, ep_ctx: object) -> Sequence[int]:
        return _endpoint(ep_ctx).counters.snapshot()

    # -- observability --------------------------------------------------------------------

    def describe_endpoint(self, ep_ctx: object) -> Mapping[str, Any]:
        endpoint = _endpoint(ep_ctx)
        described = dict(endpoint.describe())
        events = self._events.get(endpoint.port)
        if events is not None:
            described["sm_events"] = events.snapshot()
        return described

    def flush(self, ep_ctx: object, dest: tuple[AddrType, bytes] | None = None) -> int:
        cache = _endpoint(ep_ctx).cache
        if dest is None:
            return cache.clear_learned()
        try:
            key = cache_key(dest[0], dest[1])
        except CacheKeyError:
            return 0
        entry = cache.get(key)
        if entry is None or entry.loopback or entry.busy:
            return 0
        cache.remove(key)
        return 1


def _status(value: int) -> AcmStatus:
    try:
        return AcmStatus(value)
    except ValueError:
        # An SA status byte with no ACM name (e.g. 4 "too many records"): report EINVAL.
        return AcmStatus.EINVAL


def _port(ctx: object) -> AcmpPort:
    if not isinstance(ctx, AcmpPort):
        raise TypeError(f"not an ibacmp port context: {ctx!r}")
    return ctx


def _endpoint(ctx: object) -> AcmpEndpoint:
    if not isinstance(ctx, AcmpEndpoint):
        raise TypeError(f"not an ibacmp endpoint context: {ctx!r}")
    return ctx


def _address(ctx: object) -> AcmpAddress:
    if not isinstance(ctx, AcmpAddress):
        raise TypeError(f"not an ibacmp address context: {ctx!r}")
    return ctx

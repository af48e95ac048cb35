"""Cache preloads of an endpoint: ``route_preload opensm_full_v1`` and ``addr_preload acm_hosts``.

options.md §7. Route preload first, then address preload, once per endpoint opening (C did it
only for the first opening, defect 24). The C provider stored remote QPN 1 in preloaded
entries, so its answers to such peers went to their QP1 and were lost (defect 36); here a
preloaded entry has no QPN (0) and learns the real one from the peer's first request.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ibacm.config.hosts_file import HostEntry, parse_hosts_file
from ibacm.config.option_values import AddrPreload, RoutePreload
from ibacm.config.route_file import RouteDump, parse_route_file
from ibacm.log import get_logger
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.keys import CacheKeyError, cache_key, gid_key, lid_key
from ibacm.provider.acmp.routes import av_from_path
from ibacm.wire.path_record import PathRecord

if TYPE_CHECKING:
    from ibacm.provider.acmp.endpoint import AcmpEndpoint

log = get_logger("ibacm.provider.acmp")

FOREVER = float("inf")


async def read_text(path: str) -> str | None:
    """A preload file's text, or None (logged) when it cannot be read."""
    try:
        return await trio.to_thread.run_sync(Path(path).read_text, "utf-8", "surrogateescape")
    except OSError as exc:
        log.warning("cannot read preload file", path=path, error=exc.strerror or str(exc))
        return None


async def run_preloads(endpoint: AcmpEndpoint) -> None:
    options = endpoint.options
    if options.route_preload is RoutePreload.OPENSM_FULL_V1:
        text = await read_text(options.route_data_file)
        if text is not None:
            dump, issues = parse_route_file(text, options.route_data_file)
            for issue in issues:
                log.info("route preload file", issue=str(issue))
            count = preload_routes(endpoint, dump)
            log.info("route preload", endpoint=endpoint.name, entries=count)
    if options.addr_preload is AddrPreload.ACM_HOSTS:
        text = await read_text(options.addr_data_file)
        if text is not None:
            hosts, issues = parse_hosts_file(text, options.addr_data_file)
            for issue in issues:
                log.info("address preload file", issue=str(issue))
            count = preload_hosts(endpoint, hosts)
            log.info("address preload", endpoint=endpoint.name, entries=count)


def preload_routes(endpoint: AcmpEndpoint, dump: RouteDump) -> int:
    """READY LID and GID entries for every path of our own section (options.md §7.2)."""
    port = endpoint.port
    own_gid = port.gid
    own_guid = int.from_bytes(own_gid[8:], "big")
    section = dump.section_for(own_guid, port.lid)
    if section is None:
        log.warning(
            "route preload: no section for this port",
            guid=f"0x{own_guid:016x}",
            lid=port.lid,
        )
        return 0
    prefix = own_gid[:8]
    now = trio.current_time()
    count = 0
    for route in section.paths:
        guid = dump.lid_to_guid.get(route.dlid)
        if guid is None:
            continue
        dgid = prefix + guid.to_bytes(8, "big")
        path = PathRecord(
            sgid=own_gid,
            slid=port.lid,
            dgid=dgid,
            dlid=route.dlid,
            reversible=True,
            pkey=endpoint.pkey,
            sl=route.sl & 0xF,
        )
        path.mtu_byte = route.mtu
        path.rate_byte = route.rate
        path.packetlifetime_byte = 0 if route.dlid == port.lid else port.attrs.subnet_timeout
        own = route.dlid == port.lid
        cache = endpoint.cache
        for key in (lid_key(route.dlid), gid_key(dgid)):
            entry = cache.acquire(key)
            if entry.op is not None:
                continue  # being resolved right now; the resolution decides
            cache.forget(entry)
            entry.av = av_from_path(path, port.sgid_index(own_gid), port.lid_mask)
            entry.peer_lid = route.dlid
            entry.preloaded = True
            options = endpoint.options
            cache.make_ready(
                entry,
                now,
                FOREVER if own else options.addr_lifetime,
                FOREVER if own else options.route_lifetime,
                path,
            )
        count += 1
    return count


def preload_hosts(endpoint: AcmpEndpoint, hosts: Iterable[HostEntry]) -> int:
    """Address entries from the hosts file (options.md §7.1)."""
    port = endpoint.port
    options = endpoint.options
    now = trio.current_time()
    count = 0
    for host in hosts:
        try:
            key = cache_key(host.type, host.address_bytes)
        except CacheKeyError as exc:
            log.info("address preload: line skipped", line=host.line, reason=str(exc))
            continue
        cache = endpoint.cache
        entry = cache.acquire(key)
        if entry.loopback or entry.op is not None:
            continue
        cache.forget(entry)
        entry.query = PathRecord(dgid=host.gid, slid=port.lid, reversible=True, pkey=endpoint.pkey)
        entry.preloaded = True
        routed = cache.get(gid_key(host.gid))
        lifetimes = (options.addr_lifetime, options.route_lifetime)
        if routed is not None and routed.state is EntryState.READY and routed.path is not None:
            entry.av = endpoint.peer_av(routed)
            entry.peer_lid = routed.peer_lid
            cache.make_ready(entry, now, *lifetimes, routed.path)
        else:
            cache.set_state(entry, EntryState.ADDR_RESOLVED)
            cache.set_timeouts(entry, now, *lifetimes)
        count += 1
    return count

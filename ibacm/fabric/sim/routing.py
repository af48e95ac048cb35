"""Paths through a simulated fabric: hop count and the MTU/rate bottleneck between two ports.

Endpoints are LID-addressable ports, named by GUID: HCA ports and switch management ports
(port 0, GUID = switch GUID). Switch-to-switch distances are found by breadth-first search,
once per source switch and then cached, so a multicast to thousands of ports costs one search
plus a dictionary lookup per receiver. When several shortest paths exist the first one found
is used, like a deterministic routing engine; its narrowest link gives the path's MTU and rate.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ibacm.fabric.sim.topo_file.model import LinkEnd, Topology
from ibacm.wire.rates import get_rate, rate_to_gbps


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """Active attributes of one link (as both ends report them)."""

    width: int
    speed: int
    mtu: int
    rate: int
    """IBA rate enum of width x speed."""
    gbps: float


@dataclass(frozen=True, slots=True)
class PathInfo:
    hops: int
    """Links traversed (0 for a port talking to itself)."""
    mtu: int
    rate: int


_UNBOUNDED = LinkInfo(0, 0, 5, 0, math.inf)


class Router:
    """Static routing facts of a topology; see the module docstring."""

    def __init__(self, topology: Topology) -> None:
        self._switch_mtu = {sw.guid: sw.mtu for sw in topology.switches}
        port_mtu = {(hca.node_guid, p.num): p.mtu for _h, hca, p in topology.hca_ports()}
        self._hca_port_guid = {
            (hca.node_guid, p.num): p.guid for _h, hca, p in topology.hca_ports()
        }
        self._uplink: dict[int, tuple[int, LinkInfo]] = {}
        """HCA port GUID -> (switch GUID or peer HCA port GUID, link)."""
        self._adjacent: dict[int, list[tuple[int, LinkInfo]]] = {g: [] for g in self._switch_mtu}
        self._cache: dict[int, dict[int, tuple[int, int, float, int]]] = {}
        self._switch_port0: dict[int, LinkInfo] = {}
        """What a switch's management port reports: its MTU and its fastest link."""
        for link in topology.links:
            info = self._link_info(link.a, link.b, link.width, link.speed, port_mtu)
            for end in (link.a, link.b):
                if end.node_guid in self._switch_mtu:
                    known = self._switch_port0.get(end.node_guid)
                    if known is None or info.gbps > known.gbps:
                        mtu = self._switch_mtu[end.node_guid]
                        self._switch_port0[end.node_guid] = LinkInfo(
                            info.width, info.speed, mtu, info.rate, info.gbps
                        )
            a_switch = link.a.node_guid in self._switch_mtu
            b_switch = link.b.node_guid in self._switch_mtu
            if a_switch and b_switch:
                self._adjacent[link.a.node_guid].append((link.b.node_guid, info))
                self._adjacent[link.b.node_guid].append((link.a.node_guid, info))
            else:
                self._attach(link.a, link.b, b_switch, info)
                self._attach(link.b, link.a, a_switch, info)

    def _link_info(
        self, a: LinkEnd, b: LinkEnd, width: int, speed: int, port_mtu: dict[tuple[int, int], int]
    ) -> LinkInfo:
        mtu = min(self._end_mtu(a, port_mtu), self._end_mtu(b, port_mtu))
        rate = get_rate(width, speed)
        return LinkInfo(width, speed, mtu, rate, rate_to_gbps(rate) if rate else 0.0)

    def _end_mtu(self, end: LinkEnd, port_mtu: dict[tuple[int, int], int]) -> int:
        if end.node_guid in self._switch_mtu:
            return self._switch_mtu[end.node_guid]
        return port_mtu[(end.node_guid, end.port)]

    def _attach(
        self, hca_end: LinkEnd, other: LinkEnd, other_is_switch: bool, info: LinkInfo
    ) -> None:
        if hca_end.node_guid in self._switch_mtu:
            return
        port_guid = self._hca_port_guid[(hca_end.node_guid, hca_end.port)]
        peer = (
            other.node_guid
            if other_is_switch
            else self._hca_port_guid[(other.node_guid, other.port)]
        )
        self._uplink[port_guid] = (peer, info)

    # -- queries --------------------------------------------------------------------------

    def link(self, port_guid: int) -> LinkInfo | None:
        """The link of an HCA port, or None when it is not cabled."""
        entry = self._uplink.get(port_guid)
        return entry[1] if entry else None

    def is_switch(self, guid: int) -> bool:
        return guid in self._switch_mtu

    def switch_of(self, port_guid: int) -> int | None:
        """The switch an HCA port is cabled to (None: no cable, or cabled to another HCA)."""
        entry = self._uplink.get(port_guid)
        if entry is None or entry[0] not in self._switch_mtu:
            return None
        return entry[0]

    def switch_distances(self, switch: int) -> dict[int, tuple[int, int, float, int]]:
        """(hops, MTU, Gb/s, rate) from ``switch`` to every reachable switch (cached).

        The fast path of multicast delivery: hops between two HCA ports on switches ``a`` and
        ``b`` are ``switch_distances(a)[b][0] + 2``.
        """
        return self._from_switch(switch)

    def path(self, src: int, dst: int) -> PathInfo | None:
        """Hops, MTU and rate from endpoint ``src`` to ``dst`` (GUIDs); None if unreachable."""
        src_switch, src_hops, src_link = self._attachment(src)
        dst_switch, dst_hops, dst_link = self._attachment(dst)
        if src_switch is None or dst_switch is None:
            return None
        if src == dst:
            own = self._switch_port0.get(src, src_link)
            return PathInfo(0, own.mtu, own.rate)
        if src_switch == dst and not self.is_switch(dst):
            return PathInfo(1, src_link.mtu, src_link.rate)  # back-to-back HCAs
        if not self.is_switch(src_switch) or not self.is_switch(dst_switch):
            return None
        route = self._from_switch(src_switch).get(dst_switch)
        if route is None:
            return None
        distance, mtu, gbps, rate = route
        mtu = min(mtu, src_link.mtu, dst_link.mtu)
        for link in (src_link, dst_link):
            if link.gbps < gbps:
                gbps, rate = link.gbps, link.rate
        return PathInfo(src_hops + distance + dst_hops, mtu, rate)

    def bottlenecks_from(self, src: int, dsts: Sequence[int]) -> list[tuple[int, int] | None]:
        """(MTU, rate) of ``self.path(src, dst)`` for each of ``dsts`` (None: unreachable),
        with the source side looked up once: an SA GetTable asks for a path to every port."""
        src_switch, _hops, src_link = self._attachment(src)
        if src_switch is None:
            return [None] * len(dsts)
        if not self.is_switch(src_switch):  # back-to-back HCAs: rare
            return [_bottleneck(self.path(src, dst)) for dst in dsts]
        table = self._from_switch(src_switch)
        switch_mtu = self._switch_mtu
        uplink = self._uplink
        src_mtu, src_gbps, src_rate = src_link.mtu, src_link.gbps, src_link.rate
        found: list[tuple[int, int] | None] = []
        for dst in dsts:
            if dst == src:
                found.append(_bottleneck(self.path(src, dst)))
                continue
            if dst in switch_mtu:
                dst_switch, dst_mtu, dst_gbps, dst_rate = dst, switch_mtu[dst], math.inf, 0
            else:
                attached = uplink.get(dst)
                if attached is None:
                    found.append(None)
                    continue
                dst_switch, link = attached
                dst_mtu, dst_gbps, dst_rate = link.mtu, link.gbps, link.rate
            route = table.get(dst_switch)
            if route is None:  # unreachable, or behind an HCA (not a switch)
                found.append(None)
                continue
            _distance, mtu, gbps, rate = route
            if src_gbps < gbps:
                gbps, rate = src_gbps, src_rate
            if dst_gbps < gbps:
                rate = dst_rate
            found.append((min(mtu, src_mtu, dst_mtu), rate))
        return found

    def _attachment(self, guid: int) -> tuple[int | None, int, LinkInfo]:
        if guid in self._switch_mtu:
            return guid, 0, LinkInfo(0, 0, self._switch_mtu[guid], 0, math.inf)
        entry = self._uplink.get(guid)
        if entry is None:
            return None, 0, _UNBOUNDED
        return entry[0], 1, entry[1]

    def _from_switch(self, source: int) -> dict[int, tuple[int, int, float, int]]:
        """(distance, MTU, Gb/s, rate enum) to every reachable switch; cached per source."""
        cached = self._cache.get(source)
        if cached is not None:
            return cached
        best: dict[int, tuple[int, int, float, int]] = {source: (0, 5, math.inf, 0)}
        queue = deque([source])
        while queue:
            here = queue.popleft()
            distance, mtu, gbps, rate = best[here]
            for neighbour, info in self._adjacent[here]:
                if neighbour in best:
                    continue
                if info.gbps < gbps:
                    best[neighbour] = (distance + 1, min(mtu, info.mtu), info.gbps, info.rate)
                else:
                    best[neighbour] = (distance + 1, min(mtu, info.mtu), gbps, rate)
                queue.append(neighbour)
        self._cache[source] = best
        return best


def _bottleneck(info: PathInfo | None) -> tuple[int, int] | None:
    return None if info is None else (info.mtu, info.rate)

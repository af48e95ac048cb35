"""Who is where in a running simulated fabric: the runtime records built from a topology,
found by node name, LID or port GUID, and the IPoIB addresses configured on them.

``Directory`` builds the records (``runtime.py``) of every host and switch of a ``Topology``
and keeps them indexed as LIDs and port states change. It is the subnet as the SA sees it
(``SaFabric``: only ACTIVE ports are part of it), knows which port the master SM runs
behind, answers a port query as the HCA would, and gives callers snapshots of a node
(``NodeInfo``) that do not change under them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ibacm.fabric.api import (
    FabricError,
    InterfaceAddress,
    IpEvent,
    PortAttributes,
    PortState,
)
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.runtime import (
    DeviceRuntime,
    Endpoint,
    HostRuntime,
    PortRuntime,
    SwitchEndpoint,
)
from ibacm.fabric.sim.topo_file.model import UNICAST_LID_MAX, Host, Topology, gid_of


@dataclass(frozen=True, slots=True)
class PortInfo:
    device: str
    num: int
    guid: int
    lid: int
    lmc: int
    gid: bytes
    state: PortState
    pkeys: tuple[int, ...]
    ifname: str
    ipv4: tuple[str, ...]
    ipv6: tuple[str, ...]

    @property
    def gid_text(self) -> str:
        return str(ipaddress.IPv6Address(self.gid))


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node looks like now: its ports with LIDs, GIDs and IPoIB addresses."""

    name: str
    devices: tuple[str, ...]
    ports: tuple[PortInfo, ...]

    @property
    def lids(self) -> list[int]:
        return [p.lid for p in self.ports if p.lid]

    @property
    def gids(self) -> list[bytes]:
        return [p.gid for p in self.ports if p.lid]

    @property
    def ipv4(self) -> list[str]:
        return [a for p in self.ports for a in p.ipv4]

    @property
    def ipv6(self) -> list[str]:
        return [a for p in self.ports for a in p.ipv6]


class Directory:
    """See the module docstring."""

    def __init__(self, topology: Topology, router: Router) -> None:
        self.topology = topology
        self.router = router
        self.sm_guid = topology.sm_guid
        """Port GUID the master SM runs behind (a switch GUID for switch port 0)."""
        self._hosts: dict[str, HostRuntime] = {}
        self._by_lid: dict[int, Endpoint] = {}
        self._by_guid: dict[int, Endpoint] = {}
        self._endpoint_list: list[Endpoint] | None = None
        for switch in topology.switches:
            port0 = router.path(switch.guid, switch.guid)
            rate = port0.rate if port0 else 0
            self._index(
                SwitchEndpoint(
                    switch.name,
                    switch.guid,
                    switch.lid,
                    switch.lmc,
                    switch.mtu,
                    rate,
                    description=switch.description,
                )
            )
        for host in topology.hosts:
            self._hosts[host.name] = self._build_host(host)

    def _build_host(self, host: Host) -> HostRuntime:
        runtime = HostRuntime(host.name)
        for hca in host.hcas:
            device = DeviceRuntime(runtime, hca.name, hca.node_guid, hca.description)
            for spec in hca.ports:
                link = self.router.link(spec.guid)
                port = PortRuntime(
                    device=device,
                    num=spec.num,
                    guid=spec.guid,
                    lid=spec.lid if link else 0,
                    lmc=spec.lmc,
                    state=PortState.ACTIVE if link and spec.lid else PortState.DOWN,
                    pkeys=spec.pkeys,
                    mtu_cap=spec.mtu,
                    mtu=link.mtu if link else spec.mtu,
                    width=link.width if link else spec.width,
                    speed=link.speed if link else spec.speed,
                    rate=link.rate if link else 0,
                    gid0=gid_of(self.topology.subnet_prefix, spec.guid),
                    switch=self.router.switch_of(spec.guid),
                )
                device.ports.append(port)
                self._index(port)
                if spec.ifname:
                    runtime.interfaces[spec.ifname] = port
                    ifaces: list[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = [
                        *spec.ipv4,
                        *spec.ipv6,
                    ]
                    for iface in ifaces:
                        runtime.addresses.append(_interface_address(spec.ifname, port, iface))
            runtime.devices.append(device)
        return runtime

    def _index(self, endpoint: Endpoint) -> None:
        self._by_guid[endpoint.guid] = endpoint
        if endpoint.lid:
            for lid in range(endpoint.lid, endpoint.lid + (1 << endpoint.lmc)):
                self._by_lid[lid] = endpoint
        self._endpoint_list = None

    def _unindex_lids(self, endpoint: Endpoint) -> None:
        if endpoint.lid:
            for lid in range(endpoint.lid, endpoint.lid + (1 << endpoint.lmc)):
                if self._by_lid.get(lid) is endpoint:
                    del self._by_lid[lid]
        self._endpoint_list = None

    # -- the SaFabric view (used by the SA) -----------------------------------------------

    @property
    def subnet_prefix(self) -> int:
        return self.topology.subnet_prefix

    @property
    def subnet_timeout(self) -> int:
        return self.topology.subnet_timeout

    def endpoint_by_lid(self, lid: int) -> Endpoint | None:
        endpoint = self._by_lid.get(lid)
        return endpoint if endpoint is not None and endpoint.active else None

    def endpoint_by_guid(self, guid: int) -> Endpoint | None:
        endpoint = self._by_guid.get(guid)
        return endpoint if endpoint is not None and endpoint.active and endpoint.lid else None

    def endpoints(self) -> Sequence[Endpoint]:
        if self._endpoint_list is None:
            active = {e for e in self._by_lid.values() if e.active}
            self._endpoint_list = sorted(active, key=lambda e: e.lid)
        return self._endpoint_list

    # -- whatever the state ---------------------------------------------------------------

    def lid_owner(self, lid: int) -> Endpoint | None:
        """The endpoint a LID routes to, up or down (the fabric drops what a down port gets)."""
        return self._by_lid.get(lid)

    def guid_owner(self, guid: int) -> Endpoint | None:
        return self._by_guid.get(guid)

    def switch_named(self, name: str) -> SwitchEndpoint | None:
        for endpoint in self._by_guid.values():
            if isinstance(endpoint, SwitchEndpoint) and endpoint.name == name:
                return endpoint
        return None

    @property
    def node_names(self) -> list[str]:
        return list(self._hosts)

    @property
    def hosts(self) -> Iterable[HostRuntime]:
        return self._hosts.values()

    def host(self, name: str) -> HostRuntime:
        try:
            return self._hosts[name]
        except KeyError:
            raise FabricError(f"no node named {name!r} in the simulated fabric") from None

    def port(self, node: str, device: str, port: int) -> PortRuntime:
        return self.host(node).device(device).port(port)

    def all_ports(self, node: str | None = None) -> Iterable[PortRuntime]:
        """Every HCA port of ``node`` (default: of every node)."""
        hosts = [self.host(node)] if node is not None else list(self._hosts.values())
        for host in hosts:
            for device in host.devices:
                yield from device.ports

    # -- changes --------------------------------------------------------------------------

    def set_state(self, port: PortRuntime, state: PortState) -> None:
        port.state = state
        self._endpoint_list = None

    def move_lid(self, port: PortRuntime, lid: int) -> None:
        """Give ``port`` the LIDs ``lid .. lid + 2**LMC - 1``, if they are free."""
        if not 1 <= lid <= UNICAST_LID_MAX or lid % (1 << port.lmc):
            raise FabricError(f"LID {lid} is not a unicast LID aligned to LMC {port.lmc}")
        for value in range(lid, lid + (1 << port.lmc)):
            owner = self._by_lid.get(value)
            if owner is not None and owner is not port:
                raise FabricError(f"LID {value} is already used by {owner.name}")
        if not port.lid:
            raise FabricError(f"{port.name} has no link; it cannot get a LID")
        self._unindex_lids(port)
        port.lid = lid
        self._index(port)

    # -- what a node sees -----------------------------------------------------------------

    @property
    def sm_lid(self) -> int:
        endpoint = self._by_guid.get(self.sm_guid)
        return endpoint.lid if endpoint is not None else 0

    def port_attributes(self, port: PortRuntime) -> PortAttributes:
        active = port.active
        return PortAttributes(
            port_num=port.num,
            state=port.state,
            lid=port.lid,
            lmc=port.lmc,
            sm_lid=self.sm_lid if active else 0,
            sm_sl=self.topology.sm_sl,
            subnet_timeout=self.topology.subnet_timeout,
            active_mtu=port.mtu,
            active_width=port.width,
            active_speed=port.speed,
            gids=(port.gid0,),
            pkeys=port.pkeys,
        )

    def node(self, name: str) -> NodeInfo:
        host = self.host(name)
        by_port: dict[int, tuple[str, list[str], list[str]]] = {}
        for ifname, port in host.interfaces.items():
            by_port[port.guid] = (ifname, [], [])
        for address in host.addresses:
            entry = by_port.get(host.interfaces[address.ifname].guid)
            if entry is not None:
                (entry[1] if address.address.version == 4 else entry[2]).append(
                    f"{address.address}/{address.prefixlen}"
                )
        ports = []
        for device in host.devices:
            for p in device.ports:
                ifname, v4, v6 = by_port.get(p.guid, ("", [], []))
                ports.append(
                    PortInfo(
                        device.name,
                        p.num,
                        p.guid,
                        p.lid,
                        p.lmc,
                        p.gid0,
                        p.state,
                        p.pkeys,
                        ifname,
                        tuple(v4),
                        tuple(v6),
                    )
                )
        return NodeInfo(name, tuple(d.name for d in host.devices), tuple(ports))

    # -- IP addresses ---------------------------------------------------------------------

    def add_address(self, node: str, ifname: str, address: str) -> InterfaceAddress:
        """Configure ``address`` (``10.1.2.3/16``) on an IPoIB interface; sends an IpEvent."""
        host = self.host(node)
        port = host.interfaces.get(ifname)
        if port is None:
            raise FabricError(f"node {node} has no IPoIB interface {ifname!r}")
        try:
            iface = ipaddress.ip_interface(address)
        except ValueError as exc:
            raise FabricError(f"bad address {address!r}: {exc}") from exc
        for other in self._hosts.values():
            if any(a.address == iface.ip for a in other.addresses):
                raise FabricError(f"address {iface.ip} is already configured on {other.name}")
        entry = _interface_address(ifname, port, iface)
        host.addresses.append(entry)
        for sink in list(host.ip_sinks):
            sink.deliver_ip(IpEvent(True, entry))
        return entry

    def remove_address(self, node: str, address: str) -> InterfaceAddress:
        host = self.host(node)
        try:
            ip = ipaddress.ip_interface(address).ip
        except ValueError as exc:
            raise FabricError(f"bad address {address!r}: {exc}") from exc
        for entry in host.addresses:
            if entry.address == ip:
                host.addresses.remove(entry)
                for sink in list(host.ip_sinks):
                    sink.deliver_ip(IpEvent(False, entry))
                return entry
        raise FabricError(f"node {node} has no address {ip}")


def _interface_address(
    ifname: str, port: PortRuntime, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface
) -> InterfaceAddress:
    return InterfaceAddress(
        ifname, iface.ip, iface.network.prefixlen, port.gid0, port.pkeys[0] | 0x8000
    )

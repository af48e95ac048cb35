"""The whole simulated fabric in one object: ports, QPs, the SM/SA, delivery, faults, counters.

``SimWorld`` carries real MAD bytes between simulated ports. Unicast goes by DLID to the QP
number given; multicast goes to every QP attached to the MGID/MLID on ports that joined the
group through the SA, the sender's own QP included (IB loopback). Receivers check the Q_Key
and the partition; a full receive queue drops the MAD (like an RNR drop). SA MADs queue in
front of a single SA server with a service time; a queue longer than ``faults.sa_queue_limit``
is answered BUSY. When a port goes down or up the SM reports trap 65 or 64 (GID out of / in
service) to every subscriber and sends each Report again every ``REPORT_TIMEOUT`` until it is
acknowledged, at most ``REPORT_RETRIES`` more times (OpenSM's transaction timeout and retries).
Every transmission takes hops x ``link_latency`` plus ``faults.delay`` and may
be lost, duplicated or corrupted (``world.faults``). Every MAD put on the wire is counted in
``world.counters`` by (class, method, attribute); what happened to them is in ``world.stats``.

All timing uses trio's clock; ``await nursery.start(world.run)`` starts the delivery and SA
tasks. ``world.fabric(node)`` gives the in-process ``Fabric`` of one node; ``hub.py`` serves
the same world to daemons in other processes.
"""

from __future__ import annotations

import ipaddress
import itertools
import random
import sys
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from ibacm.config.route_file import RoutePath, RouteSection, render_route_file
from ibacm.fabric.api import (
    ACM_QKEY,
    MAD_SIZE,
    MULTICAST_QPN,
    AddressVector,
    FabricError,
    InterfaceAddress,
    IpEvent,
    PortAttributes,
    PortDownError,
    PortEvent,
    PortEventType,
    PortState,
    ReceivedMad,
    SaDestination,
    SaSendError,
)
from ibacm.fabric.sim.faults import FaultInjector, Faults
from ibacm.fabric.sim.multicast import JOIN_FULL, JOIN_NON_MEMBER, MLID_FIRST, MLID_LAST
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.sa import SubnetAdministrator, pkey_shared
from ibacm.fabric.sim.scheduler import DeliveryScheduler
from ibacm.fabric.sim.topo_file.model import UNICAST_LID_MAX, Host, Topology, gid_of
from ibacm.wire.notice import Trap

if TYPE_CHECKING:  # the in-process fabric imports this module
    from ibacm.fabric.sim.fabric import SimFabric

GSI_QPN = 1
REPORT_TIMEOUT = 0.2
REPORT_RETRIES = 3
_RECEIVING = JOIN_FULL | JOIN_NON_MEMBER
_FIRST_QPN = 0x100
_MAX_QPN = 0xFFFFFF


class QpSink(Protocol):
    def deliver(self, received: ReceivedMad) -> bool:
        """Queue a received MAD; False when the receive queue is full (the MAD is dropped)."""
        ...


class EventSink(Protocol):
    def deliver_event(self, event: PortEvent) -> None: ...


class IpSink(Protocol):
    def deliver_ip(self, event: IpEvent) -> None: ...


# -- runtime state ------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class SwitchEndpoint:
    """A switch's management port (port 0): it has a LID and can host the SM."""

    name: str
    guid: int
    lid: int
    lmc: int
    mtu_cap: int
    rate: int
    pkeys: tuple[int, ...] = (0xFFFF,)
    description: str = ""

    @property
    def active(self) -> bool:
        return True


@dataclass(eq=False, slots=True)
class PortRuntime:
    """One HCA port as it is now (state and LID change at run time)."""

    device: DeviceRuntime
    num: int
    guid: int
    lid: int
    lmc: int
    state: PortState
    pkeys: tuple[int, ...]
    mtu_cap: int
    mtu: int
    width: int
    speed: int
    rate: int
    gid0: bytes
    switch: int | None = None
    """GUID of the switch the port is cabled to (None: no cable or HCA-to-HCA)."""
    qps: dict[int, WorldQp] = field(default_factory=dict)
    agents: dict[int, Callable[[bytes], None]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.state == PortState.ACTIVE

    @property
    def name(self) -> str:
        return f"{self.device.host.name}/{self.device.name}/{self.num}"


@dataclass(eq=False, slots=True)
class DeviceRuntime:
    host: HostRuntime
    name: str
    node_guid: int
    description: str
    ports: list[PortRuntime] = field(default_factory=list)
    event_sinks: list[EventSink] = field(default_factory=list)
    next_qpn: int = _FIRST_QPN

    def port(self, num: int) -> PortRuntime:
        for port in self.ports:
            if port.num == num:
                return port
        raise FabricError(f"{self.host.name}/{self.name} has no port {num}")


@dataclass(eq=False, slots=True)
class HostRuntime:
    name: str
    devices: list[DeviceRuntime] = field(default_factory=list)
    addresses: list[InterfaceAddress] = field(default_factory=list)
    ip_sinks: list[IpSink] = field(default_factory=list)
    interfaces: dict[str, PortRuntime] = field(default_factory=dict)

    def device(self, name: str) -> DeviceRuntime:
        for device in self.devices:
            if device.name == name:
                return device
        raise FabricError(f"host {self.name} has no device {name!r}")


@dataclass(eq=False, slots=True)
class WorldQp:
    """The fabric's view of one UD QP."""

    qpn: int
    port: PortRuntime
    pkey_index: int
    qkey: int
    sink: QpSink
    attachments: set[tuple[bytes, int]] = field(default_factory=set)
    closed: bool = False
    pkey: int = 0
    pkey_base: int = 0
    """Partition (low 15 bits), precomputed for the delivery hot path."""
    pkey_full: bool = False

    def __post_init__(self) -> None:
        self.pkey = self.port.pkeys[self.pkey_index]
        self.pkey_base = self.pkey & 0x7FFF
        self.pkey_full = bool(self.pkey & 0x8000)


# -- snapshots for callers ----------------------------------------------------------------


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


def mad_key(mad: bytes) -> tuple[int, int, int]:
    """(management class, method, attribute ID) of a MAD; ACM MADs have no attribute (0)."""
    mgmt_class = mad[1] if len(mad) > 1 else 0
    method = mad[3] if len(mad) > 3 else 0
    attr = 0 if mgmt_class == 0x2C or len(mad) < 18 else int.from_bytes(mad[16:18], "big")
    return mgmt_class, method, attr


class SimWorld:
    """See the module docstring."""

    def __init__(
        self,
        topology: Topology,
        *,
        sa_service_time: float = 0.0002,
        link_latency: float = 1e-6,
        seed: int = 0,
    ) -> None:
        topology.validate()
        if link_latency < 0:
            raise ValueError(f"link_latency must be >= 0, got {link_latency}")
        self.topology = topology
        self.router = Router(topology)
        self.link_latency = link_latency
        self.faults = Faults(sa_service_time=sa_service_time)
        self._inject = FaultInjector(self.faults, random.Random(seed))
        self.counters: Counter[tuple[int, int, int]] = Counter()
        self.stats: Counter[str] = Counter()
        self.sm_guid = topology.sm_guid
        self._scheduler = DeliveryScheduler()
        self._hosts: dict[str, HostRuntime] = {}
        self._by_lid: dict[int, PortRuntime | SwitchEndpoint] = {}
        self._by_guid: dict[int, PortRuntime | SwitchEndpoint] = {}
        self._attached: dict[int, dict[WorldQp, bytes]] = {}
        self._endpoint_list: list[PortRuntime | SwitchEndpoint] | None = None
        self._agent_ids = itertools.count(1)
        self._sa_queue: deque[tuple[PortRuntime | SwitchEndpoint, bytes]] = deque()
        self._sa_wakeup = trio.Event()
        self._running = False
        self._build()
        self.sa = SubnetAdministrator(self)
        self.sa.create_ipoib_groups(p for _h, _d, port in topology.hca_ports() for p in port.pkeys)

    def _build(self) -> None:
        topo = self.topology
        for switch in topo.switches:
            port0 = self.router.path(switch.guid, switch.guid)
            endpoint = SwitchEndpoint(
                switch.name,
                switch.guid,
                switch.lid,
                switch.lmc,
                switch.mtu,
                port0.rate if port0 else 0,
                description=switch.description,
            )
            self._index(endpoint)
        for host in topo.hosts:
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
                        runtime.addresses.append(self._interface_address(spec.ifname, port, iface))
            runtime.devices.append(device)
        return runtime

    @staticmethod
    def _interface_address(
        ifname: str, port: PortRuntime, iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface
    ) -> InterfaceAddress:
        return InterfaceAddress(
            ifname, iface.ip, iface.network.prefixlen, port.gid0, port.pkeys[0] | 0x8000
        )

    def _index(self, endpoint: PortRuntime | SwitchEndpoint) -> None:
        self._by_guid[endpoint.guid] = endpoint
        if endpoint.lid:
            for lid in range(endpoint.lid, endpoint.lid + (1 << endpoint.lmc)):
                self._by_lid[lid] = endpoint
        self._endpoint_list = None

    def _unindex_lids(self, endpoint: PortRuntime | SwitchEndpoint) -> None:
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

    def endpoint_by_lid(self, lid: int) -> PortRuntime | SwitchEndpoint | None:
        endpoint = self._by_lid.get(lid)
        return endpoint if endpoint is not None and endpoint.active else None

    def endpoint_by_guid(self, guid: int) -> PortRuntime | SwitchEndpoint | None:
        endpoint = self._by_guid.get(guid)
        return endpoint if endpoint is not None and endpoint.active and endpoint.lid else None

    def endpoints(self) -> Sequence[PortRuntime | SwitchEndpoint]:
        if self._endpoint_list is None:
            active = {e for e in self._by_lid.values() if e.active}
            self._endpoint_list = sorted(active, key=lambda e: e.lid)
        return self._endpoint_list

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run delivery and the SA until cancelled: ``await nursery.start(world.run)``."""
        if self._running:
            raise RuntimeError("this SimWorld is already running")
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._scheduler.run)
                nursery.start_soon(self._sa_server)
                self._running = True
                task_status.started()
        finally:
            self._running = False

    @property
    def running(self) -> bool:
        return self._running

    def _require_running(self) -> None:
        if not self._running:
            raise FabricError("the simulated fabric is not running (start it with world.run)")

    def fabric(self, node_name: str) -> SimFabric:
        """The in-process Fabric of one node."""
        from ibacm.fabric.sim.fabric import SimFabric

        return SimFabric(self, self.host(node_name))

    # -- lookups --------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        return list(self._hosts)

    def host(self, name: str) -> HostRuntime:
        try:
            return self._hosts[name]
        except KeyError:
            raise FabricError(f"no node named {name!r} in the simulated fabric") from None

    def port(self, node: str, device: str, port: int) -> PortRuntime:
        return self.host(node).device(device).port(port)

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

    # -- counting -------------------------------------------------------------------------

    def _count(self, mad: bytes) -> None:
        self.counters[mad_key(mad)] += 1

    def count(
        self, mgmt_class: int | None = None, method: int | None = None, attr: int | None = None
    ) -> int:
        """MADs sent on the fabric matching every given criterion (None = any)."""
        return sum(
            n
            for (c, m, a), n in self.counters.items()
            if (mgmt_class is None or c == mgmt_class)
            and (method is None or m == method)
            and (attr is None or a == attr)
        )

    def _latency(self, hops: int) -> float:
        return hops * self.link_latency + self.faults.delay

    def _send_copies(self, mad: bytes, delay: float, deliver: Callable[[bytes], None]) -> None:
        copies, outcome = self._inject.copies(mad)
        if outcome is not None:
            self.stats[outcome] += 1
        for copy in copies:
            self._scheduler.call_later(delay, deliver, copy)

    # -- UD QPs ---------------------------------------------------------------------------

    def create_qp(
        self, port: PortRuntime, pkey_index: int, sink: QpSink, *, qkey: int = ACM_QKEY
    ) -> WorldQp:
        if not 0 <= pkey_index < len(port.pkeys):
            raise FabricError(
                f"{port.name}: P_Key index {pkey_index} outside the {len(port.pkeys)}-entry table"
            )
        if not 0 <= qkey <= 0xFFFFFFFF:
            raise FabricError(f"Q_Key {qkey:#x} does not fit 32 bits")
        device = port.device
        if device.next_qpn > _MAX_QPN:
            raise FabricError(f"{device.name}: out of QP numbers")
        qp = WorldQp(device.next_qpn, port, pkey_index, qkey, sink)
        device.next_qpn += 1
        port.qps[qp.qpn] = qp
        return qp

    def rebind_qp(self, qp: WorldQp, port: PortRuntime, pkey_index: int, qkey: int) -> None:
        """A verbs QP's RESET->INIT: it gets its port, P_Key index and Q_Key, keeping its QPN.

        Verbs hands out the QPN at creation, before the port is known (QPNs are per device, so
        a move between ports of one device cannot collide)."""
        if qp.closed:
            raise FabricError("modify of a destroyed QP")
        if port.device is not qp.port.device:
            raise FabricError(f"QP {qp.qpn:#x} cannot move to another device")
        if qp.attachments:
            raise FabricError(f"QP {qp.qpn:#x} is attached to multicast groups")
        if not 0 <= pkey_index < len(port.pkeys):
            raise FabricError(
                f"{port.name}: P_Key index {pkey_index} outside the {len(port.pkeys)}-entry table"
            )
        if not 0 <= qkey <= 0xFFFFFFFF:
            raise FabricError(f"Q_Key {qkey:#x} does not fit 32 bits")
        qp.port.qps.pop(qp.qpn, None)
        qp.port, qp.pkey_index, qp.qkey = port, pkey_index, qkey
        qp.__post_init__()
        port.qps[qp.qpn] = qp

    def destroy_qp(self, qp: WorldQp) -> None:
        if qp.closed:
            return
        qp.closed = True
        for mgid, mlid in list(qp.attachments):
            self.detach(qp, mgid, mlid)
        qp.port.qps.pop(qp.qpn, None)

    def attach(self, qp: WorldQp, mgid: bytes, mlid: int) -> None:
        _check_mcast(mgid, mlid)
        if qp.closed:
            raise FabricError("attach on a destroyed QP")
        qp.attachments.add((bytes(mgid), mlid))
        self._attached.setdefault(mlid, {})[qp] = bytes(mgid)

    def detach(self, qp: WorldQp, mgid: bytes, mlid: int) -> None:
        _check_mcast(mgid, mlid)
        if (bytes(mgid), mlid) not in qp.attachments:
            raise FabricError(f"QP {qp.qpn:#x} is not attached to that MGID/MLID {mlid:#x}")
        qp.attachments.discard((bytes(mgid), mlid))
        attached = self._attached.get(mlid)
        if attached is not None:
            attached.pop(qp, None)
            if not attached:
                del self._attached[mlid]

    def ud_send(self, qp: WorldQp, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        """Post one MAD from ``qp``; errors are raised at once (the send completion)."""
        self._require_running()
        if qp.closed:
            raise FabricError(f"send on destroyed QP {qp.qpn:#x}")
        port = qp.port
        if not port.active:
            raise PortDownError(f"{port.name} is {port.state.name}")
        if len(mad) != MAD_SIZE:
            raise FabricError(f"a UD MAD must be {MAD_SIZE} bytes, got {len(mad)}")
        if not 0 <= av.sgid_index < 1:
            raise FabricError(f"{port.name}: GID index {av.sgid_index} is not in the GID table")
        if not 0 <= remote_qpn <= _MAX_QPN:
            raise FabricError(f"remote QPN {remote_qpn:#x} does not fit 24 bits")
        mad = bytes(mad)
        self._count(mad)
        slid = port.lid | (av.src_path_bits & ((1 << port.lmc) - 1))
        if remote_qpn == MULTICAST_QPN:
            self._multicast(qp, mad, av, slid)
        else:
            self._unicast(qp, mad, av, slid, remote_qpn)

    def _multicast(self, qp: WorldQp, mad: bytes, av: AddressVector, slid: int) -> None:
        if not MLID_FIRST <= av.dlid <= MLID_LAST:
            raise FabricError(f"multicast send needs a multicast DLID, got {av.dlid:#x}")
        group = self.sa.groups.by_mlid.get(av.dlid)
        dgid = av.dgid
        if group is None or group.mgid != dgid:
            self.stats["mcast_no_group"] += 1
            return
        attached = self._attached.get(av.dlid)
        if not attached:
            return
        # The hot path of a multicast storm: plain lookups, one batch per hop count.
        sender = qp.port
        members = group.members
        table = self.router.switch_distances(sender.switch) if sender.switch else None
        s_qkey, s_base, s_full = qp.qkey, qp.pkey_base, qp.pkey_full
        sgid, src_qpn = sender.gid0, qp.qpn
        batches: dict[int, list[tuple[WorldQp, ReceivedMad]]] = {}
        shared: dict[int, ReceivedMad] = {}
        qkey_drops = pkey_drops = 0
        for receiver, mgid in attached.items():
            rport = receiver.port
            member = members.get(rport.guid)
            if mgid != dgid or member is None or not member.join_state & _RECEIVING:
                continue  # the switches do not forward the group to this port
            if receiver.qkey != s_qkey:
                qkey_drops += 1
                continue
            if receiver.pkey_base != s_base or not (s_full or receiver.pkey_full):
                pkey_drops += 1
                continue
            if rport is sender:
                hops = 0
            elif table is not None and rport.switch is not None:
                entry = table.get(rport.switch)
                if entry is None:
                    continue
                hops = entry[0] + 2
            else:
                path = self.router.path(sender.guid, rport.guid)
                if path is None:
                    continue
                hops = path.hops
            received = shared.get(receiver.pkey_index)
            if received is None:  # one immutable record per P_Key index, shared by receivers
                received = ReceivedMad(mad, sgid, dgid, slid, src_qpn, 0, receiver.pkey_index)
                shared[receiver.pkey_index] = received
            batches.setdefault(hops, []).append((receiver, received))
        if qkey_drops:
            self.stats["qkey_drop"] += qkey_drops
        if pkey_drops:
            self.stats["pkey_drop"] += pkey_drops
        for hops, items in batches.items():
            self._dispatch_ud(items, self._latency(hops))

    def _unicast(
        self, qp: WorldQp, mad: bytes, av: AddressVector, slid: int, remote_qpn: int
    ) -> None:
        target = self._by_lid.get(av.dlid)
        if not isinstance(target, PortRuntime):
            self.stats["no_route"] += 1
            return
        receiver = target.qps.get(remote_qpn)
        if receiver is None:
            # QP1 (GSI) has no agent for class 0x2C, other numbers no QP: the HCA drops it.
            self.stats["gsi_drop" if remote_qpn == GSI_QPN else "no_qp"] += 1
            return
        if receiver.qkey != qp.qkey:
            self.stats["qkey_drop"] += 1
            return
        if not pkey_shared(qp.pkey, receiver.pkey):
            self.stats["pkey_drop"] += 1
            return
        path = self.router.path(qp.port.guid, target.guid)
        if path is None:
            self.stats["no_route"] += 1
            return
        bits = av.dlid & ((1 << target.lmc) - 1)
        received = ReceivedMad(mad, qp.port.gid0, av.dgid, slid, qp.qpn, bits, receiver.pkey_index)
        self._dispatch_ud([(receiver, received)], self._latency(path.hops))

    def _dispatch_ud(self, items: list[tuple[WorldQp, ReceivedMad]], delay: float) -> None:
        if self.faults.alters_transmissions:
            fated: list[tuple[WorldQp, ReceivedMad]] = []
            for receiver, received in items:
                copies, outcome = self._inject.copies(received.mad)
                if outcome is not None:
                    self.stats[outcome] += 1
                for copy in copies:
                    fated.append(
                        (
                            receiver,
                            received if copy is received.mad else replace(received, mad=copy),
                        )
                    )
            items = fated
        if items:
            self._scheduler.call_later(delay, self._deliver_batch, items)

    def _deliver_batch(self, items: list[tuple[WorldQp, ReceivedMad]]) -> None:
        delivered = 0
        stats = self.stats
        for receiver, received in items:
            if receiver.closed:
                stats["closed_qp_drop"] += 1
            elif receiver.port.state != PortState.ACTIVE:
                stats["port_down_drop"] += 1
            elif receiver.sink.deliver(received):
                delivered += 1
            else:
                stats["rnr_drop"] += 1
        stats["delivered"] += delivered

    # -- SA -------------------------------------------------------------------------------

    def register_agent(self, port: PortRuntime, deliver: Callable[[bytes], None]) -> int:
        agent_id = next(self._agent_ids) & 0xFFFFFFFF
        port.agents[agent_id] = deliver
        return agent_id

    def unregister_agent(self, port: PortRuntime, agent_id: int) -> None:
        port.agents.pop(agent_id, None)

    def sa_transmit(self, port: PortRuntime, mad: bytes, dest: SaDestination) -> None:
        """Put one SA MAD on the wire from ``port`` to ``dest.sm_lid`` (QP1)."""
        self._require_running()
        if not port.active:
            raise SaSendError(f"{port.name} is {port.state.name}: cannot send SA MADs")
        if len(mad) != MAD_SIZE:
            raise SaSendError(f"an SA MAD must be {MAD_SIZE} bytes, got {len(mad)}")
        if not 0 <= dest.pkey_index < len(port.pkeys):
            raise SaSendError(f"{port.name}: P_Key index {dest.pkey_index} is not in the table")
        mad = bytes(mad)
        self._count(mad)
        target = self._by_lid.get(dest.sm_lid)
        path = self.router.path(port.guid, target.guid) if target is not None else None
        if target is None or path is None:
            self.stats["sa_unreachable"] += 1
            return
        self._send_copies(mad, self._latency(path.hops), partial(self._sa_arrives, port, target))

    def _sa_arrives(
        self, port: PortRuntime, target: PortRuntime | SwitchEndpoint, mad: bytes
    ) -> None:
        if target.guid != self.sm_guid or not target.active:
            self.stats["sa_not_sm"] += 1  # no SA behind that LID: the MAD is dropped
            return
        if self.faults.sa_down:
            self.stats["sa_down"] += 1
            return
        if len(self._sa_queue) >= self.faults.sa_queue_limit:
            self.stats["sa_overload"] += 1
            self._sa_reply(port, self.sa.busy(mad))
            return
        self._sa_queue.append((port, mad))
        self._sa_wakeup.set()

    async def _sa_server(self) -> None:
        while True:
            if not self._sa_queue:
                self._sa_wakeup = trio.Event()
                await self._sa_wakeup.wait()
                continue
            # The request being served still counts as queued (for the overload bound).
            await trio.sleep(self.faults.sa_service_time)
            requester, mad = self._sa_queue.popleft()
            self.stats["sa_served"] += 1
            if self._inject.busy():
                self.stats["sa_busy"] += 1
                self._sa_reply(requester, self.sa.busy(mad))
                continue
            try:
                answers = self.sa.handle(requester, mad)
            except Exception:  # an SA bug must cost one answer, not the whole fabric
                self.stats["sa_internal_error"] += 1
                traceback.print_exc(file=sys.stderr)
                continue
            self._sa_reply(requester, answers)

    @property
    def sa_queue_length(self) -> int:
        return len(self._sa_queue)

    def _sa_reply(self, requester: PortRuntime | SwitchEndpoint, responses: list[bytes]) -> None:
        if not isinstance(requester, PortRuntime):
            return
        path = self.router.path(self.sm_guid, requester.guid)
        if path is None:
            return
        delay = self._latency(path.hops)
        for response in responses:
            self._count(response)
        faults = self.faults
        if faults.loss or faults.duplicate or faults.corrupt:
            arrive = partial(self._sa_response_arrives, requester)
            for response in responses:
                self._send_copies(response, delay, arrive)
        else:
            # Every copy arrives: the segments of one answer travel as one batch, which is
            # the same order and time as one delivery each (hundreds per GetTable at scale).
            self._scheduler.call_later(delay, self._sa_responses_arrive, requester, responses)

    def _sa_responses_arrive(self, port: PortRuntime, mads: list[bytes]) -> None:
        for mad in mads:
            self._sa_response_arrives(port, mad)

    def _sa_response_arrives(self, port: PortRuntime, mad: bytes) -> None:
        if not port.active:
            self.stats["port_down_drop"] += 1
            return
        deliver = port.agents.get(int.from_bytes(mad[8:12], "big"))
        if deliver is None:
            self.stats["sa_no_agent"] += 1
            return
        deliver(mad)

    # -- SM reports -----------------------------------------------------------------------

    def _report(self, trap: Trap, subject: PortRuntime) -> None:
        """Trap ``trap`` about ``subject`` to every subscriber (computed while ``subject``
        still counts as in the subnet, so partitions and LID ranges apply to it)."""
        issuer = self._by_guid.get(self.sm_guid)
        if issuer is None:
            return
        for subscriber, mad in self.sa.reports(trap, subject.guid, issuer):
            self.stats[f"report_trap_{int(trap)}"] += 1
            self._send_report(subscriber, mad, 0)

    def _send_report(self, subscriber: int, mad: bytes, resent: int) -> None:
        tid = int.from_bytes(mad[12:16], "big")
        pending = self.sa.unacked.get(tid)
        if pending is None:
            return  # acknowledged (or the subscriber left the subnet)
        if resent > REPORT_RETRIES:
            del self.sa.unacked[tid]
            self.stats["report_unacked"] += 1
            return
        if resent:
            self.stats["report_resent"] += 1
        self._scheduler.call_later(REPORT_TIMEOUT, self._send_report, subscriber, mad, resent + 1)
        port = self._by_guid.get(subscriber)
        if not isinstance(port, PortRuntime) or not port.active:
            return
        path = self.router.path(self.sm_guid, port.guid)
        if path is None:
            return
        self._count(mad)
        self._send_copies(mad, self._latency(path.hops), partial(self._report_arrives, port))

    def _report_arrives(self, port: PortRuntime, mad: bytes) -> None:
        # As the kernel does with an agent registered for the Report method: every client
        # of the port that registered for SA class MADs gets it.
        if not port.active:
            self.stats["port_down_drop"] += 1
            return
        if not port.agents:
            self.stats["sa_no_agent"] += 1
            return
        for deliver in list(port.agents.values()):
            deliver(mad)

    # -- events ---------------------------------------------------------------------------

    def subscribe_events(self, device: DeviceRuntime, sink: EventSink) -> None:
        device.event_sinks.append(sink)

    def unsubscribe_events(self, device: DeviceRuntime, sink: EventSink) -> None:
        if sink in device.event_sinks:
            device.event_sinks.remove(sink)

    def subscribe_ip(self, host: HostRuntime, sink: IpSink) -> None:
        host.ip_sinks.append(sink)

    def unsubscribe_ip(self, host: HostRuntime, sink: IpSink) -> None:
        if sink in host.ip_sinks:
            host.ip_sinks.remove(sink)

    def _emit(self, port: PortRuntime, kind: PortEventType) -> None:
        event = PortEvent(port.num, kind)
        self.stats[f"event_{kind.value}"] += 1
        for sink in list(port.device.event_sinks):
            sink.deliver_event(event)

    def _all_ports(self, node: str | None = None) -> Iterable[PortRuntime]:
        hosts = [self.host(node)] if node is not None else list(self._hosts.values())
        for host in hosts:
            for device in host.devices:
                yield from device.ports

    def set_port_state(self, node: str, device: str, port: int, active: bool) -> None:
        """Take a port down (PORT_ERR; the SM forgets its memberships) or up (PORT_ACTIVE)."""
        runtime = self.port(node, device, port)
        if self.router.link(runtime.guid) is None or not runtime.lid:
            raise FabricError(f"{runtime.name} has no link; it cannot change state")
        if active == runtime.active:
            return
        if active:
            runtime.state = PortState.ACTIVE
            self._endpoint_list = None
            self._emit(runtime, PortEventType.PORT_ACTIVE)
            self._report(Trap.GID_IN_SERVICE, runtime)
        else:
            self._report(Trap.GID_OUT_OF_SERVICE, runtime)
            runtime.state = PortState.DOWN
            self._endpoint_list = None
            self.sa.groups.remove_port(runtime.guid)
            self.sa.forget_port(runtime.guid)
            self._emit(runtime, PortEventType.PORT_ERR)

    async def port_flap(
        self, node: str, device: str, port: int, down_for: float, *, reregister: bool = True
    ) -> None:
        """Port down for ``down_for`` seconds, then up; OpenSM then asks it to re-register."""
        if down_for < 0:
            raise ValueError(f"down_for must be >= 0, got {down_for}")
        self.set_port_state(node, device, port, False)
        await trio.sleep(down_for)
        self.set_port_state(node, device, port, True)
        if reregister:
            self._emit(self.port(node, device, port), PortEventType.CLIENT_REREGISTER)

    def set_lid(self, node: str, device: str, port: int, lid: int) -> None:
        """Give a port a new LID (LID_CHANGE); moving the SM's LID also tells everyone."""
        runtime = self.port(node, device, port)
        if not 1 <= lid <= UNICAST_LID_MAX or lid % (1 << runtime.lmc):
            raise FabricError(f"LID {lid} is not a unicast LID aligned to LMC {runtime.lmc}")
        for value in range(lid, lid + (1 << runtime.lmc)):
            owner = self._by_lid.get(value)
            if owner is not None and owner is not runtime:
                raise FabricError(f"LID {value} is already used by {owner.name}")
        if not runtime.lid:
            raise FabricError(f"{runtime.name} has no link; it cannot get a LID")
        self._unindex_lids(runtime)
        runtime.lid = lid
        self._index(runtime)
        if runtime.active:
            self._emit(runtime, PortEventType.LID_CHANGE)
        if runtime.guid == self.sm_guid:
            self._announce_sm(reregister=True)

    def move_sm(self, node: str, *, reregister: bool = True) -> None:
        """The master SM moves behind ``node`` (a host's first active port, or a switch).

        The new SM starts with no multicast groups but the IPoIB broadcast groups; every
        active port gets SM_CHANGE, then CLIENT_REREGISTER (what OpenSM sends when the master
        SM LID changes) unless ``reregister`` is False.
        """
        guid = self._sm_guid_for(node)
        if guid == self.sm_guid:
            return
        self.sm_guid = guid
        self.sa.groups.clear()
        self.sa.forget_subscriptions()
        self._announce_sm(reregister=reregister)

    def _sm_guid_for(self, node: str) -> int:
        for endpoint in self._by_guid.values():
            if isinstance(endpoint, SwitchEndpoint) and endpoint.name == node:
                return endpoint.guid
        for port in self._all_ports(node):
            if port.active:
                return port.guid
        raise FabricError(f"node {node!r} has no active port to run the SM")

    def _announce_sm(self, *, reregister: bool) -> None:
        ports = [p for p in self._all_ports() if p.active]
        for port in ports:
            self._emit(port, PortEventType.SM_CHANGE)
        if reregister:
            for port in ports:
                self._emit(port, PortEventType.CLIENT_REREGISTER)

    def client_reregister(self, node: str | None = None) -> None:
        """CLIENT_REREGISTER on every active port of ``node`` (default: every node)."""
        for port in self._all_ports(node):
            if port.active:
                self._emit(port, PortEventType.CLIENT_REREGISTER)

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
        entry = self._interface_address(ifname, port, iface)
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

    # -- files for the daemon -------------------------------------------------------------

    def route_dump(self) -> str:
        """An OpenSM ``dump_pr`` "full" file of the fabric (``route_preload opensm_full_v1``)."""
        endpoints = self.endpoints()
        sections = []
        for src in endpoints:
            paths = []
            unreachable = []
            for dst in endpoints:
                info = self.router.path(src.guid, dst.guid)
                if info is None:
                    unreachable.append(dst.lid)
                else:
                    paths.append(RoutePath(dst.lid, 0, info.mtu, info.rate))
            if isinstance(src, SwitchEndpoint):
                kind, description, port_num = "Switch", src.description, 0
            else:
                kind, description, port_num = "Channel Adapter", src.device.description, src.num
            sections.append(
                RouteSection(
                    kind, src.guid, src.lid, description, port_num, paths, tuple(unreachable)
                )
            )
        return render_route_file(sections)

    def hosts_file(self) -> str:
        """An ``ibacm_hosts.data`` (acm_hosts) file: every node name and address -> port GID."""
        lines = ["# ibacm_hosts.data generated from the simulated fabric"]
        for host in self._hosts.values():
            first = next((p for d in host.devices for p in d.ports if p.lid), None)
            if first is not None:
                lines.append(f"{host.name} {ipaddress.IPv6Address(first.gid0)}")
            for entry in host.addresses:
                lines.append(f"{entry.address} {ipaddress.IPv6Address(entry.gid)}")
        return "\n".join(lines) + "\n"


def _check_mcast(mgid: bytes, mlid: int) -> None:
    if len(mgid) != 16 or mgid[0] != 0xFF:
        raise FabricError("an MGID is 16 bytes starting with 0xff")
    if not MLID_FIRST <= mlid <= MLID_LAST:
        raise FabricError(f"MLID {mlid:#x} is outside {MLID_FIRST:#x}..{MLID_LAST:#x}")


__all__ = ["NodeInfo", "PortInfo", "SimWorld", "mad_key"]

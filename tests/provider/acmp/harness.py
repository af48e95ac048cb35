"""A small in-test core that drives ``AcmpProvider`` over a ``SimWorld``, without sockets.

It does what the daemon core does for a provider (behavior.md §3): open devices and ACTIVE
ports, one endpoint per partition, the node's IPoIB addresses plus its host name as
addresses, port events (PORT_ERR closes a port and cancels its nursery, PORT_ACTIVE and
LID/GID/P_Key changes reopen it, CLIENT_REREGISTER and SM_CHANGE are forwarded), and it hands
the provider SA transport with per-port credits, a TID counter and global counters.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from ibacm.config.options import Options
from ibacm.core.sa import SaChannel
from ibacm.core.services import DaemonServices
from ibacm.fabric.api import Device, PortEventType
from ibacm.fabric.sim.fabric import SimFabric
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.acmp.endpoint import AcmpEndpoint, AcmpPort
from ibacm.provider.acmp.provider import AcmpProvider
from ibacm.provider.api import (
    CoreAddress,
    CoreDevice,
    CoreEndpoint,
    CorePort,
    Counters,
    ResolveRequest,
    ResolveResult,
)
from ibacm.wire.client import AddrType, EpAddr, EpFlag
from ibacm.wire.path_record import PathRecord


class TestCore(DaemonServices):
    """The daemon's CoreServices for one node, its published events kept in ``events``."""

    __test__ = False

    def __init__(self, options: Options) -> None:
        super().__init__(options, Counters(), None)
        self.events: list[tuple[str, dict[str, Any]]] = []

    def publish(self, kind: str, data: Mapping[str, Any]) -> None:
        self.events.append((kind, dict(data)))

    def wants(self, kind: str) -> bool:
        return True  # every event is kept


@dataclass(eq=False)
class OpenPort:
    core_port: CorePort
    ctx: object
    scope: trio.CancelScope
    endpoints: list[tuple[CoreEndpoint, object]] = field(default_factory=list)
    addresses: list[tuple[CoreAddress, object]] = field(default_factory=list)


class Node:
    """One node's daemon, reduced to its provider and a resolve call."""

    def __init__(self, world: SimWorld, name: str, options: Options) -> None:
        self.world = world
        self.name = name
        self.core = TestCore(options)
        self.provider = AcmpProvider(self.core)
        self.fabric: SimFabric = world.fabric(name)
        self.ports: dict[tuple[str, int], OpenPort] = {}
        self.devices: list[tuple[Device, CoreDevice, object]] = []
        self._nursery: trio.Nursery | None = None

    # -- start and stop -------------------------------------------------------------------

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        await self.provider.start()
        for device in await self.fabric.open():
            core_device = CoreDevice(device, device.name, device.node_guid, device.phys_port_cnt)
            dev_ctx = await self.provider.open_device(core_device)
            self.devices.append((device, core_device, dev_ctx))
            for num in range(1, device.phys_port_cnt + 1):
                await self.port_up(device, core_device, dev_ctx, num)
            nursery.start_soon(self._events, device, core_device, dev_ctx)

    async def stop(self) -> None:
        for key in list(self.ports):
            await self.port_down(key)
        await self.provider.stop()
        await self.fabric.aclose()

    async def port_up(
        self, device: Device, core_device: CoreDevice, dev_ctx: object, num: int
    ) -> None:
        port = device.port(num)
        attrs = await port.query()
        if not attrs.active or (device.name, num) in self.ports:
            return
        assert self._nursery is not None
        scope, nursery = await self._nursery.start(_port_nursery)
        core_port = CorePort(core_device, port, num, attrs, nursery)
        self.core.sa_channels[core_port] = SaChannel(port, attrs, self.core.options.sa_depth)
        ctx = await self.provider.open_port(core_port, dev_ctx)
        opened = OpenPort(core_port, ctx, scope)
        self.ports[device.name, num] = opened
        seen: set[int] = set()
        for pkey in attrs.pkeys:
            if not pkey & 0x7FFF or pkey & 0x7FFF in seen:
                continue
            seen.add(pkey & 0x7FFF)
            endpoint = CoreEndpoint(core_port, pkey)
            ep_ctx = await self.provider.open_endpoint(endpoint, ctx)
            opened.endpoints.append((endpoint, ep_ctx))
            await self._add_addresses(opened, endpoint, ep_ctx, attrs.gids[0])

    async def _add_addresses(
        self, opened: OpenPort, endpoint: CoreEndpoint, ep_ctx: object, gid: bytes
    ) -> None:
        infos: list[tuple[AddrType, bytes, str]] = []
        for address in await self.fabric.interface_addresses():
            if address.gid != gid or (address.pkey | 0x8000) != (endpoint.pkey | 0x8000):
                continue
            kind = AddrType.IP if address.address.version == 4 else AddrType.IP6
            infos.append((kind, address.address.packed.ljust(64, b"\0"), address.display))
        if not opened.addresses:
            infos.append((AddrType.NAME, self.name.encode().ljust(64, b"\0"), self.name))
        for kind, info, display in infos:
            core_address = CoreAddress(endpoint, kind, info, display)
            endpoint.addresses.append(core_address)
            ctx = self.provider.add_address(core_address, ep_ctx)
            opened.addresses.append((core_address, ctx))

    async def port_down(self, key: tuple[str, int]) -> None:
        opened = self.ports.pop(key, None)
        if opened is None:
            return
        opened.scope.cancel()
        for _address, ctx in opened.addresses:
            self.provider.remove_address(ctx)
        for _endpoint, ep_ctx in opened.endpoints:
            await self.provider.close_endpoint(ep_ctx)
        await self.provider.close_port(opened.ctx)
        self.core.sa_channels.pop(opened.core_port, None)

    async def _events(self, device: Device, core_device: CoreDevice, dev_ctx: object) -> None:
        while True:
            try:
                event = await device.wait_event()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
            key = (device.name, event.port_num)
            if event.type is PortEventType.PORT_ERR:
                await self.port_down(key)
            elif event.type is PortEventType.PORT_ACTIVE:
                await self.port_up(device, core_device, dev_ctx, event.port_num)
            elif event.type in (
                PortEventType.LID_CHANGE,
                PortEventType.GID_CHANGE,
                PortEventType.PKEY_CHANGE,
            ):
                await self.port_down(key)
                await self.port_up(device, core_device, dev_ctx, event.port_num)
            elif key in self.ports:
                opened = self.ports[key]
                if event.type is PortEventType.SM_CHANGE:
                    attrs = await device.port(event.port_num).query()
                    opened.core_port.attrs = attrs
                    self.core.sa_channels[opened.core_port].update(attrs)
                await self.provider.handle_event(opened.ctx, event.type)

    # -- requests -------------------------------------------------------------------------

    @property
    def first_port(self) -> OpenPort:
        return next(iter(self.ports.values()))

    @property
    def endpoint_ctx(self) -> AcmpEndpoint:
        ctx = self.first_port.endpoints[0][1]
        assert isinstance(ctx, AcmpEndpoint)
        return ctx

    @property
    def port_ctx(self) -> AcmpPort:
        ctx = self.first_port.ctx
        assert isinstance(ctx, AcmpPort)
        return ctx

    def address_ctx(self, kind: int, info: bytes) -> object:
        for opened in self.ports.values():
            for address, ctx in opened.addresses:
                if address.type == kind and address.info == info:
                    return ctx
        raise LookupError(f"{self.name} has no address of type {kind}: {info.hex()}")

    async def resolve(self, source: EpAddr, dest: EpAddr, *, flags: int = 0) -> ResolveResult:
        source = EpAddr(source.flags | EpFlag.SOURCE, source.type, source.info)
        dest = EpAddr(dest.flags | EpFlag.DEST | flags, dest.type, dest.info)
        request = ResolveRequest((source, dest), 0, 1, "test")
        return await self.provider.resolve(self.address_ctx(source.type, source.info), request)

    async def resolve_path(self, path: PathRecord, *, flags: int = 0) -> ResolveResult:
        entry = EpAddr(flags, AddrType.PATH, path.encode())
        request = ResolveRequest((entry,), 0, 0, "test")
        return await self.provider.resolve(self.source_ctx(), request)

    async def query_sa(self, path: PathRecord) -> tuple[int, PathRecord | None]:
        return await self.provider.query(self.source_ctx(), path)

    def source_ctx(self) -> object:
        return self.first_port.addresses[0][1]

    def counters(self) -> Sequence[int]:
        return self.provider.query_perf(self.endpoint_ctx)


async def _port_nursery(
    task_status: trio.TaskStatus[tuple[trio.CancelScope, trio.Nursery]] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            task_status.started((scope, nursery))
            await trio.sleep_forever()


def ipv4(world: SimWorld, node: str) -> EpAddr:
    return EpAddr.from_ip(world.node(node).ipv4[0].split("/")[0])


def ipv6(world: SimWorld, node: str) -> EpAddr:
    return EpAddr.from_ip(world.node(node).ipv6[0].split("/")[0])


def name(node: str) -> EpAddr:
    return EpAddr.from_name(node)


def gid(world: SimWorld, node: str) -> EpAddr:
    return EpAddr.from_gid(world.node(node).gids[0])


def lid(world: SimWorld, node: str) -> EpAddr:
    return EpAddr.from_lid(world.node(node).lids[0])


def ip_text(address: EpAddr) -> str:
    return str(ipaddress.ip_address(address.info[: 4 if address.type == AddrType.IP else 16]))


@dataclass(eq=False)
class Cluster:
    world: SimWorld
    nodes: dict[str, Node]
    nursery: trio.Nursery

    def __getitem__(self, node: str) -> Node:
        return self.nodes[node]

    def endpoint(self, node: str) -> AcmpEndpoint:
        return self.nodes[node].endpoint_ctx

    async def wait_ready(self, timeout: float = 120.0) -> None:
        with trio.fail_after(timeout):
            while not all(node.endpoint_ctx.ready for node in self.nodes.values() if node.ports):
                await trio.sleep(0.01)

    def acm_requests(self) -> int:
        """ACM requests sent to resolve something: gratuitous announcements (a node whose
        LID changed or that joined again) not included (see ``announcements``)."""
        return self.world.count(0x2C, 0x01) - self.announcements()

    def announcements(self) -> int:
        return sum(
            endpoint.stats.announcements
            for node in self.nodes.values()
            for port in node.provider.ports
            for endpoint in port.endpoints.values()
        )

    def acm_responses(self) -> int:
        return self.world.count(0x2C, 0x81)

    def sa_path_queries(self) -> int:
        return self.world.count(0x03, 0x01, 0x35)

    async def add_node(self, node: str, options: Options) -> Node:
        started = Node(self.world, node, options)
        await started.start(self.nursery)
        self.nodes[node] = started
        return started


@asynccontextmanager
async def cluster(
    nodes: int,
    options: Options | None = None,
    *,
    start: Sequence[str] | None = None,
    ready: bool = True,
    seed: int = 0,
    faults: Mapping[str, Any] | None = None,
    **topology: Any,
) -> AsyncIterator[Cluster]:
    """A running SimWorld of ``nodes`` nodes with a provider on each (or on ``start``);
    ``faults`` are set before any provider starts."""
    world = SimWorld(generate(nodes, **topology), seed=seed)
    for fault, value in (faults or {}).items():
        setattr(world.faults, fault, value)
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        running = Cluster(world, {}, nursery)
        for node in world.node_names if start is None else start:
            await running.add_node(node, options or Options())
        if ready:
            await running.wait_ready()
        yield running
        for started in running.nodes.values():
            await started.stop()
        nursery.cancel_scope.cancel()

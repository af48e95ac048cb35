"""The in-process ``Fabric`` of one simulated node (``world.fabric("node1")``).

Devices, ports and UD QPs are thin handles on the world's runtime records: UD sends go straight
to its ``Delivery``, SA MADs to its ``SaTransport``; receives and events arrive in bounded (QP)
or unbounded (events) trio memory channels. Closing the fabric destroys its QPs and stops its
event and SA deliveries, as a process exit would.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Sequence

import trio

from ibacm.fabric.api import (
    ACM_QKEY,
    AddressVector,
    Device,
    Fabric,
    FabricError,
    InterfaceAddress,
    IpEvent,
    NoDevicesError,
    Port,
    PortAttributes,
    PortEvent,
    PortTableDevice,
    ReceivedMad,
    SaCall,
    SaDestination,
    UdQp,
)
from ibacm.fabric.sim.delivery import Delivery
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.runtime import DeviceRuntime, HostRuntime, PortRuntime, WorldQp
from ibacm.fabric.sim.sa_transport import SaTransport
from ibacm.fabric.sim.umad import UmadAgent


class SimUdQp(UdQp):
    """A UD QP whose receive queue holds ``recv_depth`` MADs (more are dropped)."""

    def __init__(
        self, delivery: Delivery, port: PortRuntime, pkey_index: int, recv_depth: int, qkey: int
    ) -> None:
        if recv_depth < 1:
            raise FabricError(f"recv_depth must be >= 1, got {recv_depth}")
        self._delivery = delivery
        self._depth = recv_depth
        # A deque and a parking lot: cheaper than a memory channel on the delivery hot path.
        self._queue: deque[ReceivedMad] = deque()
        self._waiters = trio.lowlevel.ParkingLot()
        self._qp: WorldQp = delivery.create_qp(port, pkey_index, self, qkey=qkey)

    @property
    def qpn(self) -> int:
        return self._qp.qpn

    @property
    def closed(self) -> bool:
        return self._qp.closed

    def deliver(self, received: ReceivedMad) -> bool:
        if self._qp.closed or len(self._queue) >= self._depth:
            return False
        self._queue.append(received)
        if self._waiters:
            self._waiters.unpark()
        return True

    async def send(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        await trio.lowlevel.checkpoint()
        self._delivery.ud_send(self._qp, mad, av, remote_qpn)

    def post(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        # Receivers queue what is delivered (``deliver``): a post never runs their handlers.
        self._delivery.ud_send(self._qp, mad, av, remote_qpn)

    async def receive(self) -> ReceivedMad:
        await self._wait_queued()
        return self._queue.popleft()

    async def receive_many(self, limit: int) -> list[ReceivedMad]:
        await self._wait_queued()
        queue = self._queue
        if len(queue) <= limit:
            batch = list(queue)
            queue.clear()
            return batch
        return [queue.popleft() for _ in range(limit)]

    async def _wait_queued(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._queue:
            if self._qp.closed:
                raise trio.ClosedResourceError("the QP was destroyed")
            await self._waiters.park()
        if self._qp.closed:
            raise trio.ClosedResourceError("the QP was destroyed")

    async def attach_mcast(self, mgid: bytes, mlid: int) -> None:
        await trio.lowlevel.checkpoint()
        self._delivery.attach(self._qp, mgid, mlid)

    async def detach_mcast(self, mgid: bytes, mlid: int) -> None:
        await trio.lowlevel.checkpoint()
        self._delivery.detach(self._qp, mgid, mlid)

    def close(self) -> None:
        self._delivery.destroy_qp(self._qp)
        self._queue.clear()
        self._waiters.unpark_all()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()


class SimPort(Port):
    def __init__(self, device: SimDevice, runtime: PortRuntime) -> None:
        self._device = device
        self._runtime = runtime
        self._agent: UmadAgent | None = None
        self._agent_id = 0

    @property
    def port_num(self) -> int:
        return self._runtime.num

    async def query(self) -> PortAttributes:
        await trio.lowlevel.checkpoint()
        self._device.fabric.check_open()
        return self._device.fabric.directory.port_attributes(self._runtime)

    def _umad(self) -> UmadAgent:
        if self._agent is None:
            agent_id = self._device.fabric.sa_transport.register_agent(
                self._runtime, self._deliver_sa
            )
            self._agent = UmadAgent(agent_id)
        return self._agent

    def _deliver_sa(self, mad: bytes) -> None:
        if self._agent is not None:
            self._agent.deliver(mad)

    def sa_start(self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int) -> SaCall:
        self._device.fabric.check_open()
        sa_transport, runtime = self._device.fabric.sa_transport, self._runtime

        def transmit(wire: bytes) -> None:
            sa_transport.transmit(runtime, wire, dest)

        return self._umad().start(mad, transmit, timeout_ms=timeout_ms, retries=retries)

    async def sa_report(self) -> bytes:
        self._device.fabric.check_open()
        return await self._umad().next_report()

    async def sa_post(self, mad: bytes, dest: SaDestination) -> None:
        self._device.fabric.check_open()
        self._umad()  # registered from now on: the SA's answers and Reports find this port
        await trio.lowlevel.checkpoint()
        self._device.fabric.sa_transport.transmit(self._runtime, mad, dest)

    async def open_ud(self, pkey_index: int, *, recv_depth: int, qkey: int = ACM_QKEY) -> UdQp:
        """The ACM UD QP; ``qkey`` exists so tests can show a Q_Key mismatch being dropped."""
        await trio.lowlevel.checkpoint()
        fabric = self._device.fabric
        fabric.check_open()
        qp = SimUdQp(fabric.delivery, self._runtime, pkey_index, recv_depth, qkey)
        fabric.qps.append(qp)
        return qp

    def close(self) -> None:
        if self._agent is not None:
            self._device.fabric.sa_transport.unregister_agent(self._runtime, self._agent.agent_id)
            self._agent = None


class SimDevice(PortTableDevice["SimPort"]):
    def __init__(self, fabric: SimFabric, runtime: DeviceRuntime) -> None:
        super().__init__(runtime.name, runtime.node_guid)
        self.fabric = fabric
        self._runtime = runtime
        self.ports = {p.num: SimPort(self, p) for p in runtime.ports}
        self._events_in, self._events_out = trio.open_memory_channel[PortEvent](math.inf)
        runtime.subscribe(self)

    def deliver_event(self, event: PortEvent) -> None:
        with contextlib.suppress(trio.ClosedResourceError):
            self._events_in.send_nowait(event)

    async def wait_event(self) -> PortEvent:
        return await self._events_out.receive()

    def close(self) -> None:
        self._runtime.unsubscribe(self)
        for port in self.ports.values():
            port.close()
        self._events_out.close()
        self._events_in.close()


class SimFabric(Fabric):
    """The Fabric of one node of a ``SimWorld``; see the module docstring."""

    def __init__(
        self,
        host: HostRuntime,
        directory: Directory,
        delivery: Delivery,
        sa_transport: SaTransport,
    ) -> None:
        self.directory = directory
        self.delivery = delivery
        self.sa_transport = sa_transport
        self._host = host
        self.devices: list[SimDevice] = []
        self.qps: list[SimUdQp] = []
        self._closed = False
        self._ip_in, self._ip_out = trio.open_memory_channel[IpEvent](math.inf)
        host.subscribe_ip(self)

    @property
    def hostname(self) -> str:
        return self._host.name

    def check_open(self) -> None:
        if self._closed:
            raise FabricError(f"the fabric of {self._host.name} is closed")

    async def open(self) -> Sequence[Device]:
        await trio.lowlevel.checkpoint()
        self.check_open()
        if not self._host.devices:
            raise NoDevicesError(f"{self._host.name} has no InfiniBand device")
        if not self.devices:
            self.devices = [SimDevice(self, runtime) for runtime in self._host.devices]
        return list(self.devices)

    async def interface_addresses(self) -> Sequence[InterfaceAddress]:
        await trio.lowlevel.checkpoint()
        self.check_open()
        return list(self._host.addresses)

    def deliver_ip(self, event: IpEvent) -> None:
        with contextlib.suppress(trio.ClosedResourceError):
            self._ip_in.send_nowait(event)

    async def wait_ip_event(self) -> IpEvent:
        return await self._ip_out.receive()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            for qp in self.qps:
                qp.close()
            for device in self.devices:
                device.close()
            self._host.unsubscribe_ip(self)
            self._ip_out.close()
            self._ip_in.close()
        await trio.lowlevel.checkpoint()

"""The "umad-only" variant of the hardware backend: SA access without a verbs device.

On a real host a umad device exists exactly when its verbs device does, so this variant has
no use there. It exists for ibsim (real-peers.md §3): under the ``libumad2sim.so`` preload
libibumad sees simulated HCAs and talks to a real OpenSM, but there is no verbs device and no
UD data path — the simulator routes neither multicast nor UD data QPs. The daemon can then
run against the real SM/SA: ports come from libibumad, SA MADs (joins, PathRecord queries)
are real, and addresses come from the address and hosts files.

What differs from a verbs port:

* Attributes come from libibumad (sysfs): state, LIDs, SM, GID 0, P_Key table, rate. umad
  does not report the MTU, subnet timeout or the width/speed codes; the MTU is taken as 2048
  (what ibsim ports run), the timeout as 18 (OpenSM's default), and width/speed are derived
  from the reported rate.
* There are no async events: ports are re-read every ``poll_interval`` seconds and changes
  are reported as the events a verbs device would have sent (``port_changes``).
* ``open_ud`` returns a ``NoDataPathQp``: multicast attach/detach are recorded (the group
  membership itself is real, at the SA), sends and posts fail with ``FabricError`` saying
  why, and nothing is ever received (``serve`` returns when the QP is closed).
"""

from __future__ import annotations

from collections import deque

import trio

from ibacm.fabric.api import (
    AddressVector,
    FabricError,
    Port,
    PortAttributes,
    PortEvent,
    PortEventType,
    PortTableDevice,
    ReceivedMad,
    SaCall,
    SaDestination,
    UdQp,
)
from ibacm.fabric.hw.sa_agent import PortSa
from ibacm.fabric.hw.umad import UmadApi, UmadCaInfo, UmadError, UmadPortInfo

UMAD_MTU = 4  # 2048
UMAD_SUBNET_TIMEOUT = 18
POLL_INTERVAL = 1.0

# Gb/s -> (width code, speed code): the 4x widths first, as HCAs usually run 4x links.
_RATES = {
    10: (2, 1),  # 4x SDR
    20: (2, 2),  # 4x DDR
    40: (2, 4),  # 4x QDR
    56: (2, 16),  # 4x FDR
    100: (2, 32),  # 4x EDR
    200: (2, 64),  # 4x HDR
    400: (2, 128),  # 4x NDR
    2: (1, 1),  # 1x SDR (2.5 reported as 2)
    5: (1, 2),
    14: (1, 16),
    25: (1, 32),
    50: (1, 64),
    30: (8, 1),  # 12x SDR
    60: (8, 2),
    120: (8, 4),
    300: (8, 32),
    600: (8, 64),
}


def width_speed(rate_gbps: int) -> tuple[int, int]:
    """IBA width and speed codes for a port rate in Gb/s (4x SDR when unknown)."""
    return _RATES.get(rate_gbps, (2, 1))


def umad_port_attributes(info: UmadPortInfo) -> PortAttributes:
    width, speed = width_speed(info.rate)
    return PortAttributes(
        port_num=info.port_num,
        state=info.state,
        lid=info.base_lid,
        lmc=info.lmc,
        sm_lid=info.sm_lid,
        sm_sl=info.sm_sl,
        subnet_timeout=UMAD_SUBNET_TIMEOUT,
        active_mtu=UMAD_MTU,
        active_width=width,
        active_speed=speed,
        gids=(info.gid,) if info.port_guid else (),
        pkeys=info.pkeys,
    )


def port_changes(old: PortAttributes, new: PortAttributes) -> list[PortEventType]:
    """The events a device would have raised for the change from ``old`` to ``new``."""
    if old.active != new.active:
        return [PortEventType.PORT_ACTIVE if new.active else PortEventType.PORT_ERR]
    if not new.active:
        return []
    events = []
    if (old.lid, old.lmc) != (new.lid, new.lmc):
        events.append(PortEventType.LID_CHANGE)
    if old.gids != new.gids:
        events.append(PortEventType.GID_CHANGE)
    if old.pkeys != new.pkeys:
        events.append(PortEventType.PKEY_CHANGE)
    if (old.sm_lid, old.sm_sl) != (new.sm_lid, new.sm_sl):
        events.append(PortEventType.SM_CHANGE)
    return events


class NoDataPathQp(UdQp):
    """The UD QP of a umad-only port: there is no UD data path to send or receive on."""

    def __init__(self, port_num: int) -> None:
        self._port_num = port_num
        self._closed = trio.Event()
        self.groups: set[tuple[bytes, int]] = set()

    @property
    def qpn(self) -> int:
        return 0  # no QP exists; 0 is never an ACM peer's QPN

    async def send(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        self._check_open()
        raise self._no_data_path()

    def post(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        raise self._no_data_path()

    def _no_data_path(self) -> FabricError:
        return FabricError(
            f"port {self._port_num} is umad-only (no verbs device): it has no UD data path, "
            "so ACM MADs cannot be sent; resolve through preloaded addresses and the SA"
        )

    async def receive(self) -> ReceivedMad:
        self._check_open()
        await self._closed.wait()
        raise trio.ClosedResourceError("the umad-only QP was closed")

    async def attach_mcast(self, mgid: bytes, mlid: int) -> None:
        self._check_open()
        self.groups.add((mgid, mlid))

    async def detach_mcast(self, mgid: bytes, mlid: int) -> None:
        self._check_open()
        self.groups.discard((mgid, mlid))

    async def aclose(self) -> None:
        self._closed.set()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise trio.ClosedResourceError("the umad-only QP is closed")


class UmadOnlyPort(Port):
    def __init__(self, umad: UmadApi, ca_name: str, port_num: int) -> None:
        self._umad = umad
        self._ca_name = ca_name
        self._port_num = port_num
        self._sa = PortSa(umad, ca_name, port_num)

    @property
    def port_num(self) -> int:
        return self._port_num

    def query_sync(self) -> PortAttributes:
        try:
            return umad_port_attributes(self._umad.port(self._ca_name, self._port_num))
        except UmadError as exc:
            raise FabricError(str(exc)) from exc

    async def query(self) -> PortAttributes:
        return await trio.to_thread.run_sync(self.query_sync)

    def sa_start(self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int) -> SaCall:
        return self._sa.start(mad, dest, timeout_ms=timeout_ms, retries=retries)

    async def sa_report(self) -> bytes:
        return await self._sa.report()

    async def sa_post(self, mad: bytes, dest: SaDestination) -> None:
        await trio.lowlevel.checkpoint()
        self._sa.post(mad, dest)

    async def open_ud(self, pkey_index: int, *, recv_depth: int) -> UdQp:
        return NoDataPathQp(self._port_num)

    async def aclose(self) -> None:
        await self._sa.aclose()


class UmadOnlyDevice(PortTableDevice["UmadOnlyPort"]):
    """A CA seen through libibumad only; port changes are found by polling."""

    def __init__(
        self, umad: UmadApi, ca: UmadCaInfo, *, poll_interval: float = POLL_INTERVAL
    ) -> None:
        super().__init__(ca.name, ca.node_guid)
        self._ca = ca
        self.ports = {
            info.port_num: UmadOnlyPort(umad, ca.name, info.port_num) for info in ca.ports
        }
        self._poll_interval = poll_interval
        self._last = {info.port_num: umad_port_attributes(info) for info in ca.ports}
        self._events: deque[PortEvent] = deque()

    async def wait_event(self) -> PortEvent:
        while not self._events:
            await trio.sleep(self._poll_interval)
            for num, port in self.ports.items():
                current = await trio.to_thread.run_sync(port.query_sync)
                for kind in port_changes(self._last[num], current):
                    self._events.append(PortEvent(num, kind))
                self._last[num] = current
        return self._events.popleft()

    async def aclose(self) -> None:
        for port in self.ports.values():
            await port.aclose()

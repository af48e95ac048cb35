"""``HwFabric``: the hardware backend of the fabric interface.

``HwFabric()`` opens every verbs device with an InfiniBand port through pyverbs (SA MADs
through libibumad, see ``verbs_device``); ``HwFabric(mode=HwMode.UMAD_ONLY)`` uses only
libibumad, for the ibsim simulator (see ``umad_device``). IPoIB addresses are enumerated and
watched through rtnetlink (``ipmon``). Without pyverbs, without libibumad or without a device,
``open()`` raises ``NoDevicesError`` with one line that says what is missing.
"""

from __future__ import annotations

import enum
import socket
from collections.abc import Callable, Sequence
from typing import Any

from ibacm.fabric.api import (
    Device,
    Fabric,
    FabricError,
    InterfaceAddress,
    IpEvent,
    LinkLayer,
    NoDevicesError,
)
from ibacm.fabric.hw.ipmon import (
    IpMonitor,
    LinkFilter,
    SocketFactory,
    ipoib_only,
    open_route_socket,
)
from ibacm.fabric.hw.pyverbs_loader import Pyverbs, load_pyverbs
from ibacm.fabric.hw.umad import LibUmad, UmadApi, UmadError
from ibacm.fabric.hw.umad_device import UmadOnlyDevice
from ibacm.fabric.hw.verbs_device import HwDevice
from ibacm.fabric.hw.verbs_handles import LibVerbs, VerbsHandleError, VerbsHandles
from ibacm.log import get_logger

log = get_logger("ibacm.fabric.hw")

OwnDevice = HwDevice | UmadOnlyDevice


class HwMode(enum.Enum):
    VERBS = "verbs"
    """Real HCAs: pyverbs devices, UD QPs, async events; SA through umad."""
    UMAD_ONLY = "umad"
    """No verbs device (ibsim): libibumad ports and SA only, no UD data path."""


class HwFabric(Fabric):
    def __init__(
        self,
        *,
        mode: HwMode = HwMode.VERBS,
        link_filter: LinkFilter = ipoib_only,
        socket_factory: SocketFactory = open_route_socket,
        umad_factory: Callable[[], UmadApi] = LibUmad,
        pyverbs_loader: Callable[[], Pyverbs] = load_pyverbs,
    ) -> None:
        self.mode = mode
        self.offers_verbs = mode is HwMode.VERBS
        self._umad_factory = umad_factory
        self._pyverbs_loader = pyverbs_loader
        self._monitor = IpMonitor(link_filter=link_filter, socket_factory=socket_factory)
        self._devices: list[OwnDevice] = []

    async def open(self) -> Sequence[Device]:
        if self._devices:
            return list(self._devices)
        umad = self._open_umad()
        devices: list[OwnDevice]
        if self.mode is HwMode.UMAD_ONLY:
            devices = list(self._open_umad_devices(umad))
        else:
            devices = list(self._open_verbs_devices(umad))
        try:
            await self._monitor.open()
        except OSError as exc:
            for device in devices:
                await device.aclose()
            raise FabricError(f"cannot monitor IP addresses (rtnetlink): {exc}") from exc
        self._devices = devices
        return list(devices)

    async def interface_addresses(self) -> Sequence[InterfaceAddress]:
        return await self._monitor.addresses()

    async def wait_ip_event(self) -> IpEvent:
        return await self._monitor.next_event()

    @property
    def hostname(self) -> str:
        return socket.gethostname()

    async def aclose(self) -> None:
        self._monitor.close()
        devices, self._devices = self._devices, []
        for device in devices:
            await device.aclose()

    # -- opening -----------------------------------------------------------------------------
    def _open_umad(self) -> UmadApi:
        try:
            return self._umad_factory()
        except UmadError as exc:
            raise NoDevicesError(f"no InfiniBand access: {exc}") from exc

    def _open_umad_devices(self, umad: UmadApi) -> list[UmadOnlyDevice]:
        try:
            names = umad.ca_names()
        except UmadError as exc:
            raise NoDevicesError(f"no InfiniBand device found through libibumad: {exc}") from exc
        devices = []
        for name in names:
            try:
                ca = umad.ca(name)
            except UmadError as exc:
                # libibumad names a default CA even when sysfs has none.
                log.info("CA not usable", ca=name, error=str(exc))
                continue
            if any(port.link_layer in ("IB", "InfiniBand", "") for port in ca.ports):
                devices.append(UmadOnlyDevice(umad, ca))
        if not devices:
            raise NoDevicesError("no InfiniBand device found through libibumad")
        return devices

    def _open_verbs_devices(self, umad: UmadApi) -> list[HwDevice]:
        pv = self._pyverbs_loader()  # PyverbsUnavailable is a NoDevicesError
        try:
            listed = list(pv.device.get_device_list())
        except pv.Error as exc:
            raise NoDevicesError(f"no InfiniBand device found (verbs: {exc})") from exc
        try:
            lib, handles = LibVerbs(), VerbsHandles(pv.base.PyverbsCM)
        except VerbsHandleError as exc:
            raise NoDevicesError(f"libibverbs is not usable: {exc}") from exc
        devices: list[HwDevice] = []
        for entry in listed:
            device = self._open_verbs_device(pv, lib, handles, umad, entry)
            if device is not None:
                devices.append(device)
        if not devices:
            raise NoDevicesError(
                f"no InfiniBand device found ({len(listed)} RDMA device(s), none with an "
                "InfiniBand port)"
            )
        return devices

    @staticmethod
    def _open_verbs_device(
        pv: Pyverbs, lib: LibVerbs, handles: VerbsHandles, umad: UmadApi, entry: Any
    ) -> HwDevice | None:
        name = entry.name.decode() if isinstance(entry.name, bytes) else str(entry.name)
        try:
            ctx = pv.device.Context(name=name)
        except pv.Error as exc:
            log.warning("cannot open device", device=name, error=str(exc))
            return None
        try:
            if not _has_ib_port(pv, ctx):
                ctx.close()
                return None
            return HwDevice(pv, lib, handles, ctx, umad)
        except (pv.Error, FabricError) as exc:
            log.warning("cannot use device", device=name, error=str(exc))
            ctx.close()
            return None


def _has_ib_port(pv: Pyverbs, ctx: Any) -> bool:
    """A device is used only if one of its ports has link layer InfiniBand (behavior §3.1)."""
    count = ctx.query_device().phys_port_cnt
    for port_num in range(1, count + 1):
        try:
            layer = ctx.query_port(port_num).link_layer
        except pv.Error:
            continue
        if layer in (LinkLayer.INFINIBAND, LinkLayer.UNSPECIFIED):
            return True
    return False

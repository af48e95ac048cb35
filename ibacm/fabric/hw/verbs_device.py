"""A real HCA through pyverbs: device, ports, async events, SA agent per port.

Port attributes come from ``ibv_query_port`` plus the GID table (read until a query fails or a
GID with interface ID 0 appears, behavior.md §3.2) and the P_Key table. Async events are read
from the context's async fd, waited on with ``trio.lowlevel.wait_readable``; port events keep
their port number (pyverbs' own AsyncEvent drops it, so they are read through libibverbs).
SA MADs go through a umad agent per port, opened with the device; a port whose agent cannot
be opened keeps working without SA access (its ``sa_start``/``sa_send`` raise ``SaSendError``),
as in C.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

import trio

from ibacm.fabric.api import (
    FabricError,
    Port,
    PortAttributes,
    PortEvent,
    PortTableDevice,
    SaCall,
    SaDestination,
    UdQp,
)
from ibacm.fabric.hw import verbs_attrs as attrs
from ibacm.fabric.hw.poller import TurnPoller
from ibacm.fabric.hw.pyverbs_loader import Pyverbs
from ibacm.fabric.hw.sa_agent import PortSa
from ibacm.fabric.hw.ud_qp import HwUdQp, QpResources
from ibacm.fabric.hw.umad import UmadApi
from ibacm.fabric.hw.verbs_handles import LibVerbs, VerbsHandles
from ibacm.log import get_logger

log = get_logger("ibacm.fabric.hw")


def native_be64(value: int) -> int:
    """A ``__be64`` field (node GUID) that pyverbs returned as a native integer."""
    return int.from_bytes(value.to_bytes(8, sys.byteorder), "big")


class HwPort(Port):
    def __init__(self, device: HwDevice, port_num: int, sa: PortSa) -> None:
        self._device = device
        self._port_num = port_num
        self._sa = sa

    @property
    def port_num(self) -> int:
        return self._port_num

    async def query(self) -> PortAttributes:
        return await trio.to_thread.run_sync(self._device.query_port, self._port_num)

    def sa_start(self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int) -> SaCall:
        return self._sa.start(mad, dest, timeout_ms=timeout_ms, retries=retries)

    async def sa_report(self) -> bytes:
        return await self._sa.report()

    async def sa_post(self, mad: bytes, dest: SaDestination) -> None:
        await trio.lowlevel.checkpoint()
        self._sa.post(mad, dest)

    async def open_ud(self, pkey_index: int, *, recv_depth: int) -> UdQp:
        resources = self._device.qp_resources(self._port_num)
        return HwUdQp(resources, pkey_index=pkey_index, recv_depth=recv_depth)

    async def aclose(self) -> None:
        await self._sa.aclose()


class HwDevice(PortTableDevice["HwPort"]):
    """One opened verbs device (context, PD) with its ports."""

    def __init__(
        self, pv: Pyverbs, lib: LibVerbs, handles: VerbsHandles, ctx: Any, umad: UmadApi
    ) -> None:
        self._pv = pv
        self._lib = lib
        self._handles = handles
        self._ctx = ctx
        self._ctx_handle = handles.context(ctx)
        attr = ctx.query_device()
        super().__init__(
            str(ctx.name.decode() if isinstance(ctx.name, bytes) else ctx.name),
            native_be64(attr.node_guid),
        )
        self._pd = pv.pd.PD(ctx)
        self._events: deque[PortEvent] = deque()
        self._poller = TurnPoller(self._event_step, name=f"async events of {self._name}")
        self.ports = {
            num: HwPort(self, num, PortSa(umad, self._name, num))
            for num in range(1, int(attr.phys_port_cnt) + 1)
        }

    @property
    def verbs_context(self) -> int | None:
        return self._ctx_handle.pointer

    async def wait_event(self) -> PortEvent:
        await self._poller.wait_until(lambda: bool(self._events))
        return self._events.popleft()

    def query_port(self, port_num: int) -> PortAttributes:
        """Blocking: port attributes with the GID and P_Key tables (run in a thread)."""
        try:
            attr = self._ctx.query_port(port_num)
        except self._pv.Error as exc:
            raise FabricError(f"cannot query {self._name} port {port_num}: {exc}") from exc
        gids, pkeys = self._gids(port_num, attr), self._pkeys(port_num, attr)
        return attrs.port_attributes(port_num, attr, gids, pkeys)

    def _gids(self, port_num: int, attr: Any) -> list[bytes]:
        gids = []
        for index in range(attr.gid_tbl_len):
            try:
                gid = attrs.gid_from_pyverbs(self._ctx.query_gid(port_num, index))
            except (self._pv.Error, ValueError):
                break
            if not any(gid[8:]):
                break  # the table ends at the first GID without an interface ID
            gids.append(gid)
        return gids

    def _pkeys(self, port_num: int, attr: Any) -> list[int]:
        pkeys = []
        for index in range(attr.pkey_tbl_len):
            try:
                pkeys.append(attrs.pkey_from_verbs(self._ctx.query_pkey(port_num, index)))
            except self._pv.Error:
                break
        return pkeys

    def qp_resources(self, port_num: int) -> QpResources:
        return QpResources(
            self._pv, self._lib, self._handles, self._ctx, self._ctx_handle, self._pd, port_num
        )

    async def _event_step(self) -> None:
        await trio.lowlevel.wait_readable(self._ctx_handle.async_fd)
        record = self._lib.get_async_event(self._ctx_handle)
        found = attrs.port_events(record.event_type, record.element, self.phys_port_cnt)
        if not found:
            log.info("async event ignored", device=self._name, event_type=record.event_type)
        self._events.extend(PortEvent(port, kind) for port, kind in found)

    async def aclose(self) -> None:
        if self._poller.closed:
            return
        self._poller.close()
        trio.lowlevel.notify_closing(self._ctx_handle.async_fd)
        await self._poller.wait_idle()
        for port in self.ports.values():
            await port.aclose()
        self._pd.close()
        self._ctx.close()

"""``testprov``: a small but real provider for the core's tests.

It answers local destinations with a loopback path built from the port (like ibacmp's
``loopback_prot local``), path-form and QUERY_SA requests with a real SA PathRecord GET
through ``CoreServices.sa_request``, and destinations named ``slow-<seconds>`` after that
many seconds (to hold requests in flight). Everything the core calls is recorded in
``events`` so tests can check the life cycle, and every port runs a task in its port nursery
whose cancellation is recorded, so tests can see which work a port event cancelled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from ibacm.config.address_literals import match_key
from ibacm.fabric.api import PortEventType
from ibacm.provider.api import (
    CoreAddress,
    CoreDevice,
    CoreEndpoint,
    CorePort,
    CoreServices,
    Counter,
    Counters,
    Provider,
    ResolveRequest,
    ResolveResult,
)
from ibacm.wire.client import AcmStatus, AddrType, EpFlag, pad_address
from ibacm.wire.mad import SaMad, build_path_get
from ibacm.wire.path_record import PathRecord


@dataclass(eq=False)
class _Port:
    core: CorePort
    alive: bool = True


@dataclass(eq=False)
class _Endpoint:
    core: CoreEndpoint
    port: _Port
    counters: Counters = field(default_factory=Counters)
    addresses: list[CoreAddress] = field(default_factory=list)


@dataclass(eq=False)
class _Address:
    core: CoreAddress
    endpoint: _Endpoint


class TestProvider(Provider):
    __test__ = False  # not a pytest class
    name = "testprov"

    def __init__(self, core: CoreServices) -> None:
        super().__init__(core)
        self.events: list[tuple[Any, ...]] = []
        self.port_tasks_running = 0
        self.endpoints: list[_Endpoint] = []

    async def start(self) -> None:
        self.events.append(("start",))

    async def stop(self) -> None:
        self.events.append(("stop",))

    async def open_device(self, device: CoreDevice) -> object:
        self.events.append(("open_device", device.name))
        return device

    async def close_device(self, dev_ctx: object) -> None:
        assert isinstance(dev_ctx, CoreDevice)
        self.events.append(("close_device", dev_ctx.name))

    async def open_port(self, port: CorePort, dev_ctx: object) -> object:
        self.events.append(("open_port", port.device.name, port.port_num))
        state = _Port(port)
        await port.nursery.start(self._port_task, port)
        return state

    async def _port_task(self, port: CorePort, *, task_status: trio.TaskStatus[None]) -> None:
        self.port_tasks_running += 1
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self.port_tasks_running -= 1
            self.events.append(("port_task_cancelled", port.device.name, port.port_num))

    async def close_port(self, port_ctx: object) -> None:
        assert isinstance(port_ctx, _Port)
        port_ctx.alive = False
        self.events.append(("close_port", port_ctx.core.device.name, port_ctx.core.port_num))

    async def open_endpoint(self, endpoint: CoreEndpoint, port_ctx: object) -> object:
        assert isinstance(port_ctx, _Port)
        self.events.append(("open_endpoint", endpoint.port.port_num, endpoint.pkey))
        state = _Endpoint(endpoint, port_ctx)
        self.endpoints.append(state)
        return state

    async def close_endpoint(self, ep_ctx: object) -> None:
        assert isinstance(ep_ctx, _Endpoint)
        self.events.append(("close_endpoint", ep_ctx.core.port.port_num, ep_ctx.core.pkey))
        self.endpoints.remove(ep_ctx)

    def add_address(self, address: CoreAddress, ep_ctx: object) -> object:
        assert isinstance(ep_ctx, _Endpoint)
        self.events.append(("add_address", address.display))
        ep_ctx.addresses.append(address)
        return _Address(address, ep_ctx)

    def remove_address(self, addr_ctx: object) -> None:
        assert isinstance(addr_ctx, _Address)
        self.events.append(("remove_address", addr_ctx.core.display))
        addr_ctx.endpoint.addresses.remove(addr_ctx.core)

    # -- requests ---------------------------------------------------------------------------
    def _local(self, addr_type: int, info: bytes) -> _Endpoint | None:
        key = match_key(addr_type, pad_address(addr_type, info))
        for endpoint in self.endpoints:
            for address in endpoint.addresses:
                if match_key(address.type, address.info) == key:
                    return endpoint
        return None

    @staticmethod
    def loopback_path(endpoint: _Endpoint) -> PathRecord:
        attrs = endpoint.port.core.attrs
        gid = attrs.gids[0]
        return PathRecord(
            dgid=gid,
            sgid=gid,
            dlid=attrs.lid,
            slid=attrs.lid,
            reversible=True,
            pkey=endpoint.core.pkey,
            mtu=attrs.active_mtu,
            rate=3,
        )

    async def resolve(self, addr_ctx: object, request: ResolveRequest) -> ResolveResult:
        assert isinstance(addr_ctx, _Address)
        endpoint = addr_ctx.endpoint
        endpoint.counters.increment(Counter.RESOLVE)
        dest = request.dest
        if dest.type == AddrType.PATH:
            return await self._resolve_path(endpoint, dest.path())
        if dest.type == AddrType.NAME:
            name = dest.info.split(b"\0", 1)[0].decode()
            if name.startswith("slow-"):
                await trio.sleep(float(name[5:]))
                return ResolveResult(AcmStatus.ENODATA)
        target = self._local(dest.type, dest.info)
        if target is not None:
            endpoint.counters.increment(Counter.ROUTE_CACHE)
            return ResolveResult(AcmStatus.SUCCESS, (self.loopback_path(target),))
        endpoint.counters.increment(Counter.NODATA)
        if dest.flags & EpFlag.NODELAY:
            return ResolveResult(AcmStatus.ENODATA)
        return ResolveResult(AcmStatus.ENODATA)

    async def _sa_get(self, endpoint: _Endpoint, path: PathRecord) -> tuple[int, PathRecord | None]:
        endpoint.counters.increment(Counter.ROUTE_QUERY)
        mad = build_path_get(self.core.next_tid(), path)
        reply = SaMad.decode(await self.core.sa_request(endpoint.port.core, mad))
        status = reply.sa_status
        record = PathRecord.decode(reply.records(64)[0])
        return status, record

    async def _resolve_path(self, endpoint: _Endpoint, request: PathRecord) -> ResolveResult:
        attrs = endpoint.port.core.attrs
        query = PathRecord(
            dgid=request.dgid,
            sgid=request.sgid if any(request.sgid) else attrs.gids[0],
            dlid=request.dlid,
            slid=request.slid or attrs.lid,
            reversible=True,
            numb_path=1,
            pkey=endpoint.core.pkey,
        )
        status, record = await self._sa_get(endpoint, query)
        if status or record is None:
            return ResolveResult(AcmStatus(status) if status in (1, 2, 3) else AcmStatus.ENODATA)
        return ResolveResult(AcmStatus.SUCCESS, (record,))

    async def query(self, addr_ctx: object, path: PathRecord) -> tuple[int, PathRecord | None]:
        assert isinstance(addr_ctx, _Address)
        return await self._sa_get(addr_ctx.endpoint, path)

    async def handle_event(self, port_ctx: object, event: PortEventType) -> None:
        assert isinstance(port_ctx, _Port)
        self.events.append(
            ("event", port_ctx.core.port_num, event.value, port_ctx.core.attrs.sm_lid)
        )

    def query_perf(self, ep_ctx: object) -> Sequence[int]:
        assert isinstance(ep_ctx, _Endpoint)
        return ep_ctx.counters.snapshot()

    def describe_endpoint(self, ep_ctx: object) -> Mapping[str, Any]:
        assert isinstance(ep_ctx, _Endpoint)
        return {"state": "ready", "cache": []}

    def flush(self, ep_ctx: object, dest: tuple[AddrType, bytes] | None = None) -> int:
        self.events.append(("flush", dest))
        return 1

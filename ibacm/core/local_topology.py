"""Devices, ports, endpoints and addresses over time (behavior.md §3 and §5).

Task tree: ``Topology.run`` owns one nursery per device; each device nursery runs that
device's event loop and one nursery per port that is up (``CorePort.nursery``), where the
provider starts the port's receive loops, timers and retries. Taking a port down cancels
exactly that nursery. Every change of the tables (port events, IP events, reload, shutdown)
runs under one lock, so a request never sees a half-built endpoint.

Fixes over C: SM_CHANGE refreshes the SM LID/SL used for SA MADs (defect 23); IPv6 address
events are handled and an address on a partition without an endpoint creates the endpoint
(defect 27); an endpoint is kept when any address was added, not only slot 0 (defect 21);
ports whose link layer is not InfiniBand are skipped (defect 22); duplicate address-file
lines are skipped without dropping the rest (defect 20).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from ibacm.config.addr_file import AddrEntry, generate_addr_file, parse_addr_file
from ibacm.config.errors import ConfigIssue
from ibacm.core.addresses import (
    AddressSpec,
    endpoint_pkeys,
    endpoint_specs,
    interface_on,
    interface_spec,
)
from ibacm.core.model import (
    AddressSlot,
    DeviceList,
    DeviceState,
    EndpointState,
    PortState,
    ProviderDevice,
    iter_endpoints,
    up_ports,
)
from ibacm.core.sa import SaChannel
from ibacm.core.services import DaemonServices
from ibacm.fabric.api import (
    Device,
    Fabric,
    FabricError,
    InterfaceAddress,
    IpEvent,
    LinkLayer,
    PortAttributes,
    PortEvent,
    PortEventType,
)
from ibacm.log import get_logger
from ibacm.provider.api import CoreAddress, CoreDevice, CoreEndpoint, CorePort, Provider
from ibacm.provider.registry import ProviderSet

log = get_logger("ibacm.topology")


class AddressFile:
    """The address file: its path, current entries, and generation when it is missing."""

    def __init__(self, path: str, *, support_ips: bool) -> None:
        self.path = path
        self.support_ips = support_ips
        self.entries: list[AddrEntry] = []
        self.generated = False

    def parse(self, text: str) -> list[ConfigIssue]:
        self.entries, issues = parse_addr_file(text, self.path, self.support_ips)
        for issue in issues:
            log.warning("address file", problem=str(issue))
        return issues

    def load(self) -> bool:
        """Read the file; False when it does not exist (the caller may generate it)."""
        try:
            text = Path(self.path).read_bytes().decode("utf-8", "surrogateescape")
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.error("cannot read address file", path=self.path, error=exc.strerror)
            self.entries = []
            return True
        self.parse(text)
        return True

    def generate(self, ports: Sequence[tuple[str, int, bool]], hostname: str) -> None:
        """What C gets from ``ib_acme -A``, written to the configured path this time (C
        always wrote the default path, defect 20). Used even if it cannot be written."""
        try:
            text = generate_addr_file(ports, hostname)
        except ValueError as exc:
            log.error("cannot generate an address file", error=str(exc))
            self.entries = []
            return
        self.generated = True
        try:
            Path(self.path).write_text(text, encoding="utf-8")
            log.warning("address file was missing; generated it", path=self.path)
        except OSError as exc:
            log.warning(
                "address file was missing; using generated names without saving them",
                path=self.path,
                error=exc.strerror,
            )
        self.parse(text)


async def _port_nursery(
    *, task_status: trio.TaskStatus[tuple[trio.CancelScope, trio.Nursery]]
) -> None:
    """Hosts one port's nursery until the port goes down (its scope is cancelled)."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            task_status.started((scope, nursery))
            await trio.sleep_forever()


class Topology:
    def __init__(
        self,
        fabric: Fabric,
        providers: ProviderSet,
        services: DaemonServices,
        addr_file: AddressFile,
        publish: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.fabric = fabric
        self.providers = providers
        self.services = services
        self.addr_file = addr_file
        self.devices = DeviceList()
        """Reverse enumeration order, as C's device list (EP_QUERY order). Every change to
        its ports, endpoints or addresses below ends with ``devices.changed()``."""
        self.lock = trio.Lock()
        self._publish = publish or services.publish
        self._device_nurseries: dict[DeviceState, trio.Nursery] = {}
        self.closed = False

    # -- life cycle ----------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the devices, bring their ports up, then follow port and IP events.

        Raises ``NoDevicesError`` (from the fabric) before ``started`` when there is nothing.
        """
        devices = await self.fabric.open()
        self.devices.extend(self._device_state(device) for device in reversed(devices))
        self.devices.changed()
        if not self.addr_file.load():
            await self._generate_addr_file()
        async with trio.open_nursery() as nursery:
            for state in self.devices:
                await nursery.start(self._run_device, state)
            nursery.start_soon(self._watch_ip_events)
            task_status.started()

    def _device_state(self, device: Device) -> DeviceState:
        core = CoreDevice(device, device.name, device.node_guid, device.phys_port_cnt)
        state = DeviceState(core)
        state.ports = [
            PortState(state, device.port(number), number)
            for number in range(1, device.phys_port_cnt + 1)
        ]
        return state

    async def _generate_addr_file(self) -> None:
        ports: list[tuple[str, int, bool]] = []
        # Verbs order, i.e. the enumeration order (our list is reversed).
        for device in reversed(self.devices):
            for port in device.ports:
                try:
                    active = (await port.port.query()).active
                except FabricError:
                    active = False
                ports.append((device.name, port.port_num, active))
        self.addr_file.generate(ports, self.fabric.hostname)

    async def _run_device(self, device: DeviceState, *, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._device_nurseries[device] = nursery
            async with self.lock:
                for port in device.ports:
                    await self._port_up(port)
            task_status.started()
            await self._follow_device_events(device)

    async def _follow_device_events(self, device: DeviceState) -> None:
        while True:
            try:
                event = await device.core.device.wait_event()
            except FabricError as exc:
                log.error("device events stopped", device=device.name, error=str(exc))
                return
            async with self.lock:
                if self.closed:
                    return
                await self.handle_port_event(device, event)

    async def close(self) -> None:
        """Shut every port down (provider close_* calls) and stop following events."""
        async with self.lock:
            self.closed = True
            for device in self.devices:
                for port in device.ports:
                    if port.up:
                        await self._port_down(port)
            for nursery in self._device_nurseries.values():
                nursery.cancel_scope.cancel()

    # -- ports ---------------------------------------------------------------------------------
    def _port_provider(self, attrs: PortAttributes) -> Provider | None:
        return self.providers.for_subnet(attrs.subnet_prefix)

    async def _query(self, port: PortState) -> PortAttributes | None:
        try:
            return await port.port.query()
        except FabricError as exc:
            log.error("port query failed", port=port.id, error=str(exc))
            return None

    async def _port_up(self, port: PortState) -> None:
        """behavior.md §3.2: ACTIVE ports get a nursery, a provider and their endpoints."""
        attrs = await self._query(port)
        if attrs is None:
            return
        port.attrs = attrs
        if not attrs.active:
            log.info("port not active", port=port.id, state=attrs.state.name)
            return
        if attrs.link_layer != LinkLayer.INFINIBAND:
            log.info("port skipped: not InfiniBand", port=port.id, link=attrs.link_layer.name)
            return
        nursery_parent = self._device_nurseries[port.device]
        scope, nursery = await nursery_parent.start(_port_nursery)
        core = CorePort(port.device.core, port.port, port.port_num, attrs, nursery)
        port.core, port.scope = core, scope
        self.devices.changed()
        port.sa = SaChannel(port.port, attrs, self.services.options.sa_depth)
        self.services.sa_channels[core] = port.sa
        log.info(
            "port up",
            port=port.id,
            lid=attrs.lid,
            sm_lid=attrs.sm_lid,
            prefix=f"0x{attrs.subnet_prefix:016x}",
        )
        provider = self._port_provider(attrs)
        if provider is None:
            log.error("no provider for port", port=port.id, prefix=f"0x{attrs.subnet_prefix:016x}")
            self._publish_port(port)
            return
        if not await self._open_provider_port(port, provider):
            # Beyond C (which leaves the port without endpoints): the default provider serves a
            # port whose own provider cannot open it.
            fallback = self.providers.default
            if fallback is None or fallback is provider:
                self._publish_port(port)
                return
            if not await self._open_provider_port(port, fallback):
                self._publish_port(port)
                return
            log.warning(
                "port served by the default provider", port=port.id, failed=provider.name,
                provider=fallback.name,
            )  # fmt: skip
        for pkey in endpoint_pkeys(attrs):
            await self._endpoint_up(port, pkey)
        self._publish_port(port)
        if port.reregister_pending:
            port.reregister_pending = False
            await self._forward_event(port, PortEventType.CLIENT_REREGISTER)

    async def _open_provider_port(self, port: PortState, provider: Provider) -> bool:
        device = port.device
        assert port.core is not None
        held = device.provider_devices.get(provider)
        try:
            if held is None:
                held = ProviderDevice(await provider.open_device(device.core))
                device.provider_devices[provider] = held
            held.ports += 1
            port.provider = provider
            port.ctx = await provider.open_port(port.core, held.ctx)
        except Exception:
            log.exception("provider could not open port", port=port.id, provider=provider.name)
            port.provider = None
            await self._release_device(device, provider)
            return False
        return True

    async def _release_device(self, device: DeviceState, provider: Provider) -> None:
        held = device.provider_devices.get(provider)
        if held is None:
            return
        held.ports -= 1
        if held.ports > 0:
            return
        del device.provider_devices[provider]
        try:
            await provider.close_device(held.ctx)
        except Exception:
            log.exception("provider close_device failed", device=device.name)

    async def _port_down(self, port: PortState) -> None:
        """behavior.md §3.3: addresses, endpoints, port and device closed, nursery cancelled."""
        provider = port.provider
        for endpoint in list(port.endpoints):
            await self._close_endpoint(endpoint)
        port.endpoints.clear()
        self.devices.changed()
        if provider is not None and port.ctx is not None:
            try:
                await provider.close_port(port.ctx)
            except Exception:
                log.exception("provider close_port failed", port=port.id)
        if provider is not None:
            await self._release_device(port.device, provider)
        if port.scope is not None:
            port.scope.cancel()
        if port.core is not None:
            self.services.sa_channels.pop(port.core, None)
        port.core = port.scope = port.sa = None
        port.provider = port.ctx = None
        self.devices.changed()
        log.info("port down", port=port.id)
        self._publish_port(port)

    async def handle_port_event(self, device: DeviceState, event: PortEvent) -> None:
        """behavior.md §5.1 (call with the lock held)."""
        if not 1 <= event.port_num <= len(device.ports):
            log.warning("event for unknown port", device=device.name, port=event.port_num)
            return
        port = device.ports[event.port_num - 1]
        log.info("port event", port=port.id, kind=event.type.value)
        kind = event.type
        if kind is PortEventType.PORT_ACTIVE:
            if not port.up:
                await self._port_up(port)
        elif kind is PortEventType.PORT_ERR:
            if port.up:
                attrs = await self._query(port)
                if attrs is None or not attrs.active:
                    port.attrs = attrs or port.attrs
                    await self._port_down(port)
        elif kind in (
            PortEventType.LID_CHANGE,
            PortEventType.GID_CHANGE,
            PortEventType.PKEY_CHANGE,
        ):
            if port.up:
                await self._port_down(port)
                await self._port_up(port)
        elif kind is PortEventType.CLIENT_REREGISTER:
            if port.up and port.ctx is not None:
                await self._forward_event(port, kind)
            else:
                port.reregister_pending = True
        elif kind is PortEventType.SM_CHANGE and port.up:
            await self._refresh_sm(port)
            await self._forward_event(port, kind)

    async def _refresh_sm(self, port: PortState) -> None:
        """New SM: SA MADs must go to its LID/SL from now on (C kept the old one, defect 23)."""
        attrs = await self._query(port)
        if attrs is None or port.core is None or port.sa is None:
            return
        port.attrs = attrs
        port.core.attrs = attrs
        port.sa.update(attrs)
        log.info("subnet manager changed", port=port.id, sm_lid=attrs.sm_lid, sm_sl=attrs.sm_sl)
        self._publish_port(port)

    async def _forward_event(self, port: PortState, kind: PortEventType) -> None:
        if port.provider is None or port.ctx is None:
            return
        try:
            await port.provider.handle_event(port.ctx, kind)
        except Exception:
            log.exception("provider failed to handle event", port=port.id, kind=kind.value)

    # -- endpoints and addresses ---------------------------------------------------------------
    async def _endpoint_up(self, port: PortState, pkey: int) -> EndpointState | None:
        """behavior.md §3.4: create the endpoint and add its addresses; keep it if any."""
        assert port.attrs is not None
        interfaces = await self._interfaces()
        specs, skipped = endpoint_specs(
            device=port.device.name,
            attrs=port.attrs,
            pkey=pkey,
            interfaces=interfaces,
            entries=self.addr_file.entries,
        )
        for spec in skipped:
            log.warning("duplicate address skipped", port=port.id, address=spec.display)
        return await self._create_endpoint(port, pkey, specs)

    async def _create_endpoint(
        self, port: PortState, pkey: int, specs: Sequence[AddressSpec]
    ) -> EndpointState | None:
        assert port.core is not None
        endpoint = EndpointState(port, CoreEndpoint(port.core, pkey))
        try:
            for spec in specs:
                await self._add_address(endpoint, spec)
        except Exception:
            log.exception("provider could not open endpoint", endpoint=endpoint.id)
        if not endpoint.addresses():
            if endpoint.ctx is not None:
                await self._close_endpoint(endpoint)
            log.info("endpoint without addresses discarded", endpoint=endpoint.id)
            return None
        port.endpoints.insert(0, endpoint)
        self.devices.changed()
        log.info(
            "endpoint up",
            endpoint=endpoint.id,
            addresses=[slot.core.display for slot in endpoint.addresses()],
        )
        self._publish_endpoint(endpoint)
        return endpoint

    async def _add_address(self, endpoint: EndpointState, spec: AddressSpec) -> AddressSlot | None:
        """Open the provider endpoint on the first address, then ``add_address``.

        Raises when ``open_endpoint`` fails (the endpoint is then discarded, as in C); an
        ``add_address`` failure only loses that address.
        """
        provider = endpoint.port.provider
        if provider is None or endpoint.port.ctx is None:
            return None
        if endpoint.find(spec.key) is not None:
            log.warning("duplicate address skipped", endpoint=endpoint.id, address=spec.display)
            return None
        if endpoint.ctx is None:
            endpoint.ctx = await provider.open_endpoint(endpoint.core, endpoint.port.ctx)
        core = CoreAddress(endpoint.core, spec.type, spec.info, spec.display)
        try:
            ctx = provider.add_address(core, endpoint.ctx)
        except Exception:
            log.exception("provider add_address failed", endpoint=endpoint.id, address=spec.display)
            return None
        slot = AddressSlot(core, endpoint, ctx, spec.origin, spec.prefixlen, spec.ifname)
        endpoint.insert(slot)
        self.devices.changed()
        log.debug("address added", endpoint=endpoint.id, address=spec.display)
        return slot

    def _remove_address(self, slot: AddressSlot) -> None:
        endpoint = slot.owner
        endpoint.remove(slot)
        self.devices.changed()
        provider = endpoint.port.provider
        if provider is not None:
            try:
                provider.remove_address(slot.ctx)
            except Exception:
                log.exception("provider remove_address failed", address=slot.core.display)
        log.info("address removed", endpoint=endpoint.id, address=slot.core.display)

    async def _close_endpoint(self, endpoint: EndpointState) -> None:
        for slot in endpoint.addresses():
            self._remove_address(slot)
        provider = endpoint.port.provider
        if provider is not None and endpoint.ctx is not None:
            try:
                await provider.close_endpoint(endpoint.ctx)
            except Exception:
                log.exception("provider close_endpoint failed", endpoint=endpoint.id)
        endpoint.ctx = None
        self._publish("endpoint", {"id": endpoint.id, "state": "removed"})

    async def _interfaces(self) -> Sequence[InterfaceAddress]:
        try:
            return await self.fabric.interface_addresses()
        except FabricError as exc:
            log.error("cannot list interface addresses", error=str(exc))
            return []

    # -- IP address events (behavior.md §5.2) ----------------------------------------------------
    async def _watch_ip_events(self) -> None:
        while True:
            try:
                event = await self.fabric.wait_ip_event()
            except FabricError as exc:
                log.error("address events stopped", error=str(exc))
                return
            async with self.lock:
                if self.closed:
                    return
                await self.handle_ip_event(event)

    async def handle_ip_event(self, event: IpEvent) -> None:
        spec = interface_spec(event.address, from_event=True)
        existing = self._find_slot(spec.key)
        if not event.added:
            if existing is not None:
                self._remove_address(existing)
            return
        if existing is not None:
            return
        for port in up_ports(self.devices):
            if port.attrs is None or port.provider is None:
                continue
            if not any(interface_on(event.address, port.attrs, pkey) for pkey in port.attrs.pkeys):
                continue
            endpoint = port.endpoint_for(event.address.pkey)
            if endpoint is not None:
                await self._add_address(endpoint, spec)
                self._publish_endpoint(endpoint)
            else:
                pkey = next(
                    p for p in port.attrs.pkeys if interface_on(event.address, port.attrs, p)
                )
                await self._create_endpoint(port, pkey, [spec])
            return
        log.info("address on no local port/partition ignored", address=spec.display)

    def _find_slot(self, key: tuple[int, bytes]) -> AddressSlot | None:
        for endpoint in iter_endpoints(self.devices):
            slot = endpoint.find(key)
            if slot is not None:
                return slot
        return None

    # -- reload --------------------------------------------------------------------------------
    async def would_leave_no_endpoint(
        self, entries: Sequence[AddrEntry], path: str
    ) -> list[ConfigIssue]:
        """A reload problem when ``entries`` would take every address of every endpoint away
        (an address file emptied or for another host) while endpoints exist now."""
        ports = [p for p in up_ports(self.devices) if p.attrs is not None and p.provider]
        if not any(port.endpoints for port in ports):
            return []
        interfaces = await self._interfaces()
        for port in ports:
            assert port.attrs is not None
            for pkey in endpoint_pkeys(port.attrs):
                specs, _ = endpoint_specs(
                    device=port.device.name,
                    attrs=port.attrs,
                    pkey=pkey,
                    interfaces=interfaces,
                    entries=list(entries),
                )
                if specs:
                    return []
        message = "no address in it matches a port of this host: every endpoint would go"
        return [ConfigIssue(path, 0, message, "error")]

    async def reload_addresses(self, entries: Sequence[AddrEntry] | None = None) -> None:
        """Make every endpoint's addresses what the system and the address file now say
        (``entries``: the file as the caller already read and checked it)."""
        async with self.lock:
            if entries is not None:
                self.addr_file.entries = list(entries)
            elif not self.addr_file.load():
                log.warning("address file missing on reload; keeping no file addresses")
                self.addr_file.entries = []
            interfaces = await self._interfaces()
            for port in list(up_ports(self.devices)):
                if port.attrs is None or port.provider is None or port.ctx is None:
                    continue
                for pkey in endpoint_pkeys(port.attrs):
                    specs, _ = endpoint_specs(
                        device=port.device.name,
                        attrs=port.attrs,
                        pkey=pkey,
                        interfaces=interfaces,
                        entries=self.addr_file.entries,
                    )
                    await self._sync_endpoint(port, pkey, specs)

    async def _sync_endpoint(
        self, port: PortState, pkey: int, specs: Sequence[AddressSpec]
    ) -> None:
        endpoint = port.endpoint_for(pkey)
        if endpoint is None:
            if specs:
                await self._create_endpoint(port, pkey, specs)
            return
        wanted = {spec.key for spec in specs}
        changed = False
        for slot in endpoint.addresses():
            if slot.key not in wanted:
                self._remove_address(slot)
                changed = True
        for spec in specs:
            if endpoint.find(spec.key) is None:
                changed = await self._add_address(endpoint, spec) is not None or changed
        if not endpoint.addresses():
            await self._close_endpoint(endpoint)
            port.endpoints.remove(endpoint)
            self.devices.changed()
            log.info("endpoint removed: no addresses left", endpoint=endpoint.id)
        elif changed:
            self._publish_endpoint(endpoint)

    def apply_sa_depth(self, depth: int) -> None:
        for port in up_ports(self.devices):
            if port.sa is not None:
                port.sa.depth = depth

    # -- observability -------------------------------------------------------------------------
    def _publish_port(self, port: PortState) -> None:
        self._publish("port", port_info(port))

    def _publish_endpoint(self, endpoint: EndpointState) -> None:
        self._publish("endpoint", endpoint_summary(endpoint))


def address_kind(addr_type: int) -> str:
    return {1: "name", 2: "ip", 3: "ip6"}.get(addr_type, str(addr_type))


def endpoint_summary(endpoint: EndpointState) -> dict[str, Any]:
    port = endpoint.port
    return {
        "id": endpoint.id,
        "device": port.device.name,
        "port": port.port_num,
        "pkey": endpoint.pkey,
        "state": "up",
        "provider": port.provider.name if port.provider is not None else None,
        "addresses": [
            {"type": address_kind(slot.core.type), "address": slot.core.display}
            for slot in endpoint.addresses()
        ],
    }


def port_info(port: PortState) -> dict[str, Any]:
    info: dict[str, Any] = {
        "id": port.id,
        "device": port.device.name,
        "port": port.port_num,
        "state": _port_state(port),
        "provider": port.provider.name if port.provider is not None else None,
    }
    attrs = port.attrs
    if attrs is not None:
        info.update(
            lid=attrs.lid,
            lmc=attrs.lmc,
            sm_lid=attrs.sm_lid,
            sm_sl=attrs.sm_sl,
            gid=_gid_text(attrs.gids[0]) if attrs.gids else None,
            mtu=attrs.active_mtu,
            width=attrs.active_width,
            speed=attrs.active_speed,
            pkeys=list(attrs.pkeys),
        )
    if port.sa is not None:
        info["sa"] = {
            "depth": port.sa.depth,
            "in_flight": port.sa.in_flight,
            "waiting": port.sa.waiting,
            "sent": port.sa.sent,
            "failed": port.sa.failed,
        }
    return info


def _port_state(port: PortState) -> str:
    if port.up:
        return "ACTIVE"
    attrs = port.attrs
    if attrs is not None and not attrs.active:
        return attrs.state.name
    return "DOWN"


def _gid_text(gid: bytes) -> str:
    return str(ipaddress.IPv6Address(gid))

"""The core's bookkeeping of devices, ports, endpoints and addresses, and the lookups on it.

The lists keep C's orders because clients can see them (behavior.md §3.6): devices in reverse
enumeration order, ports by number, endpoints of a port newest first, addresses in slot order
(a freed slot is reused by the next address). Lookups are plain functions over these lists,
with no I/O, so the dispatcher built on them is testable without sockets.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import trio

from ibacm.config.address_literals import match_key
from ibacm.core.sa import SaChannel
from ibacm.fabric.api import Port, PortAttributes
from ibacm.log import get_logger
from ibacm.provider.api import CoreAddress, CoreDevice, CoreEndpoint, CorePort, Provider
from ibacm.provider.route_table import RouteTable
from ibacm.wire.client import AddrType, pad_address
from ibacm.wire.path_record import ZERO_GID, PathRecord

log = get_logger("ibacm.topology")

PARTITION_MASK = 0x7FFF


def same_partition(a: int, b: int) -> bool:
    """Partition equality everywhere in ACM: the low 15 bits (membership bit ignored)."""
    return (a & PARTITION_MASK) == (b & PARTITION_MASK)


class AddressOrigin(enum.Enum):
    SYSTEM = "system"
    """Found by the IPoIB interface scan (start-up, endpoint creation, reload)."""
    FILE = "file"
    """A line of ibacm_addr.cfg."""
    EVENT = "event"
    """Learned from an RTM_NEWADDR event."""


AddressKey = tuple[int, bytes]


def make_address_key(addr_type: int, info: bytes) -> AddressKey:
    """Key under which two local addresses are the same: type + significant bytes (names
    compared case-insensitively), as the C core compares them. A pure function."""
    return match_key(addr_type, pad_address(addr_type, info))


address_key = functools.lru_cache(maxsize=4096)(make_address_key)
"""``make_address_key``, memoised (the trio side's lookups)."""


@dataclass(eq=False)
class AddressSlot:
    """One valid address of an endpoint plus what the core needs to know about it."""

    core: CoreAddress
    owner: EndpointState
    ctx: object
    origin: AddressOrigin
    prefixlen: int | None = None
    ifname: str | None = None

    @functools.cached_property
    def key(self) -> AddressKey:
        # Computed once: every RESOLVE looks its source up by this key.
        return address_key(self.core.type, self.core.info)

    @property
    def endpoint(self) -> CoreEndpoint:
        return self.core.endpoint


@dataclass(eq=False)
class EndpointState:
    port: PortState
    core: CoreEndpoint
    ctx: object | None = None
    """The provider's endpoint context, once ``open_endpoint`` ran."""
    slots: list[AddressSlot | None] = field(default_factory=list)

    @property
    def pkey(self) -> int:
        return self.core.pkey

    @property
    def id(self) -> str:
        return f"{self.port.id}/0x{self.pkey:04x}"

    def addresses(self) -> list[AddressSlot]:
        return [slot for slot in self.slots if slot is not None]

    def find(self, key: AddressKey) -> AddressSlot | None:
        return next((slot for slot in self.slots if slot is not None and slot.key == key), None)

    def insert(self, slot: AddressSlot) -> None:
        """Put ``slot`` in the first free slot (C reuses invalid slots), else append."""
        for index, current in enumerate(self.slots):
            if current is None:
                self.slots[index] = slot
                break
        else:
            self.slots.append(slot)
        self._sync()

    def remove(self, slot: AddressSlot) -> None:
        for index, current in enumerate(self.slots):
            if current is slot:
                self.slots[index] = None
        self._sync()

    def _sync(self) -> None:
        # The provider sees the valid addresses in slot order through CoreEndpoint.addresses.
        self.core.addresses = [slot.core for slot in self.slots if slot is not None]


@dataclass(eq=False)
class PortState:
    device: DeviceState
    port: Port
    port_num: int
    attrs: PortAttributes | None = None
    core: CorePort | None = None
    """Set while the port is up (ACTIVE and handed to a provider or at least scanned)."""
    provider: Provider | None = None
    ctx: object | None = None
    scope: trio.CancelScope | None = None
    """Cancels the port's nursery (every task the provider started for this port)."""
    sa: SaChannel | None = None
    endpoints: list[EndpointState] = field(default_factory=list)
    """Newest first, as C inserts at the head of the list."""
    reregister_pending: bool = False

    @property
    def up(self) -> bool:
        return self.core is not None

    @property
    def id(self) -> str:
        return f"{self.device.name}/{self.port_num}"

    def endpoint_for(self, pkey: int) -> EndpointState | None:
        return next((ep for ep in self.endpoints if same_partition(ep.pkey, pkey)), None)


@dataclass(eq=False)
class ProviderDevice:
    """A provider's device context and how many ports of the device use it."""

    ctx: object
    ports: int = 0


@dataclass(eq=False)
class DeviceState:
    core: CoreDevice
    ports: list[PortState] = field(default_factory=list)
    provider_devices: dict[Provider, ProviderDevice] = field(default_factory=dict)
    """Per provider: ``open_device`` runs for the first port of the device it gets."""

    @property
    def name(self) -> str:
        return self.core.name


# -- lookups -------------------------------------------------------------------------------------


def up_ports(devices: Sequence[DeviceState], port_filter: int = 0) -> Iterator[PortState]:
    """Ports that are up, in device-list order then port number; optionally one port number."""
    for device in devices:
        for port in device.ports:
            if port.up and (port_filter == 0 or port.port_num == port_filter):
                yield port


def iter_endpoints(devices: Sequence[DeviceState], port_filter: int = 0) -> Iterator[EndpointState]:
    """Endpoints in the order EP_QUERY and PERF_QUERY count them (behavior.md §3.6)."""
    for port in up_ports(devices, port_filter):
        yield from port.endpoints


def endpoint_by_index(
    devices: Sequence[DeviceState], index: int, port_filter: int = 0
) -> EndpointState | None:
    """The ``index``-th endpoint (1-based) in §3.6 order; index 0 never matches."""
    if index < 1:
        return None
    for number, endpoint in enumerate(iter_endpoints(devices, port_filter), start=1):
        if number == index:
            return endpoint
    return None


class DeviceList(list[DeviceState]):
    """The core's device list, with an index of its local addresses by key.

    Every RESOLVE looks its source address up: a walk of devices, ports, endpoints and slots
    touches a dozen objects per request, the index one dict. Beside it, the providers' route
    tables by source address (``Provider.route_table``), which the client loop reads from its
    own thread for every RESOLVE: ``route_tables`` is rebuilt and replaced whole, never
    changed in place, by ``changed()``, which whoever changes the lists (the topology)
    calls: ports up or down, endpoints added or removed, addresses added or removed.
    """

    def __init__(self, devices: Iterable[DeviceState] = ()) -> None:
        super().__init__(devices)
        self._index: dict[AddressKey, AddressSlot] | None = None
        self.route_tables: dict[AddressKey, RouteTable] = {}

    def changed(self) -> None:
        # Rebuilt now, not at the next lookup: the client loop's thread reads the tables, and
        # a closed endpoint's table goes with it at once.
        self._index = None
        self._built()

    def find(self, key: AddressKey) -> AddressSlot | None:
        return self._built().get(key)

    def _built(self) -> dict[AddressKey, AddressSlot]:
        index = self._index
        if index is None:
            index = {}
            for slot in _walk_slots(self):
                index.setdefault(slot.key, slot)  # the first in order wins, as in the walk
            tables = {}
            for key, slot in index.items():
                table = _route_table(slot)
                if table is not None:
                    tables[key] = table
            self.route_tables = tables
            self._index = index
        return index


def _walk_slots(devices: Sequence[DeviceState]) -> Iterator[AddressSlot]:
    """Valid addresses of ports that are up, in device/port/endpoint/slot order."""
    for device in devices:
        for port in device.ports:
            if port.core is None:  # not up
                continue
            for endpoint in port.endpoints:
                for slot in endpoint.slots:
                    if slot is not None:
                        yield slot


def _route_table(slot: AddressSlot) -> RouteTable | None:
    provider = slot.owner.port.provider
    if provider is None:
        return None
    try:
        return provider.route_table(slot.ctx)
    except Exception:
        # A provider's bug costs its requests the fast path (``resolve`` still answers them).
        log.exception("provider route_table failed", address=slot.core.display)
        return None


def find_address(devices: Sequence[DeviceState], addr_type: int, info: bytes) -> AddressSlot | None:
    """The local address equal to (type, info), first in device/port/endpoint order.

    Only NAME, IP and IP6 can be local addresses; other types never match.
    """
    if addr_type not in LOCAL_ADDRESS_TYPES:
        return None
    key = address_key(addr_type, info)
    if isinstance(devices, DeviceList):
        return devices.find(key)
    return next((slot for slot in _walk_slots(devices) if slot.key == key), None)


LOCAL_ADDRESS_TYPES = frozenset((int(AddrType.NAME), int(AddrType.IP), int(AddrType.IP6)))
"""The address types a local address may have (others never match one)."""


def all_addresses(devices: Sequence[DeviceState]) -> Iterator[AddressSlot]:
    for endpoint in iter_endpoints(devices):
        yield from endpoint.addresses()


def _port_matches_path(attrs: PortAttributes, path: PathRecord) -> bool:
    """Does this port qualify as the source of ``path``? (client-protocol.md §5.4)"""
    if path.sgid != ZERO_GID:
        return path.sgid in attrs.gids
    if path.slid != 0:
        return attrs.lid == (path.slid & attrs.lid_mask)
    if path.dgid == ZERO_GID:
        return True
    if path.dgid in attrs.gids:
        return True
    prefix = path.dgid[:8]
    return any(gid[:8] == prefix for gid in attrs.gids)


def find_path_source(devices: Sequence[DeviceState], path: PathRecord) -> AddressSlot | None:
    """The local address a path-form request is served from.

    Within a qualifying port the first partition-matching endpoint that HAS an address is
    used; C gave up on the port when the first matching endpoint had none (defect 11).
    """
    for port in up_ports(devices):
        if port.attrs is None or not _port_matches_path(port.attrs, path):
            continue
        for endpoint in port.endpoints:
            if path.pkey != 0 and not same_partition(path.pkey, endpoint.pkey):
                continue
            addresses = endpoint.addresses()
            if addresses:
                return addresses[0]
    return None


def find_endpoint(devices: Sequence[DeviceState], endpoint_id: str) -> EndpointState | None:
    """An endpoint by its admin id ``<device>/<port>/0x<pkey>`` (pkey compared as a number)."""
    parts = endpoint_id.strip().split("/")
    if len(parts) != 3:
        return None
    device, port_text, pkey_text = parts
    try:
        port_num = int(port_text, 10)
        pkey = int(pkey_text, 16)
    except ValueError:
        return None
    for endpoint in iter_endpoints(devices):
        port = endpoint.port
        if (
            port.device.name.lower() == device.lower()
            and port.port_num == port_num
            and endpoint.pkey == pkey
        ):
            return endpoint
    return None

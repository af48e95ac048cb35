"""Which addresses an endpoint should have (options.md §6.2), as pure functions.

Order: the system IPs of the IPoIB interfaces on the endpoint's port and partition, then the
address-file lines for (device, port, partition) in file order. An address already taken by
an earlier source is skipped and the rest still counts (C stopped at the first duplicate,
defect 20). Display strings: ``addr/prefixlen`` for scanned system IPs, the plain address for
ones learned from address events, and the file's own text for file lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ibacm.config.addr_file import AddrEntry, entries_for
from ibacm.core.model import AddressKey, AddressOrigin, address_key, same_partition
from ibacm.fabric.api import InterfaceAddress, PortAttributes
from ibacm.wire.client import ADDR_LEN, AddrType, pad_address

DISPLAY_MAX = ADDR_LEN - 1
"""Display strings travel NUL-terminated in 64-byte EP_QUERY fields."""


@dataclass(frozen=True, slots=True)
class AddressSpec:
    """An address to put on an endpoint."""

    type: AddrType
    info: bytes
    display: str
    origin: AddressOrigin
    prefixlen: int | None = None
    ifname: str | None = None

    @property
    def key(self) -> AddressKey:
        return address_key(self.type, self.info)


def _display(text: str) -> str:
    raw = text.encode("utf-8", "surrogateescape")[:DISPLAY_MAX]
    return raw.decode("utf-8", "ignore")


def interface_spec(address: InterfaceAddress, *, from_event: bool = False) -> AddressSpec:
    """The spec of an IPoIB interface address (``a.b.c.d/len`` at scan, plain from events)."""
    addr_type = AddrType.IP if address.address.version == 4 else AddrType.IP6
    display = str(address.address) if from_event else address.display
    return AddressSpec(
        type=addr_type,
        info=pad_address(addr_type, address.address.packed),
        display=_display(display),
        origin=AddressOrigin.EVENT if from_event else AddressOrigin.SYSTEM,
        prefixlen=address.prefixlen,
        ifname=address.ifname,
    )


def interface_on(address: InterfaceAddress, attrs: PortAttributes, pkey: int) -> bool:
    """Is this interface on the port (its GID is in the GID table) and the partition?"""
    return address.gid in attrs.gids and same_partition(address.pkey, pkey)


def system_specs(
    addresses: Iterable[InterfaceAddress], attrs: PortAttributes, pkey: int
) -> list[AddressSpec]:
    return [interface_spec(a) for a in addresses if interface_on(a, attrs, pkey)]


def file_specs(
    entries: Iterable[AddrEntry], device: str, port_num: int, pkey: int, default_pkey: int
) -> list[AddressSpec]:
    specs = []
    for entry in entries_for(entries, device, port_num, pkey, default_pkey):
        addr_type = AddrType(entry.type)
        specs.append(
            AddressSpec(
                type=addr_type,
                info=pad_address(addr_type, entry.address_bytes),
                display=_display(entry.address),
                origin=AddressOrigin.FILE,
            )
        )
    return specs


def endpoint_specs(
    *,
    device: str,
    attrs: PortAttributes,
    pkey: int,
    interfaces: Sequence[InterfaceAddress],
    entries: Sequence[AddrEntry],
) -> tuple[list[AddressSpec], list[AddressSpec]]:
    """(addresses in slot order, duplicates that were skipped) for endpoint (port, pkey)."""
    default_pkey = attrs.pkeys[0] if attrs.pkeys else 0xFFFF
    chosen: list[AddressSpec] = []
    skipped: list[AddressSpec] = []
    seen: set[AddressKey] = set()
    for spec in [
        *system_specs(interfaces, attrs, pkey),
        *file_specs(entries, device, attrs.port_num, pkey, default_pkey),
    ]:
        if spec.key in seen:
            skipped.append(spec)
            continue
        seen.add(spec.key)
        chosen.append(spec)
    return chosen, skipped


def endpoint_pkeys(attrs: PortAttributes) -> list[int]:
    """The P_Keys that get an endpoint, in table order: one per partition, none for 0."""
    pkeys: list[int] = []
    for pkey in attrs.pkeys:
        if pkey & 0x7FFF and not any(same_partition(pkey, taken) for taken in pkeys):
            pkeys.append(pkey)
    return pkeys

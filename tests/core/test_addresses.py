"""Which addresses an endpoint gets (ibacm.core.addresses, options.md §6.2), from the real
address-file parser: system IPs of the port's IPoIB interfaces first, then the file's lines."""

from __future__ import annotations

import ipaddress

from ibacm.config.addr_file import parse_addr_file
from ibacm.core.addresses import endpoint_pkeys, endpoint_specs, interface_spec
from ibacm.core.model import AddressOrigin
from ibacm.fabric.api import InterfaceAddress, PortAttributes, PortState
from ibacm.wire.client import AddrType

GID = bytes.fromhex("fe800000000000000002c903000a2b3c")
OTHER_GID = bytes.fromhex("fe800000000000000002c903000a2b3d")


def port(*pkeys: int) -> PortAttributes:
    return PortAttributes(
        port_num=1,
        state=PortState.ACTIVE,
        lid=3,
        lmc=0,
        sm_lid=1,
        sm_sl=0,
        subnet_timeout=18,
        active_mtu=5,
        active_width=2,
        active_speed=32,
        gids=(GID,),
        pkeys=pkeys or (0xFFFF,),
    )


def interface(address: str, *, gid: bytes = GID, pkey: int = 0xFFFF) -> InterfaceAddress:
    return InterfaceAddress("ib0", ipaddress.ip_address(address), 16, gid, pkey)


def test_system_addresses_come_first_then_file_lines_and_a_duplicate_skips_only_itself() -> None:
    entries, issues = parse_addr_file(
        "10.0.0.1 mlx5_0 1 default\n"  # the interface's own address: a duplicate
        "node1 mlx5_0 1 default\n"
        "10.0.0.9 MLX5_0 1 ffff\n"  # any case, the partition's low 15 bits
        "10.0.0.8 mlx5_0 2 default\n"  # another port
        "10.0.0.7 mlx5_1 1 default\n",  # another device
        support_ips=True,
    )
    assert issues == []
    interfaces = [
        interface("10.0.0.1"),
        interface("10.0.0.2", gid=OTHER_GID),  # not a GID of this port
        interface("10.0.0.3", pkey=0x8002),  # another partition
        interface("fd00::1"),
    ]
    chosen, skipped = endpoint_specs(
        device="mlx5_0", attrs=port(), pkey=0xFFFF, interfaces=interfaces, entries=entries
    )
    assert [(s.display, s.origin) for s in chosen] == [
        ("10.0.0.1/16", AddressOrigin.SYSTEM),
        ("fd00::1/16", AddressOrigin.SYSTEM),
        ("node1", AddressOrigin.FILE),
        ("10.0.0.9", AddressOrigin.FILE),
    ]
    assert [s.type for s in chosen] == [AddrType.IP, AddrType.IP6, AddrType.NAME, AddrType.IP]
    assert [(s.display, s.origin) for s in skipped] == [("10.0.0.1", AddressOrigin.FILE)]
    assert chosen[0].key == skipped[0].key  # the same address whatever its source's text


def test_a_limited_member_partition_shares_the_full_members_endpoint() -> None:
    # One endpoint per partition (membership bit ignored), none for an empty slot or 0x8000.
    assert endpoint_pkeys(port(0xFFFF, 0x7FFF, 0x0000, 0x8000, 0x0002, 0x8002)) == [0xFFFF, 0x0002]


def test_an_address_learned_from_an_event_shows_without_its_prefix_length() -> None:
    scanned = interface_spec(interface("10.0.0.1"))
    learned = interface_spec(interface("10.0.0.1"), from_event=True)
    assert (scanned.display, scanned.origin) == ("10.0.0.1/16", AddressOrigin.SYSTEM)
    assert (learned.display, learned.origin) == ("10.0.0.1", AddressOrigin.EVENT)
    assert learned.key == scanned.key and learned.ifname == "ib0"

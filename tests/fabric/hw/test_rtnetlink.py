"""rtnetlink parsing (pure) and the IPoIB view of a link: GID from the hardware address,
P_Key from sysfs or the link's ipoib data."""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys
from pathlib import Path

import pytest

from ibacm.fabric.hw import rtnetlink as rt
from ibacm.fabric.hw.ipmon import IpMonitor, LinkInfo, interface_gid, ipoib_only

IPOIB_HW = bytes.fromhex("80000048fe800000000000000002c9030001e3f1")


def addr_message(
    msg_type: int, family: int, prefixlen: int, ifindex: int, attrs: list[tuple[int, bytes]]
) -> bytes:
    body = rt.IFADDRMSG.pack(family, prefixlen, 0, 0, ifindex)
    body += b"".join(rt.encode_attribute(kind, payload) for kind, payload in attrs)
    return rt.encode_message(msg_type, 0, 0, body)


def link_message(ifindex: int, arphrd: int, name: str, hwaddr: bytes, pkey: int | None) -> bytes:
    attrs = [
        rt.encode_attribute(rt.Ifla.IFNAME, name.encode() + b"\0"),
        rt.encode_attribute(rt.Ifla.ADDRESS, hwaddr),
    ]
    if pkey is not None:
        data = rt.encode_attribute(rt.IFLA_IPOIB_PKEY, pkey.to_bytes(2, sys.byteorder))
        info = rt.encode_attribute(rt.IFLA_INFO_KIND, b"ipoib\0")
        info += rt.encode_attribute(rt.IFLA_INFO_DATA | 0x8000, data)  # NLA_F_NESTED
        attrs.append(rt.encode_attribute(rt.Ifla.LINKINFO | 0x8000, info))
    body = rt.IFINFOMSG.pack(0, arphrd, ifindex, 0, 0) + b"".join(attrs)
    return rt.encode_message(rt.Rtm.NEWLINK, 0, 0, body)


def test_ipv4_prefers_the_local_address_over_the_peer_address() -> None:
    data = addr_message(
        rt.Rtm.NEWADDR,
        rt.AF_INET,
        24,
        5,
        [
            (rt.Ifa.ADDRESS, bytes([10, 0, 0, 2])),
            (rt.Ifa.LOCAL, bytes([10, 0, 0, 1])),
            (rt.Ifa.LABEL, b"ib0:1\0"),
        ],
    )
    (message,) = rt.split_messages(data)
    parsed = rt.parse_addr(message)
    assert parsed.added and parsed.ifindex == 5 and parsed.prefixlen == 24
    assert parsed.address == ipaddress.IPv4Address("10.0.0.1")
    assert parsed.label == "ib0:1"


def test_ipv6_addresses_come_from_ifa_address_and_removals_are_flagged() -> None:
    data = addr_message(
        rt.Rtm.DELADDR,
        rt.AF_INET6,
        64,
        5,
        [(rt.Ifa.ADDRESS, ipaddress.IPv6Address("fe80::202:c903:1:e3f1").packed)],
    )
    parsed = rt.parse_addr(next(rt.split_messages(data)))
    assert not parsed.added
    assert parsed.address == ipaddress.IPv6Address("fe80::202:c903:1:e3f1")


def test_several_messages_in_one_datagram() -> None:
    first = addr_message(rt.Rtm.NEWADDR, rt.AF_INET, 8, 1, [(rt.Ifa.LOCAL, bytes(4))])
    second = link_message(7, rt.ARPHRD_INFINIBAND, "ib0", IPOIB_HW, 0x8001)
    done = rt.encode_message(rt.NLMSG_DONE, rt.NLM_F_MULTI, 0, bytes(4))
    types = [message.type for message in rt.split_messages(first + second + done)]
    assert types == [rt.Rtm.NEWADDR, rt.Rtm.NEWLINK, rt.NLMSG_DONE]


def test_ipoib_link_carries_gid_and_pkey() -> None:
    link = rt.parse_link(next(rt.split_messages(link_message(7, 32, "ib0", IPOIB_HW, 0x8001))))
    assert (link.ifindex, link.arphrd, link.name, link.kind, link.ipoib_pkey) == (
        7,
        32,
        "ib0",
        "ipoib",
        0x8001,
    )
    info = LinkInfo.from_message(link)
    assert ipoib_only(info)
    assert interface_gid(info.hwaddr) == bytes.fromhex("fe800000000000000002c9030001e3f1")
    assert interface_gid(b"\x02" * 6) == bytes(16)


def test_interface_address_pkey_from_sysfs_then_link_data(tmp_path: Path) -> None:
    (tmp_path / "ib0").mkdir()
    (tmp_path / "ib0" / "pkey").write_text("0x7fff\n")
    monitor = IpMonitor(sysfs_net=tmp_path)
    from_sysfs = LinkInfo(7, "ib0", 32, IPOIB_HW, "ipoib", 0x8001)
    from_link = LinkInfo(8, "ib1", 32, IPOIB_HW, "ipoib", 0x0002)
    default = LinkInfo(9, "ib2", 32, IPOIB_HW)
    v4 = ipaddress.IPv4Address("192.168.1.10")
    # Always with the full-member bit (fabric api).
    assert monitor._interface_address(from_sysfs, v4, 24).pkey == 0xFFFF
    assert monitor._interface_address(from_link, v4, 24).pkey == 0x8002
    address = monitor._interface_address(default, v4, 24)
    assert (address.pkey, address.display, address.ifname) == (0xFFFF, "192.168.1.10/24", "ib2")
    assert address.gid == bytes.fromhex("fe800000000000000002c9030001e3f1")


@pytest.mark.parametrize(
    "data",
    [
        struct.pack("=IHHII", 100, rt.Rtm.NEWADDR, 0, 0, 0),  # length past the datagram
        struct.pack("=IHHII", 8, rt.Rtm.NEWADDR, 0, 0, 0),  # length below the header
    ],
)
def test_inconsistent_lengths_are_rejected(data: bytes) -> None:
    with pytest.raises(rt.RtnetlinkError, match="does not fit"):
        list(rt.split_messages(data))


def test_short_fixed_parts_are_rejected() -> None:
    short = rt.NlMessage(rt.Rtm.NEWADDR, 0, 0, 0, bytes(4))
    with pytest.raises(rt.RtnetlinkError, match="ifaddrmsg: 4 bytes"):
        rt.parse_addr(short)
    with pytest.raises(rt.RtnetlinkError, match="not a link message"):
        rt.parse_link(short)


def test_a_truncated_attribute_ends_the_walk_without_error() -> None:
    good = rt.encode_attribute(rt.Ifa.LOCAL, bytes(4))
    bad = struct.pack("=HH", 40, rt.Ifa.LABEL) + b"abc"
    assert list(rt.attributes(good + bad)) == [(rt.Ifa.LOCAL, bytes(4))]


def test_dump_requests_are_understood_by_the_kernel() -> None:
    """A GETLINK dump on this host answers with at least the loopback link, then DONE."""
    request = rt.dump_request(rt.Rtm.GETLINK, seq=42)
    assert rt.NLMSG_HDR.unpack_from(request)[:4] == (len(request), 18, 0x301, 42)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        sock.bind((0, 0))
        sock.send(request)
        names, done = [], False
        while not done:
            for message in rt.split_messages(sock.recv(65536)):
                if message.type == rt.NLMSG_DONE:
                    done = True
                elif message.type == rt.Rtm.NEWLINK:
                    names.append(rt.parse_link(message).name)
    assert "lo" in names
    with pytest.raises(rt.RtnetlinkError, match="no dump request"):
        rt.dump_request(rt.Rtm.NEWADDR, 1)

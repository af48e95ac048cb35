"""rtnetlink messages for address monitoring, pure codec (bytes in, objects out).

Only what the IP monitor needs: the ``nlmsghdr`` framing of a datagram, ``ifaddrmsg`` with its
``IFA_*`` attributes (RTM_NEWADDR/RTM_DELADDR), ``ifinfomsg`` with ``IFLA_*`` attributes
(RTM_NEWLINK/RTM_DELLINK), and the two dump requests. Netlink headers and the fixed parts are
in host byte order; attribute payloads as the kernel writes them (addresses in network order).
"""

from __future__ import annotations

import enum
import ipaddress
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass

NLMSG_HDR = struct.Struct("=IHHII")
NLATTR_HDR = struct.Struct("=HH")
IFADDRMSG = struct.Struct("=BBBBI")
IFINFOMSG = struct.Struct("=BxHiII")
NLMSGERR_ERROR = struct.Struct("=i")

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4

NLM_F_REQUEST = 0x01
NLM_F_MULTI = 0x02
NLM_F_DUMP = 0x300
NLM_F_DUMP_INTR = 0x10
"""Set on dump messages when the table changed while it was being dumped."""

RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100
MONITOR_GROUPS = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
"""Links plus IPv4 AND IPv6 address events (C listened to IPv4 only, defect 27)."""

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
AF_INET = 2
AF_INET6 = 10

NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER


class Rtm(enum.IntEnum):
    NEWLINK = 16
    DELLINK = 17
    GETLINK = 18
    NEWADDR = 20
    DELADDR = 21
    GETADDR = 22


class Ifa(enum.IntEnum):
    ADDRESS = 1
    LOCAL = 2
    LABEL = 3


class Ifla(enum.IntEnum):
    ADDRESS = 1
    IFNAME = 3
    LINKINFO = 18


IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
IFLA_IPOIB_PKEY = 1


class RtnetlinkError(ValueError):
    """A datagram that does not parse as rtnetlink (length fields inconsistent, ...)."""


@dataclass(frozen=True, slots=True)
class NlMessage:
    type: int
    flags: int
    seq: int
    pid: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class AddrMessage:
    """An RTM_NEWADDR/RTM_DELADDR message."""

    added: bool
    family: int
    prefixlen: int
    ifindex: int
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    """IFA_LOCAL when present (the local end of a point-to-point link), else IFA_ADDRESS."""
    label: str | None


@dataclass(frozen=True, slots=True)
class LinkMessage:
    """An RTM_NEWLINK/RTM_DELLINK message."""

    added: bool
    ifindex: int
    arphrd: int
    name: str
    hwaddr: bytes
    kind: str | None
    ipoib_pkey: int | None


@dataclass(frozen=True, slots=True)
class NlError:
    """An NLMSG_ERROR: ``error`` is 0 for an ACK, else a negative errno."""

    error: int
    seq: int


def split_messages(datagram: bytes) -> Iterator[NlMessage]:
    """The netlink messages of one datagram (each padded to 4 bytes)."""
    offset = 0
    while offset + NLMSG_HDR.size <= len(datagram):
        length, msg_type, flags, seq, pid = NLMSG_HDR.unpack_from(datagram, offset)
        if length < NLMSG_HDR.size or offset + length > len(datagram):
            raise RtnetlinkError(
                f"nlmsghdr at {offset}: length {length} does not fit the {len(datagram)}-byte "
                "datagram"
            )
        yield NlMessage(
            msg_type, flags, seq, pid, datagram[offset + NLMSG_HDR.size : offset + length]
        )
        offset += _align(length)


def attributes(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of consecutive netlink attributes; stops at a malformed one."""
    offset = 0
    while offset + NLATTR_HDR.size <= len(data):
        length, attr_type = NLATTR_HDR.unpack_from(data, offset)
        if length < NLATTR_HDR.size or offset + length > len(data):
            return
        yield attr_type & NLA_TYPE_MASK, data[offset + NLATTR_HDR.size : offset + length]
        offset += _align(length)


def parse_addr(message: NlMessage) -> AddrMessage:
    if message.type not in (Rtm.NEWADDR, Rtm.DELADDR):
        raise RtnetlinkError(f"message type {message.type} is not an address message")
    if len(message.payload) < IFADDRMSG.size:
        raise RtnetlinkError(f"ifaddrmsg: {len(message.payload)} bytes, need {IFADDRMSG.size}")
    family, prefixlen, _flags, _scope, ifindex = IFADDRMSG.unpack_from(message.payload)
    found: dict[int, bytes] = dict(attributes(message.payload[IFADDRMSG.size :]))
    raw = found.get(Ifa.LOCAL, found.get(Ifa.ADDRESS))
    label = found.get(Ifa.LABEL)
    return AddrMessage(
        added=message.type == Rtm.NEWADDR,
        family=family,
        prefixlen=prefixlen,
        ifindex=ifindex,
        address=_ip(family, raw),
        label=_cstring(label) if label is not None else None,
    )


def parse_link(message: NlMessage) -> LinkMessage:
    if message.type not in (Rtm.NEWLINK, Rtm.DELLINK):
        raise RtnetlinkError(f"message type {message.type} is not a link message")
    if len(message.payload) < IFINFOMSG.size:
        raise RtnetlinkError(f"ifinfomsg: {len(message.payload)} bytes, need {IFINFOMSG.size}")
    _family, arphrd, ifindex, _flags, _change = IFINFOMSG.unpack_from(message.payload)
    found = dict(attributes(message.payload[IFINFOMSG.size :]))
    kind, pkey = _link_info(found.get(Ifla.LINKINFO, b""))
    return LinkMessage(
        added=message.type == Rtm.NEWLINK,
        ifindex=ifindex,
        arphrd=arphrd,
        name=_cstring(found.get(Ifla.IFNAME, b"")),
        hwaddr=found.get(Ifla.ADDRESS, b""),
        kind=kind,
        ipoib_pkey=pkey,
    )


def parse_error(message: NlMessage) -> NlError:
    if len(message.payload) < NLMSGERR_ERROR.size:
        raise RtnetlinkError("NLMSG_ERROR without an error code")
    (error,) = NLMSGERR_ERROR.unpack_from(message.payload)
    return NlError(error, message.seq)


def dump_request(rtm: Rtm, seq: int, family: int = 0) -> bytes:
    """An RTM_GETLINK/RTM_GETADDR dump request (the kernel answers NLM_F_MULTI ... DONE)."""
    if rtm == Rtm.GETLINK:
        body = IFINFOMSG.pack(family, 0, 0, 0, 0)
    elif rtm == Rtm.GETADDR:
        body = IFADDRMSG.pack(family, 0, 0, 0, 0)
    else:
        raise RtnetlinkError(f"no dump request for message type {rtm}")
    header = NLMSG_HDR.pack(NLMSG_HDR.size + len(body), rtm, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
    return header + body


def encode_message(msg_type: int, flags: int, seq: int, body: bytes, pid: int = 0) -> bytes:
    """One netlink message (used by tests and dumps); the body is padded to 4 bytes."""
    padded = body + bytes(_align(len(body)) - len(body))
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), msg_type, flags, seq, pid) + padded


def encode_attribute(attr_type: int, payload: bytes) -> bytes:
    length = NLATTR_HDR.size + len(payload)
    return NLATTR_HDR.pack(length, attr_type) + payload + bytes(_align(length) - length)


def _link_info(data: bytes) -> tuple[str | None, int | None]:
    info = dict(attributes(data))
    kind = _cstring(info[IFLA_INFO_KIND]) if IFLA_INFO_KIND in info else None
    pkey = None
    if kind == "ipoib":
        payload = dict(attributes(info.get(IFLA_INFO_DATA, b""))).get(IFLA_IPOIB_PKEY)
        if payload is not None and len(payload) >= 2:
            pkey = int.from_bytes(payload[:2], sys.byteorder)
    return kind, pkey


def _ip(family: int, raw: bytes | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if raw is None:
        return None
    if family == AF_INET and len(raw) == 4:
        return ipaddress.IPv4Address(raw)
    if family == AF_INET6 and len(raw) == 16:
        return ipaddress.IPv6Address(raw)
    return None


def _cstring(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _align(length: int) -> int:
    return (length + 3) & ~3

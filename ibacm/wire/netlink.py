"""The kernel's RDMA netlink local-service protocol (RDMA_NL_LS), pure codecs.

behavior.md §16. Netlink is a same-host protocol in the CPU's byte order, so headers,
attribute headers and the host-order payloads (SERVICE_ID, PKEY, QOS_CLASS, TIMEOUT, path
flags) use the native order; GIDs and the 64-byte path record are big-endian as everywhere.

Beyond C: IP_RESOLVE requests (IP -> GID for IB routers) and the TIMEOUT attribute are
understood, SET_TIMEOUT can be sent, several path records can be returned, and QOS_CLASS is
shifted into place (C masks it, defect #48).

Validation follows §16.3 and tells the caller what to do by exception class:
``NetlinkLengthError`` / ``NetlinkClientError`` -> drop silently (C drops these);
``LsRequestError`` and subclasses -> answer with ``encode_ls_error_reply(err.hdr, pid)``.
"""

from __future__ import annotations

import enum
import ipaddress
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ibacm.wire.buffer import Buffer
from ibacm.wire.client import EpFlag, PathFlag
from ibacm.wire.errors import (
    BadLengthError,
    BadOpcodeError,
    FieldRangeError,
    WireError,
    check_bytes,
    check_min_length,
    check_uint,
)
from ibacm.wire.path_record import GID_LEN, PathRecord

HOST_ORDER: Literal["little", "big"] = "little" if sys.byteorder == "little" else "big"

NETLINK_RDMA = 20
RDMA_NL_LS = 4
RDMA_NL_GROUP_LS = 3
RDMA_NL_LS_GROUP_MASK = 1 << (RDMA_NL_GROUP_LS - 1)  # nl_groups value: 4
NLMSG_HDRLEN = 16
NLA_HDRLEN = 4
NLM_F_REQUEST = 0x0001
RDMA_NL_LS_F_ERR = 0x0100
NLA_F_MANDATORY = 0x2000  # RDMA_NLA_F_MANDATORY
NLA_F_NET_BYTEORDER = 0x4000
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x1FFF
LS_DEVICE_NAME_MAX = 64
LS_RESOLVE_HDR_LEN = 66  # device_name[64], port_num, path_use
LS_RESOLVE_HDR_ALIGNED = 68
LS_IP_RESOLVE_HDR_LEN = 4  # u32 ifindex
PATH_REC_DATA_LEN = 72  # struct ib_path_rec_data: flags, reserved, path_rec[64]
LS_TIMEOUT_DEFAULT_MS = 2000
LS_TIMEOUT_MIN_MS = 100
LS_TIMEOUT_MAX_MS = 200000


class LsOp(enum.IntEnum):
    RESOLVE = 0
    SET_TIMEOUT = 1
    IP_RESOLVE = 2


RDMA_NL_LS_OP_RESOLVE = LsOp.RESOLVE
RDMA_NL_LS_OP_SET_TIMEOUT = LsOp.SET_TIMEOUT
RDMA_NL_LS_OP_IP_RESOLVE = LsOp.IP_RESOLVE


class LsAttr(enum.IntEnum):
    PATH_RECORD = 1
    TIMEOUT = 2
    SERVICE_ID = 3
    DGID = 4
    SGID = 5
    TCLASS = 6
    PKEY = 7
    QOS_CLASS = 8
    IPV4 = 9
    IPV6 = 10


class PathUse(enum.IntEnum):
    ALL = 0
    UNIDIRECTIONAL = 1
    GMP = 2


IbPathFlag = PathFlag
"""``IB_PATH_*`` flags of a PATH_RECORD attribute: the same bits as ``IBV_PATH_FLAG_*``."""

# Payload sizes of the attributes a request may carry; PATH_RECORD is reply-only.
_REQUEST_ATTR_SIZES: dict[int, int] = {
    LsAttr.TIMEOUT: 4,
    LsAttr.SERVICE_ID: 8,
    LsAttr.DGID: GID_LEN,
    LsAttr.SGID: GID_LEN,
    LsAttr.TCLASS: 1,
    LsAttr.PKEY: 2,
    LsAttr.QOS_CLASS: 2,
    LsAttr.IPV4: 4,
    LsAttr.IPV6: 16,
}


def ls_type(op: int) -> int:
    """The nlmsg_type of an LS message: client 4 in bits 15..10, op below (RESOLVE = 0x1000)."""
    return (RDMA_NL_LS << 10) | check_uint("op", op, 10)


def reply_path_flags(path_use: int) -> int:
    """Flags ibacm gives its PATH_RECORD reply: 0x0A for UNIDIRECTIONAL, else 0x2B (§16.4)."""
    if path_use == PathUse.UNIDIRECTIONAL:
        return int(IbPathFlag.PRIMARY | IbPathFlag.OUTBOUND)
    return int(IbPathFlag.PRIMARY | IbPathFlag.GMP | IbPathFlag.BIDIRECTIONAL)


def clamp_timeout(timeout_ms: int) -> int:
    """The kernel clamps the local-service timeout to 100..200000 ms."""
    return max(LS_TIMEOUT_MIN_MS, min(LS_TIMEOUT_MAX_MS, timeout_ms))


# -- errors -------------------------------------------------------------------------------


class NetlinkLengthError(BadLengthError):
    """Not a valid netlink message (NLMSG_OK fails): drop it."""


class NetlinkClientError(BadOpcodeError):
    """A netlink message for another RDMA client than LS: drop it."""


class LsRequestError(WireError):
    """An LS request ibacm cannot serve; answer it with an error reply to ``hdr``."""

    def __init__(self, hdr: NlMsgHdr, message: str) -> None:
        super().__init__(message)
        self.hdr = hdr


class LsHeaderError(LsRequestError):
    """The family header (resolve or IP-resolve header) is cut short."""


class LsAttributeError(LsRequestError):
    """An attribute has the wrong length or value, or is unknown but mandatory."""


class LsUnsupportedOpError(LsRequestError):
    """An LS operation this side does not serve (or a request missing what it needs)."""


# -- header -------------------------------------------------------------------------------


@dataclass(slots=True)
class NlMsgHdr:
    """``struct nlmsghdr`` (16 bytes, host order)."""

    len: int = NLMSG_HDRLEN
    type: int = 0
    flags: int = 0
    seq: int = 0
    pid: int = 0

    @property
    def client(self) -> int:
        return (self.type >> 10) & 0x3F

    @property
    def op(self) -> int:
        return self.type & 0x3FF

    def encode(self) -> bytes:
        buf = Buffer(capacity=NLMSG_HDRLEN)
        buf.push_uint(self.len, 4, HOST_ORDER, "nlmsg_len")
        buf.push_uint(self.type, 2, HOST_ORDER, "nlmsg_type")
        buf.push_uint(self.flags, 2, HOST_ORDER, "nlmsg_flags")
        buf.push_uint(self.seq, 4, HOST_ORDER, "nlmsg_seq")
        buf.push_uint(self.pid, 4, HOST_ORDER, "nlmsg_pid")
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> NlMsgHdr:
        check_min_length("nlmsghdr", data, NLMSG_HDRLEN)
        buf = Buffer(data[:NLMSG_HDRLEN])
        return cls(
            len=buf.pull_uint(4, HOST_ORDER),
            type=buf.pull_uint(2, HOST_ORDER),
            flags=buf.pull_uint(2, HOST_ORDER),
            seq=buf.pull_uint(4, HOST_ORDER),
            pid=buf.pull_uint(4, HOST_ORDER),
        )


# -- attributes ---------------------------------------------------------------------------


def _align4(length: int) -> int:
    return (length + 3) & ~3


def walk_attrs(data: bytes) -> list[tuple[int, bytes]]:
    """(raw type, payload) of each attribute, walked like C: stop at the first bad header."""
    attrs: list[tuple[int, bytes]] = []
    offset = 0
    while len(data) - offset >= NLA_HDRLEN:
        nla_len = int.from_bytes(data[offset : offset + 2], HOST_ORDER)
        nla_type = int.from_bytes(data[offset + 2 : offset + 4], HOST_ORDER)
        if not NLA_HDRLEN <= nla_len <= len(data) - offset:
            break
        attrs.append((nla_type, bytes(data[offset + NLA_HDRLEN : offset + nla_len])))
        offset += _align4(nla_len)
    return attrs


def _push_attr(buf: Buffer, attr_type: int, payload: bytes) -> None:
    buf.push_uint(NLA_HDRLEN + len(payload), 2, HOST_ORDER, "nla_len")
    buf.push_uint(attr_type, 2, HOST_ORDER, "nla_type")
    buf.push_bytes(payload)
    buf.push_zeros(_align4(len(payload)) - len(payload))


def _host_uint(payload: bytes) -> int:
    return int.from_bytes(payload, HOST_ORDER)


def _validate_request_attrs(hdr: NlMsgHdr, attrs: Sequence[tuple[int, bytes]]) -> None:
    """§16.3 item 4: known attributes need their exact size, unknown mandatory ones fail."""
    for raw_type, payload in attrs:
        attr = raw_type & NLA_TYPE_MASK
        size = _REQUEST_ATTR_SIZES.get(attr)
        if size is None:
            if raw_type & NLA_F_MANDATORY:
                raise LsAttributeError(
                    hdr, f"attribute type {attr} (0x{raw_type:04x}) is unknown but mandatory"
                )
            continue
        if len(payload) != size:
            raise LsAttributeError(
                hdr,
                f"attribute {LsAttr(attr).name}: payload of {len(payload)} bytes, expected {size}",
            )
        if attr == LsAttr.QOS_CLASS and _host_uint(payload) > 0xFFF:
            raise LsAttributeError(
                hdr, f"attribute QOS_CLASS: value {_host_uint(payload)} exceeds 12 bits"
            )


def _last_attr(attrs: Sequence[tuple[int, bytes]], wanted: LsAttr) -> bytes | None:
    # C applies attributes in order, so the last occurrence wins.
    found = None
    for raw_type, payload in attrs:
        if raw_type & NLA_TYPE_MASK == wanted:
            found = payload
    return found


class _RequestAttrs:
    """Typed views of the attributes of a request (``attrs`` is the single source)."""

    __slots__ = ()
    attrs: list[tuple[int, bytes]]

    def _value(self, attr: LsAttr) -> int | None:
        payload = _last_attr(self.attrs, attr)
        return None if payload is None else _host_uint(payload)

    @property
    def service_id(self) -> int | None:
        return self._value(LsAttr.SERVICE_ID)

    @property
    def dgid(self) -> bytes | None:
        return _last_attr(self.attrs, LsAttr.DGID)

    @property
    def sgid(self) -> bytes | None:
        return _last_attr(self.attrs, LsAttr.SGID)

    @property
    def tclass(self) -> int | None:
        return self._value(LsAttr.TCLASS)

    @property
    def pkey(self) -> int | None:
        return self._value(LsAttr.PKEY)

    @property
    def qos_class(self) -> int | None:
        return self._value(LsAttr.QOS_CLASS)

    @property
    def timeout_ms(self) -> int | None:
        return self._value(LsAttr.TIMEOUT)

    @property
    def ip_address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """The last IPV4 or IPV6 attribute."""
        found: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
        for raw_type, payload in self.attrs:
            attr = raw_type & NLA_TYPE_MASK
            if attr == LsAttr.IPV4 and len(payload) == 4:
                found = ipaddress.IPv4Address(payload)
            elif attr == LsAttr.IPV6 and len(payload) == 16:
                found = ipaddress.IPv6Address(payload)
        return found


# -- messages -----------------------------------------------------------------------------


@dataclass(slots=True)
class LsResolveRequest(_RequestAttrs):
    """A kernel PathRecord query (op RESOLVE)."""

    hdr: NlMsgHdr
    device_name: str
    port_num: int
    path_use: int
    attrs: list[tuple[int, bytes]] = field(default_factory=list)

    def to_path(self) -> tuple[PathRecord, EpFlag]:
        """The path-form record the core resolves (§16.3 item 4) and the entry flags.

        reversible_numpath = 0x01 for UNIDIRECTIONAL, else 0x81; DGID sets DEST, SGID sets
        SOURCE; QOS_CLASS goes into bits 15..4 of qosclass_sl (fixing C defect #48).
        """
        _validate_request_attrs(self.hdr, self.attrs)
        path = PathRecord(reversible=self.path_use != PathUse.UNIDIRECTIONAL, numb_path=1)
        flags = EpFlag(0)
        for raw_type, payload in self.attrs:
            attr = raw_type & NLA_TYPE_MASK
            if attr == LsAttr.SERVICE_ID:
                path.service_id = _host_uint(payload)
            elif attr == LsAttr.DGID:
                path.dgid = payload
                flags |= EpFlag.DEST
            elif attr == LsAttr.SGID:
                path.sgid = payload
                flags |= EpFlag.SOURCE
            elif attr == LsAttr.TCLASS:
                path.tclass = payload[0]
            elif attr == LsAttr.PKEY:
                path.pkey = _host_uint(payload)
            elif attr == LsAttr.QOS_CLASS:
                path.qos_class = _host_uint(payload)
        return path, flags

    def encode(self) -> bytes:
        buf = Buffer(self.hdr.encode())
        buf.seek(NLMSG_HDRLEN)
        buf.push_bytes(_device_name_bytes(self.device_name))
        buf.push_uint8(self.port_num, "port_num")
        buf.push_uint8(self.path_use, "path_use")
        buf.push_zeros(LS_RESOLVE_HDR_ALIGNED - LS_RESOLVE_HDR_LEN)
        for attr_type, payload in self.attrs:
            _push_attr(buf, attr_type, payload)
        return _finish(buf)


@dataclass(slots=True)
class LsIpResolveRequest(_RequestAttrs):
    """A kernel IP -> GID query (op IP_RESOLVE): ifindex header plus an IPV4/IPV6 attribute."""

    hdr: NlMsgHdr
    ifindex: int
    attrs: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        address = self.ip_address
        if address is None:
            raise LsUnsupportedOpError(self.hdr, "IP_RESOLVE request without IPV4/IPV6 attribute")
        return address

    def encode(self) -> bytes:
        buf = Buffer(self.hdr.encode())
        buf.seek(NLMSG_HDRLEN)
        buf.push_uint(self.ifindex, 4, HOST_ORDER, "ifindex")
        for attr_type, payload in self.attrs:
            _push_attr(buf, attr_type, payload)
        return _finish(buf)


@dataclass(slots=True)
class LsSetTimeout:
    """SET_TIMEOUT (service -> kernel): the local-service timeout in ms."""

    hdr: NlMsgHdr
    timeout_ms: int


@dataclass(slots=True)
class LsPathReply:
    """A successful RESOLVE reply: (IB_PATH_* flags, record) per PATH_RECORD attribute."""

    hdr: NlMsgHdr
    paths: list[tuple[int, PathRecord]]


@dataclass(slots=True)
class LsIpResolveReply:
    """A successful IP_RESOLVE reply: the GID(s) from DGID attributes."""

    hdr: NlMsgHdr
    gids: list[bytes]


@dataclass(slots=True)
class LsErrorReply:
    """Any reply flagged RDMA_NL_LS_F_ERR."""

    hdr: NlMsgHdr


LsMessage = (
    LsResolveRequest
    | LsIpResolveRequest
    | LsSetTimeout
    | LsPathReply
    | LsIpResolveReply
    | LsErrorReply
)


def _finish(buf: Buffer) -> bytes:
    # Patch nlmsg_len once the size is known.
    length = buf.tell()
    buf.seek(0)
    buf.push_uint(length, 4, HOST_ORDER, "nlmsg_len")
    return buf.data[:length]


def _device_name_bytes(name: str) -> bytes:
    raw = name.encode("utf-8")
    if not raw or b"\0" in raw or len(raw) > LS_DEVICE_NAME_MAX - 1:
        raise FieldRangeError(
            f"device_name: {name!r} must be 1..{LS_DEVICE_NAME_MAX - 1} bytes without NUL"
        )
    return raw.ljust(LS_DEVICE_NAME_MAX, b"\0")


def decode_ls_message(data: bytes) -> LsMessage:
    """Decode the netlink message at the start of ``data`` (one datagram).

    Requests (NLM_F_REQUEST set): RESOLVE, IP_RESOLVE and SET_TIMEOUT; any other op raises
    ``LsUnsupportedOpError``. Replies: error replies, path replies, IP-resolve replies.
    See the module docstring for which exceptions mean "drop" and which mean "reply error".
    """
    if len(data) < NLMSG_HDRLEN:
        raise NetlinkLengthError(f"netlink: {len(data)} bytes, a header needs {NLMSG_HDRLEN}")
    hdr = NlMsgHdr.decode(data)
    if not NLMSG_HDRLEN <= hdr.len <= len(data):
        raise NetlinkLengthError(
            f"netlink: nlmsg_len {hdr.len} outside {NLMSG_HDRLEN}..{len(data)} received"
        )
    if hdr.client != RDMA_NL_LS:
        raise NetlinkClientError(
            f"netlink: client {hdr.client} (type 0x{hdr.type:04x}) is not RDMA_NL_LS (4)"
        )
    payload = bytes(data[NLMSG_HDRLEN : hdr.len])
    if hdr.flags & NLM_F_REQUEST:
        return _decode_request(hdr, payload)
    return _decode_reply(hdr, payload)


def _decode_request(hdr: NlMsgHdr, payload: bytes) -> LsMessage:
    if hdr.op == LsOp.RESOLVE:
        if len(payload) < LS_RESOLVE_HDR_LEN + NLA_HDRLEN:
            raise LsHeaderError(
                hdr,
                f"RESOLVE: {len(payload)} payload bytes, the resolve header and one attribute "
                f"need {LS_RESOLVE_HDR_LEN + NLA_HDRLEN}",
            )
        attrs = walk_attrs(payload[LS_RESOLVE_HDR_ALIGNED:])
        _validate_request_attrs(hdr, attrs)
        name = payload[:LS_DEVICE_NAME_MAX].split(b"\0", 1)[0].decode("utf-8", "replace")
        return LsResolveRequest(
            hdr=hdr,
            device_name=name,
            port_num=payload[LS_DEVICE_NAME_MAX],
            path_use=payload[LS_DEVICE_NAME_MAX + 1],
            attrs=attrs,
        )
    if hdr.op == LsOp.IP_RESOLVE:
        if len(payload) < LS_IP_RESOLVE_HDR_LEN:
            raise LsHeaderError(
                hdr, f"IP_RESOLVE: {len(payload)} payload bytes, the ifindex header needs 4"
            )
        attrs = walk_attrs(payload[LS_IP_RESOLVE_HDR_LEN:])
        _validate_request_attrs(hdr, attrs)
        request = LsIpResolveRequest(
            hdr=hdr, ifindex=_host_uint(payload[:LS_IP_RESOLVE_HDR_LEN]), attrs=attrs
        )
        request.address  # noqa: B018 - raises when the address attribute is missing
        return request
    if hdr.op == LsOp.SET_TIMEOUT:
        attrs = walk_attrs(payload)
        _validate_request_attrs(hdr, attrs)
        timeout = _last_attr(attrs, LsAttr.TIMEOUT)
        if timeout is None:
            raise LsUnsupportedOpError(hdr, "SET_TIMEOUT without a TIMEOUT attribute")
        return LsSetTimeout(hdr=hdr, timeout_ms=_host_uint(timeout))
    raise LsUnsupportedOpError(hdr, f"LS op {hdr.op} is not supported")


def _decode_reply(hdr: NlMsgHdr, payload: bytes) -> LsMessage:
    if hdr.flags & RDMA_NL_LS_F_ERR:
        return LsErrorReply(hdr=hdr)
    attrs = walk_attrs(payload)
    if hdr.op == LsOp.RESOLVE:
        paths = []
        for raw_type, body in attrs:
            if raw_type & NLA_TYPE_MASK != LsAttr.PATH_RECORD:
                continue
            if len(body) != PATH_REC_DATA_LEN:
                raise BadLengthError(
                    f"PATH_RECORD: {len(body)} bytes, expected {PATH_REC_DATA_LEN}"
                )
            flags = _host_uint(body[:4])
            paths.append((flags, PathRecord.decode(body[8:])))
        return LsPathReply(hdr=hdr, paths=paths)
    if hdr.op == LsOp.IP_RESOLVE:
        gids = []
        for raw_type, body in attrs:
            if raw_type & NLA_TYPE_MASK == LsAttr.DGID:
                gids.append(check_bytes("DGID", body, GID_LEN))
        return LsIpResolveReply(hdr=hdr, gids=gids)
    raise BadOpcodeError(f"LS reply for op {hdr.op} is not understood")


# -- encoders -----------------------------------------------------------------------------


def encode_ls_resolve_request(
    seq: int,
    device_name: str,
    port_num: int,
    path_use: int,
    *,
    service_id: int | None = None,
    dgid: bytes | None = None,
    sgid: bytes | None = None,
    tclass: int | None = None,
    pkey: int | None = None,
    qos_class: int | None = None,
    timeout_ms: int | None = None,
    pid: int = 0,
    mandatory: bool = True,
    extra_attrs: Sequence[tuple[int, bytes]] = (),
) -> bytes:
    """A RESOLVE request as the kernel sends it (attributes in the kernel's order)."""
    flag = NLA_F_MANDATORY if mandatory else 0
    attrs: list[tuple[int, bytes]] = []
    if service_id is not None:
        attrs.append((flag | LsAttr.SERVICE_ID, _host_bytes("service_id", service_id, 8)))
    if dgid is not None:
        attrs.append((flag | LsAttr.DGID, check_bytes("dgid", dgid, GID_LEN)))
    if sgid is not None:
        attrs.append((flag | LsAttr.SGID, check_bytes("sgid", sgid, GID_LEN)))
    if tclass is not None:
        attrs.append((flag | LsAttr.TCLASS, _host_bytes("tclass", tclass, 1)))
    if pkey is not None:
        attrs.append((flag | LsAttr.PKEY, _host_bytes("pkey", pkey, 2)))
    if qos_class is not None:
        check_uint("qos_class", qos_class, 12)
        attrs.append((flag | LsAttr.QOS_CLASS, _host_bytes("qos_class", qos_class, 2)))
    if timeout_ms is not None:
        attrs.append((flag | LsAttr.TIMEOUT, _host_bytes("timeout_ms", timeout_ms, 4)))
    attrs.extend(extra_attrs)
    hdr = NlMsgHdr(type=ls_type(LsOp.RESOLVE), flags=NLM_F_REQUEST, seq=seq, pid=pid)
    request = LsResolveRequest(
        hdr=hdr, device_name=device_name, port_num=port_num, path_use=path_use, attrs=attrs
    )
    return request.encode()


def encode_ls_ip_resolve_request(
    seq: int,
    ifindex: int,
    address: str | ipaddress.IPv4Address | ipaddress.IPv6Address,
    pid: int = 0,
) -> bytes:
    """An IP_RESOLVE request as the kernel sends it: ifindex, then a mandatory IPV4/IPV6."""
    try:
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    except ValueError as exc:
        raise FieldRangeError(f"address: {address!r} is not an IP address") from exc
    attr = LsAttr.IPV4 if ip.version == 4 else LsAttr.IPV6
    hdr = NlMsgHdr(type=ls_type(LsOp.IP_RESOLVE), flags=NLM_F_REQUEST, seq=seq, pid=pid)
    request = LsIpResolveRequest(
        hdr=hdr, ifindex=ifindex, attrs=[(NLA_F_MANDATORY | attr, ip.packed)]
    )
    return request.encode()


def encode_ls_path_reply(
    request_hdr: NlMsgHdr, paths: Sequence[tuple[int, PathRecord]], pid: int
) -> bytes:
    """A successful RESOLVE reply: one PATH_RECORD attribute (type 1, no flags) per path."""
    if not paths:
        raise FieldRangeError("paths: a path reply needs at least one path record")
    buf = Buffer(NlMsgHdr(type=request_hdr.type, seq=request_hdr.seq, pid=pid).encode())
    buf.seek(NLMSG_HDRLEN)
    for flags, path in paths:
        body = _host_bytes("path flags", flags, 4) + bytes(4) + path.encode()
        _push_attr(buf, LsAttr.PATH_RECORD, body)
    return _finish(buf)


def encode_ls_error_reply(request_hdr: NlMsgHdr, pid: int) -> bytes:
    """The error reply: header only, flags RDMA_NL_LS_F_ERR, type and seq echoed."""
    return NlMsgHdr(
        type=request_hdr.type, flags=RDMA_NL_LS_F_ERR, seq=request_hdr.seq, pid=pid
    ).encode()


def encode_ls_set_timeout(seq: int, timeout_ms: int, pid: int) -> bytes:
    """SET_TIMEOUT to the kernel: NLM_F_REQUEST plus a plain u32 TIMEOUT attribute.

    The kernel parses this attribute without masking the MANDATORY bit, so it is sent
    without flags.
    """
    buf = Buffer(
        NlMsgHdr(type=ls_type(LsOp.SET_TIMEOUT), flags=NLM_F_REQUEST, seq=seq, pid=pid).encode()
    )
    buf.seek(NLMSG_HDRLEN)
    _push_attr(buf, LsAttr.TIMEOUT, _host_bytes("timeout_ms", timeout_ms, 4))
    return _finish(buf)


def encode_ls_ip_resolve_reply(request_hdr: NlMsgHdr, gids: Sequence[bytes], pid: int) -> bytes:
    """A successful IP_RESOLVE reply: DGID attribute(s) right after the header (no flags)."""
    if not gids:
        raise FieldRangeError("gids: an IP_RESOLVE reply needs at least one GID")
    buf = Buffer(NlMsgHdr(type=request_hdr.type, seq=request_hdr.seq, pid=pid).encode())
    buf.seek(NLMSG_HDRLEN)
    for gid in gids:
        _push_attr(buf, LsAttr.DGID, check_bytes("gid", gid, GID_LEN))
    return _finish(buf)


def _host_bytes(name: str, value: int, size: int) -> bytes:
    return check_uint(name, value, size * 8).to_bytes(size, HOST_ORDER)

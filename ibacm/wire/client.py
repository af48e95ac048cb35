"""The ACM client socket protocol (librdmacm / ib_acme <-> ibacm), pure codecs.

Layouts and rules: client-protocol.md. The protocol mixes byte orders, and this module keeps
that quirk exactly because real clients depend on it (C defect #4, a wire fact):

* ``hdr.length`` is little-endian (host order of every real deployment) for RESOLVE and
  big-endian for PERF_QUERY and EP_QUERY;
* entry ``flags``/``type`` are little-endian; path records, GIDs, counters, EP data are
  big-endian;
* ``tid`` is opaque: stored as an int read little-endian so its 8 bytes round-trip.

Nothing here does I/O: ``ClientFramer`` turns a byte stream into whole messages (h11 style),
the ``encode_*``/``decode_*`` functions turn messages into objects and back.
"""

from __future__ import annotations

import enum
import errno
import ipaddress
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ibacm.wire.buffer import Buffer
from ibacm.wire.counters import ACM_MAX_COUNTER
from ibacm.wire.errors import (
    BadLengthError,
    BadOpcodeError,
    FieldRangeError,
    OversizeError,
    TruncatedError,
    WireError,
    check_bytes,
    check_exact_length,
    check_min_length,
    check_uint,
)
from ibacm.wire.path_record import GID_LEN, PATH_RECORD_LEN, PathRecord, gid_from_text, gid_to_text

ACM_VERSION = 1
HDR_LEN = 16
EP_LEN = 72
MAX_EPS = 8
MSG_MAX = 592  # sizeof(struct acm_msg): the largest request and RESOLVE/PERF reply
EP_CONFIG_LEN = 80
ADDR_LEN = 64  # ACM_MAX_ADDRESS: every address/info field
EP_REPLY_MAX = 65535  # EP_QUERY replies are capped at a 16-bit length
MAX_EP_ADDRS = (EP_REPLY_MAX - HDR_LEN - EP_CONFIG_LEN) // ADDR_LEN  # 1022
PERF_ADDR_LEN = HDR_LEN + EP_LEN  # 88: a request carrying one entry


class AcmOp(enum.IntEnum):
    RESOLVE = 1
    PERF_QUERY = 2
    EP_QUERY = 3


OP_MASK = 0x0F
OP_ACK = 0x80


class AcmStatus(enum.IntEnum):
    SUCCESS = 0
    ENOMEM = 1
    EINVAL = 2
    ENODATA = 3
    ENOTCONN = 5
    ETIMEDOUT = 6
    ESRCADDR = 7
    ESRCTYPE = 8
    EDESTADDR = 9
    EDESTTYPE = 10


_STATUS_ERRNO: dict[int, int] = {
    AcmStatus.SUCCESS: 0,
    AcmStatus.ENOMEM: errno.ENOMEM,
    AcmStatus.EINVAL: errno.EINVAL,
    AcmStatus.ENODATA: errno.ENODATA,
    AcmStatus.ENOTCONN: errno.ENOTCONN,
    AcmStatus.ETIMEDOUT: errno.ETIMEDOUT,
    AcmStatus.ESRCADDR: errno.EADDRNOTAVAIL,
    AcmStatus.ESRCTYPE: errno.EINVAL,
    AcmStatus.EDESTADDR: errno.EADDRNOTAVAIL,
    AcmStatus.EDESTTYPE: errno.EINVAL,
}


def status_errno(status: int) -> int:
    """The errno libacm reports for an ACM status (client-protocol.md §3.2); unknown -> EINVAL."""
    return _STATUS_ERRNO.get(status, errno.EINVAL)


class EpFlag(enum.IntFlag):
    SOURCE = 0x1
    DEST = 0x2
    NODELAY = 1 << 30
    QUERY_SA = 1 << 31


class PathFlag(enum.IntFlag):
    """``IBV_PATH_FLAG_*``: the flags word of PATH entries in replies."""

    GMP = 0x01
    PRIMARY = 0x02
    ALTERNATE = 0x04
    OUTBOUND = 0x08
    INBOUND = 0x10
    INBOUND_REVERSE = 0x20
    BIDIRECTIONAL = 0x28


PATH_REPLY_FLAGS = 0x2B  # GMP | PRIMARY | BIDIRECTIONAL, what ibacmp always returns
PATH_ALTERNATE_FLAGS = 0x2D  # GMP | ALTERNATE | BIDIRECTIONAL, for any further path


class AddrType(enum.IntEnum):
    INVALID = 0
    NAME = 1
    IP = 2
    IP6 = 3
    GID = 4
    LID = 5
    PATH = 0x10


ADDR_TYPE_LIMIT = 6  # first invalid address type (ACM_ADDRESS_RESERVED)

# How many bytes of the 64-byte info field carry the address, per type.
_SIGNIFICANT: dict[int, int] = {
    AddrType.NAME: ADDR_LEN,
    AddrType.IP: 4,
    AddrType.IP6: 16,
    AddrType.GID: GID_LEN,
    AddrType.LID: 2,
    AddrType.PATH: ADDR_LEN,
}


def is_address_type(addr_type: int) -> bool:
    """True for the types a SOURCE/DEST entry may carry (1..5)."""
    return 0 < addr_type < ADDR_TYPE_LIMIT


# -- header -------------------------------------------------------------------------------


def _length_little_endian(opcode: int) -> bool:
    # RESOLVE messages (request 0x01, replies 0x01/0x81) carry a host-order length.
    return opcode & OP_MASK == AcmOp.RESOLVE


@dataclass(slots=True)
class AcmHdr:
    """``struct acm_hdr`` (16 bytes).

    ``length`` is encoded little-endian when ``opcode & 0x0F == RESOLVE`` and big-endian
    otherwise: this is how every client reads replies and how a well-formed request looks.
    (The server's framing rule differs for the odd opcode byte 0x81, see ``request_length``.)
    """

    version: int = ACM_VERSION
    opcode: int = 0
    status: int = 0
    data0: int = 0
    data1: int = 0
    data2: int = 0
    length: int = HDR_LEN
    tid: int = 0

    @property
    def op(self) -> int:
        return self.opcode & OP_MASK

    @property
    def is_reply(self) -> bool:
        return bool(self.opcode & OP_ACK)

    def encode(self) -> bytes:
        length = self.length
        if not _length_little_endian(self.opcode) and 0 <= length <= 0xFFFF:
            length = _swap16(length)
        try:
            return _HDR.pack(
                self.version,
                self.opcode,
                self.status,
                self.data0,
                self.data1,
                self.data2,
                length,
                self.tid,
            )
        except (struct.error, TypeError):
            # Some field does not fit: the field-by-field path names it.
            return self._encode_checked()

    def _encode_checked(self) -> bytes:
        buf = Buffer(capacity=HDR_LEN)
        buf.push_uint8(self.version, "version")
        buf.push_uint8(self.opcode, "opcode")
        buf.push_uint8(self.status, "status")
        buf.push_uint8(self.data0, "data[0]")
        buf.push_uint8(self.data1, "data[1]")
        buf.push_uint8(self.data2, "data[2]")
        if _length_little_endian(self.opcode):
            buf.push_uint16_le(self.length, "length")
        else:
            buf.push_uint16(self.length, "length")
        buf.push_uint64_le(self.tid, "tid")
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> AcmHdr:
        """Decode the first 16 bytes of ``data`` (the rest, if any, is not looked at)."""
        check_min_length("acm_hdr", data, HDR_LEN)
        hdr = cls(*_HDR.unpack_from(data))
        if not _length_little_endian(hdr.opcode):
            hdr.length = _swap16(hdr.length)
        return hdr


_HDR = struct.Struct("<6BHQ")
"""``acm_hdr`` with a little-endian length; big-endian lengths are byte-swapped around it."""


def _swap16(value: int) -> int:
    return ((value & 0xFF) << 8) | (value >> 8)


def request_length(first8: bytes) -> int:
    """The length of an incoming request, read the way the C server reads it.

    Server rule (client-protocol.md §2 item 3): the 16-bit length at offset 6 is host order
    (little-endian) only when the opcode byte is exactly 0x01; for every other opcode byte,
    including 0x81, it is big-endian.
    """
    check_min_length("request header", first8, 8)
    if first8[1] == AcmOp.RESOLVE:
        return int.from_bytes(first8[6:8], "little")
    return int.from_bytes(first8[6:8], "big")


def reply_length(first8: bytes) -> int:
    """The length of a reply, read the way clients read it (little-endian iff op is RESOLVE)."""
    check_min_length("reply header", first8, 8)
    if _length_little_endian(first8[1]):
        return int.from_bytes(first8[6:8], "little")
    return int.from_bytes(first8[6:8], "big")


# -- address entries ----------------------------------------------------------------------


def pad_address(addr_type: int, raw: bytes) -> bytes:
    """Zero-pad an address to the 64-byte info field, keeping only its significant bytes.

    4 bytes for IPv4, 16 for IPv6/GID, 2 for a LID, up to the first NUL (max 64) for a name,
    64 for a path record. Peers and the cache compare all 64 bytes, so stray bytes after the
    address must never survive (mad-protocol.md §10 item 2).
    """
    size = _SIGNIFICANT.get(addr_type)
    if size is None:
        raise FieldRangeError(f"address type: {addr_type} has no address layout")
    raw = bytes(raw)
    if addr_type == AddrType.NAME:
        raw = raw[:ADDR_LEN].split(b"\0", 1)[0]
    else:
        if len(raw) < size:
            raise FieldRangeError(
                f"address: type {AddrType(addr_type).name} needs {size} bytes, got {len(raw)}"
            )
        raw = raw[:size]
    return raw.ljust(ADDR_LEN, b"\0")


def _name_bytes(name: str, what: str, allow_empty: bool = False) -> bytes:
    # Names travel NUL-terminated in a 64-byte field, as ib_acme's snprintf writes them.
    if not isinstance(name, str):
        raise FieldRangeError(f"{what}: expected text, got {type(name).__name__}")
    raw = name.encode("utf-8")
    if not raw and not allow_empty:
        raise FieldRangeError(f"{what}: must not be empty")
    if b"\0" in raw:
        raise FieldRangeError(f"{what}: {name!r} contains a NUL character")
    if len(raw) > ADDR_LEN - 1:
        raise FieldRangeError(
            f"{what}: {name!r} is {len(raw)} bytes, at most {ADDR_LEN - 1} fit with the NUL"
        )
    return raw


def _text_from_field(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


_EP = struct.Struct("<IHH64s")
_PATH_ENTRY_HEAD = struct.pack("<IHH", PATH_REPLY_FLAGS, AddrType.PATH, 0)


@dataclass(slots=True)
class EpAddr:
    """``struct acm_ep_addr_data`` (72 bytes): flags, type, reserved, 64-byte info."""

    flags: int
    type: int
    info: bytes = bytes(ADDR_LEN)
    reserved: int = 0

    def encode(self) -> bytes:
        info = self.info
        if len(info) == ADDR_LEN:
            try:
                return _EP.pack(self.flags, self.type, self.reserved, info)
            except (struct.error, TypeError):
                pass  # the field-by-field path names what does not fit
        return self._encode_checked()

    def _encode_checked(self) -> bytes:
        buf = Buffer(capacity=EP_LEN)
        buf.push_uint32_le(self.flags, "flags")
        buf.push_uint16_le(self.type, "type")
        buf.push_uint16_le(self.reserved, "reserved")
        buf.push_bytes(check_bytes("info", self.info, ADDR_LEN))
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> EpAddr:
        check_exact_length("acm_ep_addr_data", data, EP_LEN)
        flags, addr_type, reserved, info = _EP.unpack(data)
        return cls(flags, addr_type, info, reserved)

    # -- constructors -------------------------------------------------------------------

    @classmethod
    def from_ip(
        cls, address: str | ipaddress.IPv4Address | ipaddress.IPv6Address, flags: int = 0
    ) -> EpAddr:
        """An IP (IPv4) or IP6 entry from text or an ``ipaddress`` object."""
        if isinstance(address, str):
            try:
                address = ipaddress.ip_address(address.strip())
            except ValueError as exc:
                raise FieldRangeError(f"address: {address!r} is not an IP address") from exc
        if isinstance(address, ipaddress.IPv4Address):
            return cls(flags, AddrType.IP, pad_address(AddrType.IP, address.packed))
        if isinstance(address, ipaddress.IPv6Address):
            return cls(flags, AddrType.IP6, pad_address(AddrType.IP6, address.packed))
        raise FieldRangeError(f"address: {address!r} is not an IP address")

    @classmethod
    def from_name(cls, name: str, flags: int = 0) -> EpAddr:
        """A NAME entry (1..63 bytes of UTF-8, NUL padded)."""
        return cls(flags, AddrType.NAME, pad_address(AddrType.NAME, _name_bytes(name, "name")))

    @classmethod
    def from_gid(cls, gid: bytes | str, flags: int = 0) -> EpAddr:
        """A GID entry from 16 bytes or IPv6-style text."""
        raw = gid_from_text(gid) if isinstance(gid, str) else check_bytes("gid", gid, GID_LEN)
        return cls(flags, AddrType.GID, pad_address(AddrType.GID, raw))

    @classmethod
    def from_lid(cls, lid: int, flags: int = 0) -> EpAddr:
        """A LID entry: the LID big-endian in the first two bytes."""
        raw = check_uint("lid", lid, 16).to_bytes(2, "big")
        return cls(flags, AddrType.LID, pad_address(AddrType.LID, raw))

    @classmethod
    def from_path(cls, path: PathRecord, flags: int = 0) -> EpAddr:
        return cls(flags, AddrType.PATH, path.encode())

    @classmethod
    def from_text(cls, addr_type: int, text: str, flags: int = 0) -> EpAddr:
        """Parse ``text`` as an address of ``addr_type`` (NAME, IP, IP6, GID or LID)."""
        if addr_type == AddrType.NAME:
            return cls.from_name(text, flags)
        if addr_type in (AddrType.IP, AddrType.IP6):
            entry = cls.from_ip(text, flags)
            if entry.type != addr_type:
                raise FieldRangeError(
                    f"address: {text!r} is not an {AddrType(addr_type).name} address"
                )
            return entry
        if addr_type == AddrType.GID:
            return cls.from_gid(text, flags)
        if addr_type == AddrType.LID:
            try:
                lid = int(text.strip(), 0)
            except ValueError as exc:
                raise FieldRangeError(f"lid: {text!r} is not a number") from exc
            return cls.from_lid(lid, flags)
        raise FieldRangeError(f"address type: {addr_type} cannot be parsed from text")

    # -- accessors ----------------------------------------------------------------------

    @property
    def is_source(self) -> bool:
        return bool(self.flags & EpFlag.SOURCE)

    @property
    def is_dest(self) -> bool:
        return bool(self.flags & EpFlag.DEST)

    def path(self) -> PathRecord:
        """The info field read as a path record (meaningful for type PATH)."""
        return PathRecord.decode(self.info)

    def address_text(self) -> str:
        """Human-readable address: IPv4/IPv6 text, the name, a GID as IPv6, a LID in decimal.

        Other types (PATH, invalid) give a short description; this never raises, so it is
        safe in log lines about malformed requests.
        """
        info = self.info
        if self.type == AddrType.NAME:
            return _text_from_field(info)
        if self.type == AddrType.IP and len(info) >= 4:
            return str(ipaddress.IPv4Address(info[:4]))
        if self.type in (AddrType.IP6, AddrType.GID) and len(info) >= 16:
            return str(ipaddress.IPv6Address(info[:16]))
        if self.type == AddrType.LID and len(info) >= 2:
            return str(int.from_bytes(info[:2], "big"))
        if self.type == AddrType.PATH and len(info) == ADDR_LEN:
            path = self.path()
            return (
                f"path dgid={gid_to_text(path.dgid)} dlid={path.dlid} "
                f"sgid={gid_to_text(path.sgid)} slid={path.slid}"
            )
        return f"type {self.type}: {info.rstrip(bytes(1)).hex()}"

    def significant(self) -> bytes:
        """The info field with everything after the type's significant bytes zeroed."""
        return pad_address(self.type, self.info)


# -- RESOLVE messages ---------------------------------------------------------------------


def _check_message_length(what: str, data: bytes, length: int, maximum: int) -> None:
    if length < HDR_LEN:
        raise BadLengthError(f"{what}: header length {length} is below the 16-byte header")
    if length > maximum:
        raise OversizeError(f"{what}: header length {length} exceeds the maximum {maximum}")
    if len(data) < length:
        raise TruncatedError(f"{what}: header length {length} but only {len(data)} bytes given")
    if len(data) > length:
        raise BadLengthError(f"{what}: header length {length} but {len(data)} bytes given")


def _check_op(what: str, hdr: AcmHdr, op: AcmOp) -> None:
    if hdr.op != op:
        raise BadOpcodeError(
            f"{what}: opcode 0x{hdr.opcode:02x} is not {op.name} (0x{int(op):02x})"
        )


@dataclass(slots=True)
class AcmMessage:
    """A RESOLVE request or reply: header plus up to 8 entries."""

    hdr: AcmHdr
    entries: list[EpAddr] = field(default_factory=list)

    def encode(self) -> bytes:
        """Encode; sets ``hdr.length`` to 16 + 72 * number of entries."""
        if len(self.entries) > MAX_EPS:
            raise OversizeError(
                f"entries: {len(self.entries)} entries, at most {MAX_EPS} fit in {MSG_MAX} bytes"
            )
        self.hdr.length = HDR_LEN + EP_LEN * len(self.entries)
        return self.hdr.encode() + b"".join(entry.encode() for entry in self.entries)

    @classmethod
    def decode(cls, data: bytes) -> AcmMessage:
        """Decode one whole RESOLVE message (exactly ``hdr.length`` bytes).

        Entries = (length - 16) // 72; a trailing partial entry is ignored, as the C server
        does. ``hdr.length`` keeps the value received.
        """
        hdr = AcmHdr.decode(data)
        _check_op("RESOLVE message", hdr, AcmOp.RESOLVE)
        _check_message_length("RESOLVE message", data, hdr.length, MSG_MAX)
        count = (hdr.length - HDR_LEN) // EP_LEN
        unpack = _EP.unpack_from
        entries = []
        for offset in range(HDR_LEN, HDR_LEN + EP_LEN * count, EP_LEN):
            flags, addr_type, reserved, info = unpack(data, offset)
            entries.append(EpAddr(flags, addr_type, info, reserved))
        return cls(hdr=hdr, entries=entries)


def encode_resolve_reply(
    request_hdr: AcmHdr,
    status: int,
    paths: Sequence[PathRecord] = (),
    source: EpAddr | None = None,
    ack: bool = False,
) -> bytes:
    """A RESOLVE reply as the daemon sends it (client-protocol.md §5.5).

    Provider replies keep opcode 0x01 (C quirk, C defect #5), core-detected errors use 0x81
    (``ack=True``). On success the paths come first as PATH entries (the first flagged 0x2B
    primary, any further ones 0x2D alternate), then the optional SOURCE entry the server
    chose; ``data[0..2]`` are zero and the tid is echoed. A failure is a bare 16-byte header.
    """
    hdr = AcmHdr(opcode=AcmOp.RESOLVE | (OP_ACK if ack else 0), status=status, tid=request_hdr.tid)
    if status != AcmStatus.SUCCESS:
        return hdr.encode()
    if not paths:
        raise FieldRangeError("paths: a successful RESOLVE reply needs at least one path record")
    if len(paths) == 1 and source is None and 0 <= hdr.tid < 1 << 64:
        # The cache-hit answer (one path): packed in one go, same bytes as below.
        return (
            _HDR.pack(ACM_VERSION, hdr.opcode, 0, 0, 0, 0, HDR_LEN + EP_LEN, hdr.tid)
            + _PATH_ENTRY_HEAD
            + paths[0].encode()
        )
    entries = [
        EpAddr.from_path(path, PATH_REPLY_FLAGS if index == 0 else PATH_ALTERNATE_FLAGS)
        for index, path in enumerate(paths)
    ]
    if source is not None:
        entries.append(source)
    return AcmMessage(hdr=hdr, entries=entries).encode()


PAIR_LENGTH = HDR_LEN + 2 * EP_LEN
"""A RESOLVE with two entries (a SOURCE and a DEST): what librdmacm and ib_acme send."""
_PAIR = struct.Struct("<IHH64sIHH64s")
_ONE_PATH_HEAD = struct.pack("<6BH", ACM_VERSION, AcmOp.RESOLVE, 0, 0, 0, 0, HDR_LEN + EP_LEN)


ResolvePair = tuple[int, int, int, bytes, int, int, int, bytes]
"""Flags, type, reserved and info of the two entries of a two-entry RESOLVE."""


def unpack_resolve_pair(frame: bytes) -> ResolvePair | None:
    """The fields of both entries of a framed two-entry RESOLVE; None for any other length.

    The common request read without the general ``AcmMessage`` machinery (framing already
    checked version, opcode and length), and without building an object per entry: the
    cache-hit answer needs only the fields."""
    if len(frame) != PAIR_LENGTH:
        return None
    fields: ResolvePair = _PAIR.unpack_from(frame, HDR_LEN)
    return fields


def decode_resolve_pair(frame: bytes) -> tuple[EpAddr, EpAddr] | None:
    """The two entries of a framed two-entry RESOLVE (those ``AcmMessage.decode`` gives);
    None for any other length."""
    fields = unpack_resolve_pair(frame)
    if fields is None:
        return None
    flags0, type0, reserved0, info0, flags1, type1, reserved1, info1 = fields
    return EpAddr(flags0, type0, info0, reserved0), EpAddr(flags1, type1, info1, reserved1)


def encode_one_path_reply(request: bytes, packed_path: bytes) -> bytes:
    """``encode_resolve_reply(AcmHdr.decode(request), SUCCESS, [path])`` from the request's
    bytes and the path's 64 packed bytes: the tid is copied, not decoded and packed again
    (the cache-hit answer)."""
    if len(request) < HDR_LEN or len(packed_path) != PATH_RECORD_LEN:  # the checks' errors
        check_min_length("RESOLVE request", request, HDR_LEN)
        check_exact_length("path", packed_path, PATH_RECORD_LEN)
    return _ONE_PATH_HEAD + request[8:HDR_LEN] + _PATH_ENTRY_HEAD + packed_path


def encode_query_sa_reply(request: AcmMessage, status: int, path: PathRecord | None) -> bytes:
    """The reply to a QUERY_SA request: the request echoed with opcode|0x80 and ``status``.

    Entry 0's path is replaced by ``path`` when the SA answered; ``length`` stays the
    request's own (zero-filled beyond the decoded entries), ``data[0..2]`` are echoed.
    """
    hdr = replace(request.hdr, opcode=request.hdr.opcode | OP_ACK, status=status)
    entries = list(request.entries)
    if path is not None:
        if not entries:
            raise FieldRangeError("request: a QUERY_SA reply with a path needs entry 0")
        entries[0] = replace(entries[0], info=path.encode())
    length = hdr.length
    if not HDR_LEN <= length <= MSG_MAX:
        raise BadLengthError(f"request length: {length} outside {HDR_LEN}..{MSG_MAX}")
    body = b"".join(entry.encode() for entry in entries)
    body = body[: length - HDR_LEN].ljust(length - HDR_LEN, b"\0")
    return hdr.encode() + body


# -- PERF_QUERY ---------------------------------------------------------------------------


class PerfScope(enum.Enum):
    """Which counters a PERF_QUERY asks for, decided exactly as the C server decides."""

    GLOBAL = "global"
    INDEX = "index"
    ADDRESS = "address"


@dataclass(slots=True)
class PerfRequest:
    hdr: AcmHdr
    index: int  # data[1]: endpoint index, 0 = not by index
    source: EpAddr | None  # entry 0 when the request is at least 88 bytes

    @property
    def scope(self) -> PerfScope:
        """client-protocol.md §6: global unless an index or a SOURCE entry says otherwise.

        An entry without the SOURCE flag makes the request global even when an index is set,
        exactly as in C.
        """
        if self.source is None:
            return PerfScope.INDEX if self.index >= 1 else PerfScope.GLOBAL
        if not self.source.is_source:
            return PerfScope.GLOBAL
        return PerfScope.INDEX if self.index >= 1 else PerfScope.ADDRESS


@dataclass(slots=True)
class PerfReply:
    hdr: AcmHdr
    counters: list[int]


def encode_perf_request(index: int = 0, source: EpAddr | None = None, tid: int = 0) -> bytes:
    """A PERF_QUERY request: global (index 0), by endpoint index, or by SOURCE address."""
    hdr = AcmHdr(opcode=AcmOp.PERF_QUERY, data1=index, tid=tid)
    if source is None:
        return hdr.encode()
    hdr.length = PERF_ADDR_LEN
    return hdr.encode() + source.encode()


def decode_perf_request(data: bytes) -> PerfRequest:
    hdr = AcmHdr.decode(data)
    _check_op("PERF_QUERY request", hdr, AcmOp.PERF_QUERY)
    _check_message_length("PERF_QUERY request", data, hdr.length, MSG_MAX)
    source = None
    if hdr.length >= PERF_ADDR_LEN:
        source = EpAddr.decode(data[HDR_LEN:PERF_ADDR_LEN])
    return PerfRequest(hdr=hdr, index=hdr.data1, source=source)


def encode_perf_reply(request_hdr: AcmHdr, status: int, counters: Sequence[int]) -> bytes:
    """The PERF_QUERY reply: 0x82, counters as 64-bit big-endian, count in ``data[0]``.

    On an error status the reply is the bare header with ``data[0]`` left as the request had
    it (C behaviour); ``counters`` are then ignored.
    """
    hdr = AcmHdr(
        opcode=request_hdr.opcode | OP_ACK,
        status=status,
        data0=request_hdr.data0,
        data1=request_hdr.data1,
        tid=request_hdr.tid,
    )
    if status != AcmStatus.SUCCESS:
        return hdr.encode()
    # The C daemon's counters only: a longer reply kills Debian's ib_acme -P (SIGSEGV).
    counters = counters[:ACM_MAX_COUNTER]
    hdr.data0 = len(counters)
    hdr.length = HDR_LEN + 8 * len(counters)
    buf = Buffer(hdr.encode())
    buf.seek(HDR_LEN)
    for number, value in enumerate(counters):
        buf.push_uint64(value, f"counter[{number}]")
    return buf.data


def decode_perf_reply(data: bytes) -> PerfReply:
    hdr = AcmHdr.decode(data)
    _check_op("PERF_QUERY reply", hdr, AcmOp.PERF_QUERY)
    _check_message_length("PERF_QUERY reply", data, hdr.length, MSG_MAX)
    if (hdr.length - HDR_LEN) % 8:
        raise BadLengthError(
            f"PERF_QUERY reply: length {hdr.length} is not 16 + a multiple of 8 counters"
        )
    buf = Buffer(data[HDR_LEN:])
    counters = [buf.pull_uint64(f"counter[{i}]") for i in range((hdr.length - HDR_LEN) // 8)]
    return PerfReply(hdr=hdr, counters=counters)


# -- EP_QUERY -----------------------------------------------------------------------------


@dataclass(slots=True)
class EpRequest:
    hdr: AcmHdr
    index: int  # data[0]: 1-based endpoint number
    port: int  # data[1]: port-number filter, 0 = all ports


def encode_ep_request(index: int, port: int = 0, tid: int = 0) -> bytes:
    return AcmHdr(opcode=AcmOp.EP_QUERY, data0=index, data1=port, tid=tid).encode()


def decode_ep_request(data: bytes) -> EpRequest:
    hdr = AcmHdr.decode(data)
    _check_op("EP_QUERY request", hdr, AcmOp.EP_QUERY)
    _check_message_length("EP_QUERY request", data, hdr.length, MSG_MAX)
    return EpRequest(hdr=hdr, index=hdr.data0, port=hdr.data1)


def _push_text64(buf: Buffer, text: str, what: str) -> None:
    buf.push_bytes(_name_bytes(text, what, allow_empty=True).ljust(ADDR_LEN, b"\0"), what)


@dataclass(slots=True)
class EpConfig:
    """``struct acm_ep_config_data``: one endpoint as EP_QUERY reports it (§4.2)."""

    dev_guid: int
    port_num: int
    phys_port_cnt: int
    pkey: int
    prov_name: str
    addrs: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        """The reply body: 80 bytes plus one 64-byte string per address."""
        buf = Buffer()
        buf.push_uint64(self.dev_guid, "dev_guid")
        buf.push_uint8(self.port_num, "port_num")
        buf.push_uint8(self.phys_port_cnt, "phys_port_cnt")
        buf.push_uint16(0, "rsvd")
        buf.push_uint16(self.pkey, "pkey")
        buf.push_uint16(len(self.addrs), "addr_cnt")
        _push_text64(buf, self.prov_name, "prov_name")
        for number, addr in enumerate(self.addrs):
            _push_text64(buf, addr, f"addrs[{number}]")
        return buf.data

    @classmethod
    def decode(cls, body: bytes) -> EpConfig:
        check_min_length("acm_ep_config_data", body, EP_CONFIG_LEN)
        buf = Buffer(body)
        config = cls(
            dev_guid=buf.pull_uint64("dev_guid"),
            port_num=buf.pull_uint8("port_num"),
            phys_port_cnt=buf.pull_uint8("phys_port_cnt"),
            pkey=0,
            prov_name="",
        )
        buf.pull_uint16("rsvd")
        config.pkey = buf.pull_uint16("pkey")
        count = buf.pull_uint16("addr_cnt")
        if len(body) != EP_CONFIG_LEN + ADDR_LEN * count:
            raise BadLengthError(
                f"acm_ep_config_data: addr_cnt {count} needs "
                f"{EP_CONFIG_LEN + ADDR_LEN * count} bytes, got {len(body)}"
            )
        config.prov_name = _text_from_field(buf.pull_bytes(ADDR_LEN, "prov_name"))
        config.addrs = [
            _text_from_field(buf.pull_bytes(ADDR_LEN, f"addrs[{i}]")) for i in range(count)
        ]
        return config


def encode_ep_reply(request_hdr: AcmHdr, status: int, config: EpConfig | None) -> bytes:
    """The EP_QUERY reply (0x83, big-endian length, may exceed 592 bytes).

    Success needs ``config``; like C, the message is capped at 65535 bytes, so only the first
    1022 addresses are reported. Any other status gives the bare header (``config`` ignored).
    """
    hdr = AcmHdr(
        opcode=request_hdr.opcode | OP_ACK,
        status=status,
        data0=request_hdr.data0,
        tid=request_hdr.tid,
    )
    if status != AcmStatus.SUCCESS:
        return hdr.encode()
    if config is None:
        raise FieldRangeError("config: a successful EP_QUERY reply needs the endpoint config")
    if len(config.addrs) > MAX_EP_ADDRS:
        config = replace(config, addrs=config.addrs[:MAX_EP_ADDRS])
    body = config.encode()
    hdr.length = HDR_LEN + len(body)
    return hdr.encode() + body


def decode_ep_reply(data: bytes) -> tuple[AcmHdr, EpConfig | None]:
    """Decode an EP_QUERY reply; the config is None for an error status or a bare header."""
    hdr = AcmHdr.decode(data)
    _check_op("EP_QUERY reply", hdr, AcmOp.EP_QUERY)
    _check_message_length("EP_QUERY reply", data, hdr.length, EP_REPLY_MAX)
    if hdr.status != AcmStatus.SUCCESS or hdr.length == HDR_LEN:
        return hdr, None
    return hdr, EpConfig.decode(data[HDR_LEN:])


# -- stream framing -----------------------------------------------------------------------


class FramingFault(enum.Enum):
    BAD_VERSION = "bad-version"
    BAD_OPCODE = "bad-opcode"
    BAD_LENGTH = "bad-length"


class FramingError(WireError):
    """The stream cannot be framed any further; the connection must be closed (§8).

    ``fault`` says which rule broke, ``reason`` is the human-readable explanation.
    """

    def __init__(self, fault: FramingFault, reason: str) -> None:
        super().__init__(reason)
        self.fault = fault
        self.reason = reason


def _allowed_request_length(op: int, length: int) -> bool:
    # rdma-core's server takes any message it received whole (length == bytes received, at
    # most 592) and lets the handler read what it needs: a PERF_QUERY shorter than 88 bytes
    # has no SOURCE entry, an EP_QUERY longer than 16 carries bytes nobody reads.
    del op
    return HDR_LEN <= length <= MSG_MAX


def _allowed_reply_length(op: int, length: int) -> bool:
    if op == AcmOp.PERF_QUERY:
        return HDR_LEN <= length <= MSG_MAX and (length - HDR_LEN) % 8 == 0
    if op == AcmOp.EP_QUERY:
        body = length - HDR_LEN - EP_CONFIG_LEN
        return length == HDR_LEN or (body >= 0 and body % ADDR_LEN == 0)
    return HDR_LEN <= length <= MSG_MAX


_OPERATIONS = frozenset(int(op) for op in AcmOp)
_RESOLVE_BYTE = int(AcmOp.RESOLVE)


def _request_length_in(data: bytes | bytearray, at: int) -> int:
    """``request_length``'s rule read in place, of the header at ``at`` (8 bytes there at
    least): little-endian only for opcode byte 0x01."""
    if data[at + 1] == _RESOLVE_BYTE:
        return data[at + 6] | data[at + 7] << 8
    return data[at + 6] << 8 | data[at + 7]


def whole_request(data: bytes) -> bytes | None:
    """``data`` itself when it is exactly one valid request, else None (a read framed
    without a framer of its own: ``ClientFramer.whole`` when nothing is buffered)."""
    if len(data) < HDR_LEN:
        return None
    op = data[1] & OP_MASK
    if data[0] != ACM_VERSION or op not in _OPERATIONS:
        return None
    length = _request_length_in(data, 0)
    if length != len(data) or not _allowed_request_length(op, length):
        return None
    return data


class ClientFramer:
    """Split a client-protocol byte stream into whole messages (sans-I/O, h11 style).

    ``feed`` bytes as they arrive, then call ``next_frame`` until it returns None. Requests
    (the default, server side) are framed with the server's length rule (``request_length``:
    little-endian only for opcode byte 0x01) and must be 16..592 bytes, whatever the operation,
    as rdma-core's server accepts them (a PERF_QUERY of 40 bytes is a global one, an EP_QUERY
    of 88 bytes an EP_QUERY).
    With ``replies=True`` (client side) the client rule applies (little-endian iff the op is
    RESOLVE) and EP_QUERY replies may be up to 65535 bytes.

    Version, opcode and length are checked as soon as their bytes arrive; a violation raises
    ``FramingError`` and the framer stays dead (every later call raises the same error),
    because the stream position is lost and the server closes such connections.
    """

    def __init__(self, *, replies: bool = False) -> None:
        self._replies = replies
        self._buffer = bytearray()
        self._start = 0
        """Where the bytes not yet framed begin in ``_buffer``: frames are taken from the
        front by moving this, not by deleting (which would move the rest of a pipelined
        burst once per frame); the buffer is compacted at the next ``feed``."""
        self._error: FramingError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame (non-zero at EOF = cut message)."""
        return len(self._buffer) - self._start

    @property
    def error(self) -> FramingError | None:
        return self._error

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._start:
            del self._buffer[: self._start]
            self._start = 0
        self._buffer += data

    def next_frame(self) -> bytes | None:
        """One complete message, or None when more bytes are needed."""
        if self._error is not None:
            raise self._error
        length = self._frame_length()
        start = self._start
        if length is None or len(self._buffer) - start < length:
            return None
        end = start + length
        frame = bytes(self._buffer[start:end])
        if end == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        else:
            self._start = end
        return frame

    def whole(self, data: bytes) -> bytes | None:
        """``data`` itself when nothing is buffered and it is exactly one valid request (the
        common read: a client sent one request and waits); else None, with nothing changed
        (then ``feed`` it). Saves the buffer's copies on the way of most requests."""
        if self.buffered or self._replies or self._error is not None:
            return None
        return whole_request(data)

    def head(self, size: int = HDR_LEN) -> bytes:
        """The first ``size`` bytes not yet returned as a frame (after a ``FramingError``:
        the start of the offending message)."""
        start = self._start
        return bytes(self._buffer[start : start + size])

    def _frame_length(self) -> int | None:
        buffer = self._buffer
        at = self._start
        have = len(buffer) - at
        if not have:
            return None
        if buffer[at] != ACM_VERSION:
            self._fail(FramingFault.BAD_VERSION, f"version {buffer[at]}, expected {ACM_VERSION}")
        if have < 2:
            return None
        op = buffer[at + 1] & OP_MASK
        if op not in _OPERATIONS:
            self._fail(
                FramingFault.BAD_OPCODE,
                f"opcode 0x{buffer[at + 1]:02x}: operation {op} is not 1, 2 or 3",
            )
        if have < 8:
            return None
        if self._replies:
            length = reply_length(bytes(buffer[at : at + 8]))
            allowed = _allowed_reply_length(op, length)
        else:
            length = _request_length_in(buffer, at)
            allowed = _allowed_request_length(op, length)
        if not allowed:
            name = AcmOp(op).name
            kind = "reply" if self._replies else "request"
            self._fail(FramingFault.BAD_LENGTH, f"length {length} is not valid for a {name} {kind}")
        return length

    def _fail(self, fault: FramingFault, reason: str) -> None:
        self._error = FramingError(fault, reason)
        raise self._error

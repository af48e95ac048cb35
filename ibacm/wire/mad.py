"""Management datagrams for the SA (class 0x03), pure codecs (mad-protocol.md §9).

A MAD is 256 bytes: the 24-byte common header, then for SA MADs the 32-byte RMPP + SA header,
then 200 bytes of data. ibacm sends PathRecord GETs and MCMemberRecord SETs; the simulated SA
answers them (``build_sa_response``); GetTable answers longer than one MAD travel as RMPP
segments (``split_rmpp`` / ``RmppReassembler``). All fields are big-endian.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field, replace

from ibacm.wire.buffer import Buffer
from ibacm.wire.errors import (
    BadLengthError,
    BadVersionError,
    FieldRangeError,
    OversizeError,
    RmppError,
    check_bytes,
    check_exact_length,
    check_min_length,
    check_uint,
)
from ibacm.wire.path_record import GID_LEN, PATH_RECORD_LEN, ZERO_GID, PathRecord

MAD_SIZE = 256
MAD_HDR_LEN = 24
SA_HDR_END = 56
SA_DATA_LEN = 200
SA_CLASS_HDR_LEN = 20  # SM_Key, AttributeOffset, reserved, ComponentMask (repeated per segment)
RMPP_SEGMENT_PAYLOAD = SA_CLASS_HDR_LEN + SA_DATA_LEN  # 220: what paylen counts per segment
MAX_RMPP_SEGMENTS = 65536  # ~13 MB of records: bounds a reassembly against a runaway sender
MAD_BASE_VERSION = 1
SA_CLASS_VERSION = 2
MC_MEMBER_RECORD_LEN = 56


class MgmtClass(enum.IntEnum):
    SUBN_ADM = 0x03
    ACM = 0x2C


class Method(enum.IntEnum):
    GET = 0x01
    SET = 0x02
    SEND = 0x03
    REPORT = 0x06
    GET_TABLE = 0x12
    DELETE = 0x15
    RESP = 0x80
    GET_RESP = 0x81
    SET_RESP = 0x82
    REPORT_RESP = 0x86
    GET_TABLE_RESP = 0x92
    DELETE_RESP = 0x95


class SaAttr(enum.IntEnum):
    NOTICE = 0x02
    INFORM_INFO = 0x03  # (0x31 is ServiceRecord)
    PATH_RECORD = 0x35
    MC_MEMBER_RECORD = 0x38


class SaStatus(enum.IntEnum):
    """SA class-specific status: the high byte of the MAD status word."""

    NO_RESOURCES = 1
    REQ_INVALID = 2
    NO_RECORDS = 3
    TOO_MANY_RECORDS = 4
    REQ_INVALID_GID = 5
    REQ_INSUFFICIENT_COMPONENTS = 6
    REQ_DENIED = 7


class MadStatus(enum.IntEnum):
    """Generic MAD status: the low byte of the status word (bits 0, 1 and the 2..4 code)."""

    BUSY = 0x01
    REDIRECT = 0x02
    BAD_VERSION = 0x04
    METHOD_UNSUPPORTED = 0x08
    METHOD_ATTR_UNSUPPORTED = 0x0C
    INVALID_FIELD = 0x1C


def sa_status_word(code: int) -> int:
    """The 16-bit MAD status carrying SA class-specific ``code`` (e.g. NO_RECORDS -> 0x0300)."""
    return check_uint("sa status", code, 8) << 8


_MAD_HDR = struct.Struct(">BBBBHHQHHI")
_SA_HDR = struct.Struct(">BBBBIIQHHQ")
_RMPP_HDR = struct.Struct(">BBBBII")
"""Precompiled layouts: an RMPP GetTable answer at scale is hundreds of thousands of MADs."""
_RMPP_HDR_END = MAD_HDR_LEN + _RMPP_HDR.size  # 36: where the SA header proper starts

_RECORD_SIZES: dict[int, int] = {
    SaAttr.PATH_RECORD: PATH_RECORD_LEN,
    SaAttr.MC_MEMBER_RECORD: MC_MEMBER_RECORD_LEN,
}


# -- headers ------------------------------------------------------------------------------


@dataclass(slots=True)
class MadHeader:
    """The 24-byte common MAD header (standard layout with attribute ID and modifier)."""

    base_version: int = MAD_BASE_VERSION
    mgmt_class: int = MgmtClass.SUBN_ADM
    class_version: int = SA_CLASS_VERSION
    method: int = Method.GET
    status: int = 0
    class_specific: int = 0
    tid: int = 0
    attr_id: int = 0
    reserved: int = 0
    attr_mod: int = 0

    def encode(self) -> bytes:
        try:
            return _MAD_HDR.pack(
                self.base_version,
                self.mgmt_class,
                self.class_version,
                self.method,
                self.status,
                self.class_specific,
                self.tid,
                self.attr_id,
                self.reserved,
                self.attr_mod,
            )
        except struct.error:
            return self._encode_checked()  # names the field that does not fit

    def _encode_checked(self) -> bytes:
        buf = Buffer(capacity=MAD_HDR_LEN)
        buf.push_uint8(self.base_version, "base_version")
        buf.push_uint8(self.mgmt_class, "mgmt_class")
        buf.push_uint8(self.class_version, "class_version")
        buf.push_uint8(self.method, "method")
        buf.push_uint16(self.status, "status")
        buf.push_uint16(self.class_specific, "class_specific")
        buf.push_uint64(self.tid, "tid")
        buf.push_uint16(self.attr_id, "attr_id")
        buf.push_uint16(self.reserved, "reserved")
        buf.push_uint32(self.attr_mod, "attr_mod")
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> MadHeader:
        """Decode the first 24 bytes of ``data``."""
        check_min_length("MAD header", data, MAD_HDR_LEN)
        return cls(*_MAD_HDR.unpack_from(data))


class RmppType(enum.IntEnum):
    NONE = 0
    DATA = 1
    ACK = 2
    STOP = 3
    ABORT = 4


class RmppFlag(enum.IntFlag):
    ACTIVE = 0x1
    FIRST = 0x2
    LAST = 0x4


RMPP_VERSION = 1
_RMPP_FLAG_MASK = 0x07  # the low 3 bits of rmpp_rtime_flags; the upper 5 are RespTime
_ACTIVE, _FIRST, _LAST = int(RmppFlag.ACTIVE), int(RmppFlag.FIRST), int(RmppFlag.LAST)
_DATA = int(RmppType.DATA)


@dataclass(slots=True)
class SaHeader:
    """MAD bytes 24..55: the RMPP header (12 bytes) and the SA header (20 bytes)."""

    rmpp_version: int = 0
    rmpp_type: int = 0
    rmpp_flags: int = 0  # the whole rmpp_rtime_flags byte
    rmpp_status: int = 0
    seg_num: int = 0
    paylen_newwin: int = 0
    sm_key: int = 0
    attr_offset: int = 0  # in 8-byte units
    reserved: int = 0
    comp_mask: int = 0

    @property
    def rmpp_active(self) -> bool:
        return bool(self.rmpp_flags & RmppFlag.ACTIVE)

    def encode(self) -> bytes:
        try:
            return _SA_HDR.pack(
                self.rmpp_version,
                self.rmpp_type,
                self.rmpp_flags,
                self.rmpp_status,
                self.seg_num,
                self.paylen_newwin,
                self.sm_key,
                self.attr_offset,
                self.reserved,
                self.comp_mask,
            )
        except struct.error:
            return self._encode_checked()  # names the field that does not fit

    def _encode_checked(self) -> bytes:
        buf = Buffer(capacity=SA_HDR_END - MAD_HDR_LEN)
        buf.push_uint8(self.rmpp_version, "rmpp_version")
        buf.push_uint8(self.rmpp_type, "rmpp_type")
        buf.push_uint8(self.rmpp_flags, "rmpp_rtime_flags")
        buf.push_uint8(self.rmpp_status, "rmpp_status")
        buf.push_uint32(self.seg_num, "seg_num")
        buf.push_uint32(self.paylen_newwin, "paylen_newwin")
        buf.push_uint64(self.sm_key, "sm_key")
        buf.push_uint16(self.attr_offset, "attr_offset")
        buf.push_uint16(self.reserved, "reserved")
        buf.push_uint64(self.comp_mask, "comp_mask")
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> SaHeader:
        """Decode the 32 bytes at MAD offset 24..55 (``data`` is a whole MAD)."""
        check_min_length("SA header", data, SA_HDR_END)
        return cls(*_SA_HDR.unpack_from(data, MAD_HDR_LEN))


@dataclass(slots=True)
class SaMad:
    """A whole SA MAD: headers plus the data area.

    A single MAD has 200 data bytes. A reassembled RMPP transfer (``RmppReassembler``) has a
    longer data area; its SA header then says ACTIVE|FIRST|LAST with ``paylen`` = 20 + the
    exact data length, so ``payload_length`` and ``records`` ignore the zero padding.
    """

    mad: MadHeader = field(default_factory=MadHeader)
    sa: SaHeader = field(default_factory=SaHeader)
    data: bytes = bytes(SA_DATA_LEN)

    def encode(self) -> bytes:
        """Exactly 256 bytes; data longer than 200 bytes needs ``encode_long``/``split_rmpp``."""
        if len(self.data) > SA_DATA_LEN:
            raise OversizeError(
                f"SA data: {len(self.data)} bytes do not fit one MAD ({SA_DATA_LEN}); "
                "use split_rmpp"
            )
        return self.encode_long()

    def encode_long(self) -> bytes:
        """Headers plus the whole data area (padded to at least 200 bytes), unsegmented."""
        return self.mad.encode() + self.sa.encode() + bytes(self.data).ljust(SA_DATA_LEN, b"\0")

    @classmethod
    def decode(cls, data: bytes) -> SaMad:
        """Decode a MAD of at least 256 bytes, keeping the whole data area."""
        check_min_length("SA MAD", data, MAD_SIZE)
        return cls(
            mad=MadHeader.decode(data), sa=SaHeader.decode(data), data=bytes(data[SA_HDR_END:])
        )

    @property
    def sa_status(self) -> int:
        """The class-specific status (what C passes to clients as an ACM status)."""
        return (self.mad.status >> 8) & 0xFF

    @property
    def generic_status(self) -> int:
        """The generic MAD status byte (busy, redirect, unsupported...; C ignores it, #39)."""
        return self.mad.status & 0xFF

    def payload_length(self) -> int:
        """Meaningful data bytes: from RMPP ``paylen`` on a first segment, else all data."""
        sa = self.sa
        if sa.rmpp_active and sa.rmpp_flags & RmppFlag.FIRST and sa.paylen_newwin:
            if sa.paylen_newwin < SA_CLASS_HDR_LEN:
                raise BadLengthError(
                    f"RMPP paylen {sa.paylen_newwin} is below the {SA_CLASS_HDR_LEN}-byte SA header"
                )
            return min(sa.paylen_newwin - SA_CLASS_HDR_LEN, len(self.data))
        return len(self.data)

    def records(self, record_size: int) -> list[bytes]:
        """The records carried: ``attr_offset * 8`` apart in a GetTable reply, else one."""
        stride, count = self.record_layout(record_size)
        return [self.data[i * stride : i * stride + record_size] for i in range(count)]

    def record_layout(self, record_size: int) -> tuple[int, int]:
        """(stride, count) of the records in ``data``: what ``records`` cuts, without cutting
        (a table decoder reads them in place)."""
        if self.mad.method != Method.GET_TABLE_RESP:
            if len(self.data) < record_size:
                raise BadLengthError(
                    f"SA data: {len(self.data)} bytes cannot hold a {record_size}-byte record"
                )
            return record_size, 1
        stride = self.sa.attr_offset * 8
        if stride == 0:
            return record_size, 0  # IBA: AttributeOffset 0 means the table is empty
        if stride < record_size:
            raise BadLengthError(
                f"attr_offset: {self.sa.attr_offset} x 8 = {stride} bytes is shorter than "
                f"a {record_size}-byte record"
            )
        return stride, self.payload_length() // stride


# -- MCMemberRecord -----------------------------------------------------------------------


class McComp(enum.IntFlag):
    """MCMemberRecord component-mask bits."""

    MGID = 1 << 0
    PORT_GID = 1 << 1
    QKEY = 1 << 2
    MLID = 1 << 3
    MTU_SELECTOR = 1 << 4
    MTU = 1 << 5
    TCLASS = 1 << 6
    PKEY = 1 << 7
    RATE_SELECTOR = 1 << 8
    RATE = 1 << 9
    PACKET_LIFE_SELECTOR = 1 << 10
    PACKET_LIFE = 1 << 11
    SL = 1 << 12
    FLOW_LABEL = 1 << 13
    HOP_LIMIT = 1 << 14
    SCOPE = 1 << 15
    JOIN_STATE = 1 << 16
    PROXY_JOIN = 1 << 17


ACM_JOIN_COMP_MASK = 0x1B3F7  # what ibacmp puts in every join (mad-protocol.md §9.6)


@dataclass(slots=True)
class McMemberRecord:
    """The SA MCMemberRecord (56 bytes incl. 4 pad bytes, mad-protocol.md §9.6)."""

    mgid: bytes = ZERO_GID
    port_gid: bytes = ZERO_GID
    qkey: int = 0
    mlid: int = 0
    mtu_selector: int = 0
    mtu: int = 0
    tclass: int = 0
    pkey: int = 0
    rate_selector: int = 0
    rate: int = 0
    packet_life_selector: int = 0
    packet_life: int = 0
    sl: int = 0
    flow_label: int = 0
    hop_limit: int = 0
    scope: int = 0
    join_state: int = 0
    proxy_join: bool = False
    proxy_reserved: int = 0  # low 7 bits of byte 49
    reserved: bytes = bytes(6)  # bytes 50..55 (2 reserved + 4 pad)

    @property
    def sl_flow_hop(self) -> int:
        """Bytes 44..47: SL:4, FlowLabel:20, HopLimit:8."""
        return (
            (check_uint("sl", self.sl, 4) << 28)
            | (check_uint("flow_label", self.flow_label, 20) << 8)
            | check_uint("hop_limit", self.hop_limit, 8)
        )

    @sl_flow_hop.setter
    def sl_flow_hop(self, value: int) -> None:
        check_uint("sl_flow_hop", value, 32)
        self.sl = value >> 28
        self.flow_label = (value >> 8) & 0xFFFFF
        self.hop_limit = value & 0xFF

    @property
    def scope_join(self) -> int:
        """Byte 48: Scope:4, JoinState:4."""
        return (check_uint("scope", self.scope, 4) << 4) | check_uint(
            "join_state", self.join_state, 4
        )

    @property
    def mtu_byte(self) -> int:
        return _selector_byte("mtu", self.mtu_selector, self.mtu)

    @property
    def rate_byte(self) -> int:
        return _selector_byte("rate", self.rate_selector, self.rate)

    @property
    def packetlifetime_byte(self) -> int:
        return _selector_byte("packet_life", self.packet_life_selector, self.packet_life)

    def encode(self) -> bytes:
        buf = Buffer(capacity=MC_MEMBER_RECORD_LEN)
        buf.push_bytes(check_bytes("mgid", self.mgid, GID_LEN))
        buf.push_bytes(check_bytes("port_gid", self.port_gid, GID_LEN))
        buf.push_uint32(self.qkey, "qkey")
        buf.push_uint16(self.mlid, "mlid")
        buf.push_uint8(self.mtu_byte, "mtu")
        buf.push_uint8(self.tclass, "tclass")
        buf.push_uint16(self.pkey, "pkey")
        buf.push_uint8(self.rate_byte, "rate")
        buf.push_uint8(self.packetlifetime_byte, "packetlifetime")
        buf.push_uint32(self.sl_flow_hop, "sl_flow_hop")
        buf.push_uint8(self.scope_join, "scope_join")
        proxy = (0x80 if self.proxy_join else 0) | check_uint(
            "proxy_reserved", self.proxy_reserved, 7
        )
        buf.push_uint8(proxy, "proxy_join")
        buf.push_bytes(check_bytes("reserved", self.reserved, 6))
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> McMemberRecord:
        """Decode exactly 56 bytes."""
        check_exact_length("MCMemberRecord", data, MC_MEMBER_RECORD_LEN)
        buf = Buffer(data)
        record = cls(
            mgid=buf.pull_bytes(GID_LEN, "mgid"),
            port_gid=buf.pull_bytes(GID_LEN, "port_gid"),
            qkey=buf.pull_uint32("qkey"),
            mlid=buf.pull_uint16("mlid"),
        )
        record.mtu_selector, record.mtu = _split_selector(buf.pull_uint8("mtu"))
        record.tclass = buf.pull_uint8("tclass")
        record.pkey = buf.pull_uint16("pkey")
        record.rate_selector, record.rate = _split_selector(buf.pull_uint8("rate"))
        record.packet_life_selector, record.packet_life = _split_selector(buf.pull_uint8())
        record.sl_flow_hop = buf.pull_uint32("sl_flow_hop")
        scope_join = buf.pull_uint8("scope_join")
        record.scope, record.join_state = scope_join >> 4, scope_join & 0xF
        proxy = buf.pull_uint8("proxy_join")
        record.proxy_join, record.proxy_reserved = bool(proxy & 0x80), proxy & 0x7F
        record.reserved = buf.pull_bytes(6, "reserved")
        return record


def _selector_byte(name: str, selector: int, value: int) -> int:
    return (check_uint(f"{name}_selector", selector, 2) << 6) | check_uint(name, value, 6)


def _split_selector(value: int) -> tuple[int, int]:
    return value >> 6, value & 0x3F


# -- request builders ---------------------------------------------------------------------


def sa_mad(method: int, attr_id: int, tid: int, comp_mask: int, data: bytes) -> bytes:
    """An SA MAD: ``method`` of ``attr_id`` carrying ``data`` under ``comp_mask``."""
    mad = MadHeader(method=method, tid=tid, attr_id=attr_id)
    return SaMad(mad=mad, sa=SaHeader(comp_mask=comp_mask), data=data).encode()


def build_path_get(tid: int, path: PathRecord, comp_mask: int | None = None) -> bytes:
    """SubnAdmGet(PathRecord), class version 2; the mask defaults to ``path.comp_mask()``."""
    mask = path.comp_mask() if comp_mask is None else comp_mask
    return sa_mad(Method.GET, SaAttr.PATH_RECORD, tid, mask, path.encode())


def build_path_get_table(tid: int, path: PathRecord, comp_mask: int | None = None) -> bytes:
    """SubnAdmGetTable(PathRecord): every path matching the masked components."""
    mask = path.comp_mask() if comp_mask is None else comp_mask
    return sa_mad(Method.GET_TABLE, SaAttr.PATH_RECORD, tid, mask, path.encode())


def build_mc_join(tid: int, record: McMemberRecord, comp_mask: int = ACM_JOIN_COMP_MASK) -> bytes:
    """SubnAdmSet(MCMemberRecord): join (or create) a multicast group."""
    return sa_mad(Method.SET, SaAttr.MC_MEMBER_RECORD, tid, comp_mask, record.encode())


def build_mc_leave(tid: int, record: McMemberRecord, comp_mask: int = ACM_JOIN_COMP_MASK) -> bytes:
    """SubnAdmDelete(MCMemberRecord): leave a multicast group (C never sends it, #17)."""
    return sa_mad(Method.DELETE, SaAttr.MC_MEMBER_RECORD, tid, comp_mask, record.encode())


def build_sa_response(
    request: SaMad,
    status: int,
    data: bytes,
    method: int | None = None,
    attr_offset: int | None = None,
) -> bytes:
    """An SA answer to ``request`` (for the simulated SA).

    TID, class, attribute and component mask are echoed; the method is ``request`` | 0x80
    unless given; ``status`` is the 16-bit MAD status (see ``sa_status_word``). A GetTable
    response carries RMPP framing (ACTIVE|FIRST|LAST, paylen = 20 + len(data)) and an
    ``attr_offset`` taken from the attribute's record size unless given. The result is one
    256-byte MAD when ``data`` fits 200 bytes, else the long form ready for ``split_rmpp``.
    """
    reply_method = request.mad.method | Method.RESP if method is None else method
    mad = replace(request.mad, method=reply_method, status=status)
    sa = SaHeader(comp_mask=request.sa.comp_mask)
    if reply_method == Method.GET_TABLE_RESP:
        if attr_offset is None:
            size = _RECORD_SIZES.get(request.mad.attr_id)
            if size is None:
                raise FieldRangeError(
                    f"attr_offset: unknown record size for attribute 0x{request.mad.attr_id:04x}"
                )
            attr_offset = size // 8
        sa.attr_offset = attr_offset
        sa.rmpp_version = RMPP_VERSION
        sa.rmpp_type = RmppType.DATA
        sa.rmpp_flags = RmppFlag.ACTIVE | RmppFlag.FIRST | RmppFlag.LAST
        sa.seg_num = 1
        sa.paylen_newwin = SA_CLASS_HDR_LEN + len(data)
    elif attr_offset is not None:
        sa.attr_offset = attr_offset
    return SaMad(mad=mad, sa=sa, data=bytes(data)).encode_long()


# -- RMPP ---------------------------------------------------------------------------------


def split_rmpp(sa_mad: bytes) -> list[bytes]:
    """Cut an SA MAD with a long data area into 256-byte RMPP DATA segments.

    The data length is taken from ``payload_length`` (exact when the input carries RMPP
    framing, as ``build_sa_response`` and ``RmppReassembler`` produce). Segments are numbered
    from 1; the first carries paylen = 220 x segments - pad (the total, SA header counted per
    segment), the last 220 - pad (what it holds), the others 0 — as IBA and Linux do. Each
    segment repeats the MAD header and the SA header proper (SM_Key .. ComponentMask) of the
    input; only the RMPP header differs.
    """
    whole = SaMad.decode(sa_mad)
    data = whole.data[: whole.payload_length()]
    count = max(1, -(-len(data) // SA_DATA_LEN))
    if count > MAX_RMPP_SEGMENTS:
        raise OversizeError(f"RMPP: {count} segments exceed the limit {MAX_RMPP_SEGMENTS}")
    pad = count * SA_DATA_LEN - len(data)
    rtime = whole.sa.rmpp_flags & ~_RMPP_FLAG_MASK & 0xFF
    head = bytes(sa_mad[:MAD_HDR_LEN])
    sa_tail = bytes(sa_mad[_RMPP_HDR_END:SA_HDR_END])
    pack = _RMPP_HDR.pack
    segments = []
    for number in range(1, count + 1):
        flags = rtime | _ACTIVE
        paylen = 0
        if number == 1:
            flags |= _FIRST
            paylen = count * RMPP_SEGMENT_PAYLOAD - pad
        if number == count:
            flags |= _LAST
            paylen = RMPP_SEGMENT_PAYLOAD - pad
        chunk = data[(number - 1) * SA_DATA_LEN : number * SA_DATA_LEN]
        if len(chunk) < SA_DATA_LEN:
            chunk = chunk.ljust(SA_DATA_LEN, b"\0")
        rmpp = pack(RMPP_VERSION, _DATA, flags, 0, number, paylen)
        segments.append(b"".join((head, rmpp, sa_tail, chunk)))
    return segments


def build_rmpp_ack(segment: bytes, new_window_last: int | None = None) -> bytes:
    """The RMPP ACK for a received DATA segment: same MAD header, seg_num echoed.

    ``new_window_last`` is the last segment the receiver accepts next (default: one more).
    """
    received = SaMad.decode(segment)
    window = received.sa.seg_num + 1 if new_window_last is None else new_window_last
    sa = SaHeader(
        rmpp_version=RMPP_VERSION,
        rmpp_type=RmppType.ACK,
        rmpp_flags=RmppFlag.ACTIVE,
        seg_num=received.sa.seg_num,
        paylen_newwin=window,
    )
    return SaMad(mad=received.mad, sa=sa, data=b"").encode()


_RMPP_FLAGS_AT = MAD_HDR_LEN + 2  # rmpp_rtime_flags


def _transaction_bytes(segment: bytes) -> bytes:
    """Management class, method, TID and attribute ID of a MAD, as raw bytes."""
    return segment[1:2] + segment[3:4] + segment[8:18]


def _rmpp_type_name(value: int) -> str:
    try:
        return RmppType(value).name
    except ValueError:
        return "unknown"


class RmppReassembler:
    """Rebuild one SA MAD from RMPP DATA segments (sans-I/O).

    ``feed`` each received 256-byte MAD: a MAD without RMPP framing comes straight back; a
    segment returns None until the LAST one, which returns the whole MAD (see ``SaMad``).
    Out-of-order or duplicate segments, a different transaction, STOP/ABORT, or lengths that
    disagree raise ``RmppError`` (or ``BadLengthError``) and reset the reassembler. Only the
    first segment is decoded whole; the others are checked field by field in place.
    """

    def __init__(self) -> None:
        self._first: SaMad | None = None
        self._transaction = b""
        """Bytes 0..17 of the first segment with status/class-specific blanked: what every
        later segment must repeat (class, method, TID, attribute)."""
        self._chunks: list[bytes] = []

    @property
    def in_progress(self) -> bool:
        return self._first is not None

    def reset(self) -> None:
        self._first = None
        self._chunks = []

    def feed(self, segment: bytes) -> bytes | None:
        check_exact_length("RMPP segment", segment, MAD_SIZE)
        if not segment[_RMPP_FLAGS_AT] & _ACTIVE:
            if self._first is not None:
                self._fail(RmppError("RMPP: a MAD without RMPP framing arrived mid-transfer"))
            return segment
        try:
            return self._accept(segment)
        except (RmppError, BadLengthError, BadVersionError):
            self.reset()
            raise

    def _fail(self, error: Exception) -> None:
        self.reset()
        raise error

    def _accept(self, segment: bytes) -> bytes | None:
        version, rmpp_type, flags, _status, seg_num, paylen = _RMPP_HDR.unpack_from(
            segment, MAD_HDR_LEN
        )
        if version != RMPP_VERSION:
            raise BadVersionError(f"RMPP: rmpp_version {version}, expected 1")
        if rmpp_type != _DATA:
            raise RmppError(f"RMPP: rmpp_type {rmpp_type} ({_rmpp_type_name(rmpp_type)})")
        expected = len(self._chunks) + 1
        if seg_num != expected:
            raise RmppError(f"RMPP: segment {seg_num} arrived, expected {expected}")
        if expected == 1:
            if not flags & _FIRST:
                raise RmppError("RMPP: segment 1 lacks the FIRST flag")
            self._first = SaMad.decode(segment)
            self._transaction = _transaction_bytes(segment)
        elif _transaction_bytes(segment) != self._transaction:
            self._mismatch(MadHeader.decode(segment), seg_num)
        if expected > MAX_RMPP_SEGMENTS:
            raise RmppError(f"RMPP: more than {MAX_RMPP_SEGMENTS} segments")
        self._chunks.append(segment[SA_HDR_END : SA_HDR_END + SA_DATA_LEN])
        if not flags & _LAST:
            return None
        return self._finish(paylen)

    def _mismatch(self, header: MadHeader, seg_num: int) -> None:
        first = self._first
        assert first is not None  # set by segment 1
        for name in ("tid", "mgmt_class", "method", "attr_id"):
            if getattr(header, name) != getattr(first.mad, name):
                raise RmppError(
                    f"RMPP: segment {seg_num} has {name} {getattr(header, name):#x}, "
                    f"the transfer started with {getattr(first.mad, name):#x}"
                )

    def _finish(self, last_paylen: int) -> bytes:
        first = self._first
        assert first is not None
        count = len(self._chunks)
        pad = RMPP_SEGMENT_PAYLOAD - last_paylen
        if not 0 <= pad <= SA_DATA_LEN:
            raise BadLengthError(
                f"RMPP: last segment paylen {last_paylen} outside "
                f"{SA_CLASS_HDR_LEN}..{RMPP_SEGMENT_PAYLOAD}"
            )
        total = count * RMPP_SEGMENT_PAYLOAD - pad
        first_paylen = first.sa.paylen_newwin
        if count > 1 and first_paylen not in (0, total):
            raise BadLengthError(
                f"RMPP: first segment paylen {first_paylen} but the segments hold {total}"
            )
        data = b"".join(self._chunks)[: count * SA_DATA_LEN - pad]
        sa = replace(
            first.sa,
            rmpp_flags=(first.sa.rmpp_flags & ~_RMPP_FLAG_MASK & 0xFF)
            | RmppFlag.ACTIVE
            | RmppFlag.FIRST
            | RmppFlag.LAST,
            seg_num=1,
            paylen_newwin=SA_CLASS_HDR_LEN + len(data),
        )
        self.reset()
        return SaMad(mad=first.mad, sa=sa, data=data).encode_long()

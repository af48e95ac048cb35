"""The IBA SA PathRecord (64 bytes, ``struct ibv_path_record``), pure codec.

The same 64 bytes travel in client RESOLVE messages (client-protocol.md §4.1), in SA MADs
(mad-protocol.md §9.3) and in kernel netlink replies (behavior.md §16.4); all multi-byte fields
are big-endian. Bit fields are exposed as separate attributes; the raw packed bytes are
available as properties (``flowlabel_hoplimit``, ``qosclass_sl``, ...) with setters, because
parts of the daemon copy those bytes verbatim (e.g. a multicast group's ``sl_flow_hop``).
Reserved bits and bytes are kept so that every 64-byte record round-trips exactly.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass

from ibacm.wire.buffer import Buffer
from ibacm.wire.errors import (
    FieldRangeError,
    check_bytes,
    check_exact_length,
    check_min_length,
    check_uint,
)

PATH_RECORD_LEN = 64
GID_LEN = 16
ZERO_GID = bytes(GID_LEN)
REVERSIBLE_BIT = 0x80  # IBV_PATH_RECORD_REVERSIBLE in reversible_numpath
PATH_LAYOUT = struct.Struct(">Q16s16sHHIBBHHBBBB6s")
"""The 64 bytes in one go, packed fields as on the wire (flowlabel_hoplimit, ...): the
codec's hot path (every RESOLVE reply, every SA record)."""
_LAYOUT = PATH_LAYOUT


class PathComp(enum.IntFlag):
    """SA PathRecord component-mask bits (mad-protocol.md §9.4)."""

    SERVICE_ID = 0x3  # both 32-bit halves of the service ID
    DGID = 1 << 2
    SGID = 1 << 3
    DLID = 1 << 4
    SLID = 1 << 5
    RAW_TRAFFIC = 1 << 6
    FLOW_LABEL = 1 << 8
    HOP_LIMIT = 1 << 9
    TCLASS = 1 << 10
    REVERSIBLE = 1 << 11
    NUMB_PATH = 1 << 12
    PKEY = 1 << 13
    QOS_CLASS = 1 << 14
    SL = 1 << 15
    MTU_SELECTOR = 1 << 16
    MTU = 1 << 17
    RATE_SELECTOR = 1 << 18
    RATE = 1 << 19
    PACKET_LIFE_SELECTOR = 1 << 20
    PACKET_LIFE = 1 << 21
    PREFERENCE = 1 << 22


def gid_from_text(text: str) -> bytes:
    """Parse a GID written as an IPv6 address (``fe80::2:c903:a:2b3c``) into 16 bytes."""
    try:
        return ipaddress.IPv6Address(text.strip()).packed
    except ValueError as exc:
        raise FieldRangeError(f"gid: {text!r} is not a GID in IPv6 notation") from exc


def gid_to_text(gid: bytes) -> str:
    """Format 16 GID bytes in IPv6 notation."""
    return str(ipaddress.IPv6Address(check_bytes("gid", gid, GID_LEN)))


@dataclass(slots=True)
class PathRecord:
    """One SA PathRecord; see the module docstring. Field widths are checked on encode."""

    service_id: int = 0
    dgid: bytes = ZERO_GID
    sgid: bytes = ZERO_GID
    dlid: int = 0
    slid: int = 0
    raw_traffic: bool = False
    flow_label: int = 0  # 20 bits
    hop_limit: int = 0
    tclass: int = 0
    reversible: bool = False
    numb_path: int = 0  # 7 bits
    pkey: int = 0
    qos_class: int = 0  # 12 bits
    sl: int = 0  # 4 bits
    mtu_selector: int = 0  # 2 bits
    mtu: int = 0  # 6 bits, IBA MTU enum
    rate_selector: int = 0  # 2 bits
    rate: int = 0  # 6 bits, IBA rate enum
    packet_life_selector: int = 0  # 2 bits
    packet_life: int = 0  # 6 bits
    preference: int = 0
    reserved: bytes = bytes(6)  # bytes 58..63
    flow_reserved: int = 0  # bits 30..28 of flowlabel_hoplimit

    def aimed_at(self, dgid: bytes, dlid: int) -> PathRecord:
        """A copy with another destination (``dataclasses.replace`` is slow on hot paths)."""
        return PathRecord(
            self.service_id,
            dgid,
            self.sgid,
            dlid,
            self.slid,
            self.raw_traffic,
            self.flow_label,
            self.hop_limit,
            self.tclass,
            self.reversible,
            self.numb_path,
            self.pkey,
            self.qos_class,
            self.sl,
            self.mtu_selector,
            self.mtu,
            self.rate_selector,
            self.rate,
            self.packet_life_selector,
            self.packet_life,
            self.preference,
            self.reserved,
            self.flow_reserved,
        )

    # -- packed views ---------------------------------------------------------------------

    @property
    def flowlabel_hoplimit(self) -> int:
        """Bytes 44..47: raw_traffic:1, reserved:3, flow_label:20, hop_limit:8."""
        return (
            (int(bool(self.raw_traffic)) << 31)
            | (check_uint("flow_reserved", self.flow_reserved, 3) << 28)
            | (check_uint("flow_label", self.flow_label, 20) << 8)
            | check_uint("hop_limit", self.hop_limit, 8)
        )

    @flowlabel_hoplimit.setter
    def flowlabel_hoplimit(self, value: int) -> None:
        check_uint("flowlabel_hoplimit", value, 32)
        self.raw_traffic = bool(value >> 31)
        self.flow_reserved = (value >> 28) & 0x7
        self.flow_label = (value >> 8) & 0xFFFFF
        self.hop_limit = value & 0xFF

    @property
    def reversible_numpath(self) -> int:
        """Byte 49: reversible:1, numb_path:7."""
        numb_path = check_uint("numb_path", self.numb_path, 7)
        return (REVERSIBLE_BIT if self.reversible else 0) | numb_path

    @reversible_numpath.setter
    def reversible_numpath(self, value: int) -> None:
        check_uint("reversible_numpath", value, 8)
        self.reversible = bool(value & REVERSIBLE_BIT)
        self.numb_path = value & 0x7F

    @property
    def qosclass_sl(self) -> int:
        """Bytes 52..53: qos_class:12, sl:4."""
        return (check_uint("qos_class", self.qos_class, 12) << 4) | check_uint("sl", self.sl, 4)

    @qosclass_sl.setter
    def qosclass_sl(self, value: int) -> None:
        check_uint("qosclass_sl", value, 16)
        self.qos_class = value >> 4
        self.sl = value & 0xF

    @property
    def mtu_byte(self) -> int:
        """Byte 54: selector:2, MTU enum:6."""
        return _pack_selector("mtu", self.mtu_selector, self.mtu)

    @mtu_byte.setter
    def mtu_byte(self, value: int) -> None:
        self.mtu_selector, self.mtu = _unpack_selector("mtu_byte", value)

    @property
    def rate_byte(self) -> int:
        """Byte 55: selector:2, rate enum:6."""
        return _pack_selector("rate", self.rate_selector, self.rate)

    @rate_byte.setter
    def rate_byte(self, value: int) -> None:
        self.rate_selector, self.rate = _unpack_selector("rate_byte", value)

    @property
    def packetlifetime_byte(self) -> int:
        """Byte 56: selector:2, packet lifetime:6."""
        return _pack_selector("packet_life", self.packet_life_selector, self.packet_life)

    @packetlifetime_byte.setter
    def packetlifetime_byte(self, value: int) -> None:
        self.packet_life_selector, self.packet_life = _unpack_selector("packetlifetime_byte", value)

    # -- codec ----------------------------------------------------------------------------

    def encode(self) -> bytes:
        """The 64 bytes; FieldRangeError names the first field that does not fit."""
        try:
            if (
                len(self.dgid) != GID_LEN
                or len(self.sgid) != GID_LEN
                or len(self.reserved) != 6
                or (self.flow_reserved >> 3)
                or (self.flow_label >> 20)
                or (self.numb_path >> 7)
                or (self.qos_class >> 12)
                or (self.sl >> 4)
                or ((self.mtu_selector | self.rate_selector | self.packet_life_selector) >> 2)
                or ((self.mtu | self.rate | self.packet_life) >> 6)
            ):
                return self._encode_checked()
            return _LAYOUT.pack(
                self.service_id,
                self.dgid,
                self.sgid,
                self.dlid,
                self.slid,
                ((1 << 31) if self.raw_traffic else 0)
                | (self.flow_reserved << 28)
                | (self.flow_label << 8)
                | self.hop_limit,
                self.tclass,
                (REVERSIBLE_BIT if self.reversible else 0) | self.numb_path,
                self.pkey,
                (self.qos_class << 4) | self.sl,
                (self.mtu_selector << 6) | self.mtu,
                (self.rate_selector << 6) | self.rate,
                (self.packet_life_selector << 6) | self.packet_life,
                self.preference,
                self.reserved,
            )
        except (struct.error, TypeError):
            # Out of range or not an integer somewhere: the field-by-field path says where.
            return self._encode_checked()

    def _encode_checked(self) -> bytes:
        buf = Buffer(capacity=PATH_RECORD_LEN)
        buf.push_uint64(self.service_id, "service_id")
        buf.push_bytes(check_bytes("dgid", self.dgid, GID_LEN))
        buf.push_bytes(check_bytes("sgid", self.sgid, GID_LEN))
        buf.push_uint16(self.dlid, "dlid")
        buf.push_uint16(self.slid, "slid")
        buf.push_uint32(self.flowlabel_hoplimit, "flowlabel_hoplimit")
        buf.push_uint8(self.tclass, "tclass")
        buf.push_uint8(self.reversible_numpath, "reversible_numpath")
        buf.push_uint16(self.pkey, "pkey")
        buf.push_uint16(self.qosclass_sl, "qosclass_sl")
        buf.push_uint8(self.mtu_byte, "mtu")
        buf.push_uint8(self.rate_byte, "rate")
        buf.push_uint8(self.packetlifetime_byte, "packetlifetime")
        buf.push_uint8(self.preference, "preference")
        buf.push_bytes(check_bytes("reserved", self.reserved, 6))
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> PathRecord:
        """Decode exactly 64 bytes (TruncatedError if shorter, OversizeError if longer)."""
        check_exact_length("PathRecord", data, PATH_RECORD_LEN)
        # Not ``_from_fields(*unpacked)``: compiled with mypyc, that call passed the tuple as
        # the first argument (ibacm.compiled).
        return cls.decode_table(data, PATH_RECORD_LEN, 1)[0]

    @classmethod
    def decode_table(cls, data: bytes, stride: int, count: int) -> list[PathRecord]:
        """``count`` records ``stride`` bytes apart in ``data`` (an SA GetTable answer).

        Equal GIDs, reserved bytes and multi-byte integers are shared between the records
        (one source GID, P_Key, SLID... per table), so a table of N paths costs little more
        than its N destinations. Same records as ``decode`` on each 64-byte slice.
        """
        if count <= 0:
            return []
        if stride < PATH_RECORD_LEN:
            raise FieldRangeError(f"PathRecord table: stride {stride} < {PATH_RECORD_LEN}")
        check_min_length("PathRecord table", data, (count - 1) * stride + PATH_RECORD_LEN)
        ints: dict[int, int] = {}
        blobs: dict[bytes, bytes] = {}
        number, blob = ints.setdefault, blobs.setdefault
        unpack = _LAYOUT.unpack_from
        build = cls._from_fields
        records = []
        for offset in range(0, count * stride, stride):
            f = unpack(data, offset)
            records.append(
                build(
                    number(f[0], f[0]),  # service ID
                    f[1],  # DGID: one per record
                    blob(f[2], f[2]),  # SGID
                    f[3],  # DLID
                    number(f[4], f[4]),  # SLID
                    number(f[5], f[5]),  # flow label and hop limit
                    f[6],
                    f[7],
                    number(f[8], f[8]),  # P_Key
                    f[9],
                    f[10],
                    f[11],
                    f[12],
                    f[13],
                    blob(f[14], f[14]),  # reserved
                )
            )
        return records

    @classmethod
    def _from_fields(
        cls,
        service_id: int,
        dgid: bytes,
        sgid: bytes,
        dlid: int,
        slid: int,
        fl_hop: int,
        tclass: int,
        rev_numpath: int,
        pkey: int,
        qos_sl: int,
        mtu: int,
        rate: int,
        life: int,
        preference: int,
        reserved: bytes,
    ) -> PathRecord:
        """A record from the packed fields of ``PATH_LAYOUT``."""
        return cls(
            service_id,
            dgid,
            sgid,
            dlid,
            slid,
            bool(fl_hop >> 31),
            (fl_hop >> 8) & 0xFFFFF,
            fl_hop & 0xFF,
            tclass,
            bool(rev_numpath & REVERSIBLE_BIT),
            rev_numpath & 0x7F,
            pkey,
            qos_sl >> 4,
            qos_sl & 0xF,
            mtu >> 6,
            mtu & 0x3F,
            rate >> 6,
            rate & 0x3F,
            life >> 6,
            life & 0x3F,
            preference,
            reserved,
            (fl_hop >> 28) & 0x7,
        )

    def comp_mask(self) -> int:
        """The SA component mask C derives from the non-zero fields (mad-protocol.md §9.4).

        RawTraffic, NumbPath and Preference are never set; FlowLabel is judged on the whole
        upper 24 bits of ``flowlabel_hoplimit`` (so raw_traffic alone also sets it), exactly
        as the C daemon does, so our SA queries match its queries bit for bit.
        """
        mask = 0
        if self.service_id:
            mask |= PathComp.SERVICE_ID
        if self.dgid != ZERO_GID:
            mask |= PathComp.DGID
        if self.sgid != ZERO_GID:
            mask |= PathComp.SGID
        if self.dlid:
            mask |= PathComp.DLID
        if self.slid:
            mask |= PathComp.SLID
        fl_hop = self.flowlabel_hoplimit
        if fl_hop >> 8:
            mask |= PathComp.FLOW_LABEL
        if fl_hop & 0xFF:
            mask |= PathComp.HOP_LIMIT
        if self.tclass:
            mask |= PathComp.TCLASS
        if self.reversible:
            mask |= PathComp.REVERSIBLE
        if self.pkey:
            mask |= PathComp.PKEY
        if self.qos_class:
            mask |= PathComp.QOS_CLASS
        if self.sl:
            mask |= PathComp.SL
        mask |= _selector_bits(self.mtu_selector, self.mtu, PathComp.MTU_SELECTOR, PathComp.MTU)
        mask |= _selector_bits(self.rate_selector, self.rate, PathComp.RATE_SELECTOR, PathComp.RATE)
        mask |= _selector_bits(
            self.packet_life_selector,
            self.packet_life,
            PathComp.PACKET_LIFE_SELECTOR,
            PathComp.PACKET_LIFE,
        )
        return int(mask)


@dataclass(frozen=True, slots=True)
class AimablePath:
    """A record packed once, for the many copies of it that differ only in destination (a
    multicast group's record aimed at each peer learned through the group): ``aimed_at``
    builds such a copy, ``packed_aimed_at`` gives its 64 bytes by putting DGID and DLID into
    the packed ones (a cache-hit answer, with no record built and packed per answer).
    ``record`` must not change once packed."""

    record: PathRecord
    packed: bytes

    @classmethod
    def of(cls, record: PathRecord) -> AimablePath:
        return cls(record, record.encode())

    def aimed_at(self, dgid: bytes, dlid: int) -> PathRecord:
        return self.record.aimed_at(dgid, dlid)

    def packed_aimed_at(self, dgid: bytes, dlid: int) -> bytes:
        """``aimed_at(dgid, dlid).encode()``, spliced: DGID is bytes 8-23, DLID 40-41."""
        if len(dgid) != GID_LEN or not 0 <= dlid <= 0xFFFF:
            check_bytes("dgid", dgid, GID_LEN)  # each raises, naming what does not fit
            check_uint("dlid", dlid, 16)
        packed = self.packed
        return b"".join((packed[:8], dgid, packed[24:40], dlid.to_bytes(2, "big"), packed[42:]))


def _pack_selector(field: str, selector: int, value: int) -> int:
    return (check_uint(f"{field}_selector", selector, 2) << 6) | check_uint(field, value, 6)


def _unpack_selector(field: str, value: int) -> tuple[int, int]:
    check_uint(field, value, 8)
    return value >> 6, value & 0x3F


def _selector_bits(selector: int, value: int, selector_bit: int, value_bit: int) -> int:
    return (selector_bit if selector else 0) | (value_bit if value else 0)

"""InfiniBand packets in ERF type-21 records inside a classic pcap file, pure codec.

What Mellanox ``ibdump`` writes and Wireshark/tshark decode: a pcap file with link type 197
(ERF) whose packets are ERF records (16-byte header: timestamp, type 21 = INFINIBAND, flags,
record length, loss counter, wire length), each carrying one whole IB packet:
LRH (8) [+ GRH (40)] + BTH (12) + DETH (8) + payload + ICRC (4) + VCRC (2).

The CRCs are computed as IBA 1.3 §7.8 specifies. ICRC: CRC-32 (the Ethernet polynomial,
initial value all ones, reflected, complemented) over the packet from the LRH to the end of
the payload, with the variant fields replaced by ones: LRH:VL and BTH:Resv8a in a local
packet; the whole LRH, GRH:TClass, GRH:FlowLabel, GRH:HopLmt and BTH:Resv8a in a global one
(the same masking RoCE uses). VCRC: CRC-16 with polynomial 0x100B, initial value all ones,
same bit conventions, over everything from the LRH through the ICRC. Both are appended least
significant byte first, as RoCE devices put the ICRC on the wire.

Bytes in, objects out: nothing here does I/O.
"""

from __future__ import annotations

import enum
import math
import zlib
from dataclasses import dataclass, field

from ibacm.wire.buffer import Buffer
from ibacm.wire.errors import (
    BadLengthError,
    BadOpcodeError,
    FieldRangeError,
    TruncatedError,
    WireError,
    check_bytes,
    check_min_length,
    check_uint,
)

GID_LEN = 16
LRH_LEN = 8
GRH_LEN = 40
BTH_LEN = 12
DETH_LEN = 8
ICRC_LEN = 4
VCRC_LEN = 2
ERF_HEADER_LEN = 16
ERF_EXT_HEADER_LEN = 8

LINKTYPE_ERF = 197
ERF_TYPE_INFINIBAND = 21
ERF_TYPE_MASK = 0x7F
ERF_EXT_HEADER_BIT = 0x80
GRH_IP_VERSION = 6
GRH_NEXT_HEADER_IBA = 0x1B
OPCODE_UD_SEND_ONLY = 0x64
MAX_PKT_LEN_WORDS = 0x7FF
MAX_ERF_RECORD = 0xFFFF

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAP_HEADER_LEN = 24
PCAP_RECORD_HEADER_LEN = 16
PCAP_VERSION = (2, 4)
PCAP_SNAPLEN = 65535


class CrcError(WireError):
    """A packet's ICRC or VCRC does not match its contents."""


class LinkNextHeader(enum.IntEnum):
    """LRH:LNH, what follows the LRH."""

    RAW = 0
    IP_NON_IBA = 1
    IBA_LOCAL = 2
    IBA_GLOBAL = 3


class ErfFlag(enum.IntFlag):
    """ERF header flags above the 2-bit capture interface number."""

    VARLEN = 0x04
    TRUNCATED = 0x08
    RX_ERROR = 0x10
    DS_ERROR = 0x20


ERF_INTERFACE_MASK = 0x03


# -- IB headers -----------------------------------------------------------------------------


@dataclass(slots=True)
class LocalRouteHeader:
    """LRH: VL:4 LVer:4 | SL:4 Rsv:2 LNH:2 | DLID | Rsv:5 PktLen:11 | SLID."""

    dlid: int
    slid: int
    sl: int = 0
    vl: int = 0
    lver: int = 0
    lnh: int = LinkNextHeader.IBA_LOCAL
    pkt_len: int = 0
    """Packet length in 4-byte words from the LRH through the ICRC (VCRC excluded)."""

    def encode(self) -> bytes:
        buf = Buffer(capacity=LRH_LEN)
        buf.push_uint8((check_uint("vl", self.vl, 4) << 4) | check_uint("lver", self.lver, 4))
        buf.push_uint8((check_uint("sl", self.sl, 4) << 4) | check_uint("lnh", self.lnh, 2))
        buf.push_uint16(self.dlid, "dlid")
        buf.push_uint16(check_uint("pkt_len", self.pkt_len, 11), "pkt_len")
        buf.push_uint16(self.slid, "slid")
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> LocalRouteHeader:
        check_min_length("LRH", data, LRH_LEN)
        buf = Buffer(data[:LRH_LEN])
        vl_lver, sl_lnh = buf.pull_uint8(), buf.pull_uint8()
        dlid = buf.pull_uint16()
        pkt_len = buf.pull_uint16() & MAX_PKT_LEN_WORDS
        return cls(
            dlid=dlid,
            slid=buf.pull_uint16(),
            sl=sl_lnh >> 4,
            vl=vl_lver >> 4,
            lver=vl_lver & 0xF,
            lnh=sl_lnh & 0x3,
            pkt_len=pkt_len,
        )


@dataclass(slots=True)
class GlobalRouteHeader:
    """GRH: IPVer:4 TClass:8 FlowLabel:20 | PayLen | NxtHdr | HopLmt | SGID | DGID."""

    sgid: bytes
    dgid: bytes
    tclass: int = 0
    flow_label: int = 0
    hop_limit: int = 0
    pay_len: int = 0
    """Bytes after the GRH through the ICRC."""
    next_header: int = GRH_NEXT_HEADER_IBA
    ip_version: int = GRH_IP_VERSION

    def encode(self) -> bytes:
        buf = Buffer(capacity=GRH_LEN)
        buf.push_uint32(
            (check_uint("ip_version", self.ip_version, 4) << 28)
            | (check_uint("tclass", self.tclass, 8) << 20)
            | check_uint("flow_label", self.flow_label, 20),
            "ipver_tclass_flow",
        )
        buf.push_uint16(self.pay_len, "pay_len")
        buf.push_uint8(self.next_header, "next_header")
        buf.push_uint8(self.hop_limit, "hop_limit")
        buf.push_bytes(check_bytes("sgid", self.sgid, GID_LEN))
        buf.push_bytes(check_bytes("dgid", self.dgid, GID_LEN))
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> GlobalRouteHeader:
        check_min_length("GRH", data, GRH_LEN)
        buf = Buffer(data[:GRH_LEN])
        word = buf.pull_uint32()
        pay_len = buf.pull_uint16()
        next_header = buf.pull_uint8()
        hop_limit = buf.pull_uint8()
        return cls(
            sgid=buf.pull_bytes(GID_LEN, "sgid"),
            dgid=buf.pull_bytes(GID_LEN, "dgid"),
            tclass=(word >> 20) & 0xFF,
            flow_label=word & 0xFFFFF,
            hop_limit=hop_limit,
            pay_len=pay_len,
            next_header=next_header,
            ip_version=word >> 28,
        )


@dataclass(slots=True)
class BaseTransportHeader:
    """BTH: OpCode | SE M PadCnt:2 TVer:4 | P_Key | Resv8a | DestQP | A Resv7 | PSN."""

    pkey: int
    dest_qp: int
    opcode: int = OPCODE_UD_SEND_ONLY
    solicited: bool = False
    mig_req: bool = False
    pad_count: int = 0
    tver: int = 0
    resv8a: int = 0
    ack_req: bool = False
    psn: int = 0

    def encode(self) -> bytes:
        buf = Buffer(capacity=BTH_LEN)
        buf.push_uint8(self.opcode, "opcode")
        buf.push_uint8(
            (0x80 if self.solicited else 0)
            | (0x40 if self.mig_req else 0)
            | (check_uint("pad_count", self.pad_count, 2) << 4)
            | check_uint("tver", self.tver, 4)
        )
        buf.push_uint16(self.pkey, "pkey")
        buf.push_uint8(self.resv8a, "resv8a")
        buf.push_bytes(check_uint("dest_qp", self.dest_qp, 24).to_bytes(3, "big"))
        buf.push_uint32(
            (0x80000000 if self.ack_req else 0) | check_uint("psn", self.psn, 24), "a_psn"
        )
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> BaseTransportHeader:
        check_min_length("BTH", data, BTH_LEN)
        buf = Buffer(data[:BTH_LEN])
        opcode, flags = buf.pull_uint8(), buf.pull_uint8()
        pkey = buf.pull_uint16()
        qp_word = buf.pull_uint32()
        a_psn = buf.pull_uint32()
        return cls(
            pkey=pkey,
            dest_qp=qp_word & 0xFFFFFF,
            opcode=opcode,
            solicited=bool(flags & 0x80),
            mig_req=bool(flags & 0x40),
            pad_count=(flags >> 4) & 0x3,
            tver=flags & 0xF,
            resv8a=qp_word >> 24,
            ack_req=bool(a_psn & 0x80000000),
            psn=a_psn & 0xFFFFFF,
        )


@dataclass(slots=True)
class DatagramExtendedHeader:
    """DETH: Q_Key | Reserved:8 SrcQP:24."""

    qkey: int
    src_qp: int
    reserved: int = 0

    def encode(self) -> bytes:
        buf = Buffer(capacity=DETH_LEN)
        buf.push_uint32(self.qkey, "qkey")
        buf.push_uint8(self.reserved, "deth reserved")
        buf.push_bytes(check_uint("src_qp", self.src_qp, 24).to_bytes(3, "big"))
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> DatagramExtendedHeader:
        check_min_length("DETH", data, DETH_LEN)
        buf = Buffer(data[:DETH_LEN])
        qkey = buf.pull_uint32()
        word = buf.pull_uint32()
        return cls(qkey=qkey, src_qp=word & 0xFFFFFF, reserved=word >> 24)


# -- CRCs -----------------------------------------------------------------------------------


def _crc16_table(poly_reflected: int) -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly_reflected if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_VCRC_TABLE = _crc16_table(0xD008)  # 0x100B with its 16 bits reversed (reflected form)


def vcrc(data: bytes) -> int:
    """The IBA Variant CRC of ``data`` (everything from the LRH through the ICRC)."""
    crc = 0xFFFF
    table = _VCRC_TABLE
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFF


def _icrc_input(packet: bytes) -> bytes:
    """``packet`` (LRH .. end of payload) with the ICRC's variant fields set to ones."""
    masked = bytearray(packet)
    lnh = masked[1] & 0x3
    if lnh == LinkNextHeader.IBA_GLOBAL:
        check_min_length("global IB packet", packet, LRH_LEN + GRH_LEN + BTH_LEN)
        masked[0:LRH_LEN] = b"\xff" * LRH_LEN
        grh = LRH_LEN
        masked[grh] |= 0x0F  # TClass (high nibble stays IPVer) ...
        masked[grh + 1 : grh + 4] = b"\xff\xff\xff"  # ... and FlowLabel
        masked[grh + 7] = 0xFF  # HopLmt
        bth = grh + GRH_LEN
    elif lnh == LinkNextHeader.IBA_LOCAL:
        check_min_length("local IB packet", packet, LRH_LEN + BTH_LEN)
        masked[0] |= 0xF0  # VL
        bth = LRH_LEN
    else:
        raise BadOpcodeError(f"LRH:LNH {lnh} is not an IBA transport packet (2 or 3)")
    masked[bth + 4] = 0xFF  # Resv8a
    return bytes(masked)


def icrc(packet: bytes) -> int:
    """The IBA Invariant CRC of an IBA packet given from the LRH to the end of its payload."""
    return zlib.crc32(_icrc_input(packet))


def append_crcs(packet: bytes) -> bytes:
    """``packet`` (LRH .. payload) followed by its ICRC and VCRC."""
    with_icrc = packet + icrc(packet).to_bytes(ICRC_LEN, "little")
    return with_icrc + vcrc(with_icrc).to_bytes(VCRC_LEN, "little")


def check_crcs(packet: bytes) -> None:
    """Raise CrcError unless the last six bytes of ``packet`` are its correct ICRC and VCRC."""
    check_min_length("IB packet", packet, LRH_LEN + BTH_LEN + ICRC_LEN + VCRC_LEN)
    body, got_icrc = packet[:-6], int.from_bytes(packet[-6:-2], "little")
    got_vcrc = int.from_bytes(packet[-2:], "little")
    want_icrc = icrc(body)
    if got_icrc != want_icrc:
        raise CrcError(f"ICRC: packet carries 0x{got_icrc:08x}, contents give 0x{want_icrc:08x}")
    want_vcrc = vcrc(packet[:-2])
    if got_vcrc != want_vcrc:
        raise CrcError(f"VCRC: packet carries 0x{got_vcrc:04x}, contents give 0x{want_vcrc:04x}")


# -- whole UD packets -----------------------------------------------------------------------


@dataclass(slots=True)
class UdPacket:
    """One UD SEND-only packet: LRH [+ GRH] + BTH + DETH + payload (+ ICRC + VCRC on the wire).

    ``encode`` derives the length fields (LRH:LNH and PktLen, GRH:PayLen, BTH:PadCnt) and
    appends the CRCs; ``decode`` checks all of them.
    """

    lrh: LocalRouteHeader
    bth: BaseTransportHeader
    deth: DatagramExtendedHeader
    payload: bytes
    grh: GlobalRouteHeader | None = None

    def encode(self) -> bytes:
        pad = -len(self.payload) % 4
        payload = bytes(self.payload) + bytes(pad)
        transport_len = BTH_LEN + DETH_LEN + len(payload) + ICRC_LEN
        grh_bytes = b""
        if self.grh is not None:
            self.grh.pay_len = transport_len
            grh_bytes = self.grh.encode()
        words = (LRH_LEN + len(grh_bytes) + transport_len) // 4
        if words > MAX_PKT_LEN_WORDS:
            raise FieldRangeError(
                f"payload: {len(self.payload)} bytes make a {words * 4}-byte packet, "
                f"LRH:PktLen allows {MAX_PKT_LEN_WORDS * 4}"
            )
        self.lrh.pkt_len = words
        self.lrh.lnh = (
            LinkNextHeader.IBA_GLOBAL if self.grh is not None else LinkNextHeader.IBA_LOCAL
        )
        self.bth.pad_count = pad
        body = self.lrh.encode() + grh_bytes + self.bth.encode() + self.deth.encode() + payload
        return append_crcs(body)

    @classmethod
    def decode(cls, data: bytes, *, verify_crcs: bool = True) -> UdPacket:
        lrh = LocalRouteHeader.decode(data)
        if lrh.lnh not in (LinkNextHeader.IBA_LOCAL, LinkNextHeader.IBA_GLOBAL):
            raise BadOpcodeError(f"LRH:LNH {lrh.lnh} is not an IBA transport packet (2 or 3)")
        if lrh.pkt_len * 4 + VCRC_LEN != len(data):
            raise BadLengthError(
                f"LRH:PktLen {lrh.pkt_len} words means {lrh.pkt_len * 4 + VCRC_LEN} bytes "
                f"with the VCRC, the packet has {len(data)}"
            )
        offset = LRH_LEN
        grh = None
        if lrh.lnh == LinkNextHeader.IBA_GLOBAL:
            grh = GlobalRouteHeader.decode(data[offset:])
            offset += GRH_LEN
            if grh.pay_len != len(data) - offset - VCRC_LEN:
                raise BadLengthError(
                    f"GRH:PayLen {grh.pay_len} disagrees with the "
                    f"{len(data) - offset - VCRC_LEN} bytes after the GRH"
                )
        bth = BaseTransportHeader.decode(data[offset:])
        if bth.opcode != OPCODE_UD_SEND_ONLY:
            raise BadOpcodeError(
                f"BTH:OpCode 0x{bth.opcode:02x} is not UD SEND only (0x{OPCODE_UD_SEND_ONLY:02x})"
            )
        offset += BTH_LEN
        deth = DatagramExtendedHeader.decode(data[offset:])
        offset += DETH_LEN
        end = len(data) - ICRC_LEN - VCRC_LEN
        if end < offset + bth.pad_count:
            raise TruncatedError(f"IB packet: {len(data)} bytes leave no room for the payload")
        if verify_crcs:
            check_crcs(data)
        return cls(lrh, bth, deth, data[offset : end - bth.pad_count], grh)


def ud_packet(
    payload: bytes,
    *,
    slid: int,
    dlid: int,
    dest_qp: int,
    src_qp: int,
    qkey: int,
    pkey: int,
    sl: int = 0,
    grh: GlobalRouteHeader | None = None,
) -> bytes:
    """The wire bytes of one UD SEND carrying ``payload`` (a MAD), CRCs included."""
    return UdPacket(
        lrh=LocalRouteHeader(dlid=dlid, slid=slid, sl=sl),
        bth=BaseTransportHeader(pkey=pkey, dest_qp=dest_qp),
        deth=DatagramExtendedHeader(qkey=qkey, src_qp=src_qp),
        payload=payload,
        grh=grh,
    ).encode()


# -- ERF records ----------------------------------------------------------------------------


def erf_timestamp(seconds: float) -> int:
    """ERF's 64-bit time: whole seconds in the upper 32 bits, a binary fraction below."""
    if not math.isfinite(seconds) or seconds < 0:
        raise FieldRangeError(f"timestamp: {seconds!r} is not a time after the epoch")
    whole = int(seconds)
    fraction = round((seconds - whole) * (1 << 32))
    if fraction >= 1 << 32:  # rounding reached the next second
        whole, fraction = whole + 1, 0
    return (check_uint("timestamp seconds", whole, 32) << 32) | fraction


def erf_seconds(timestamp: int) -> float:
    """The inverse of ``erf_timestamp``."""
    return (timestamp >> 32) + (timestamp & 0xFFFFFFFF) / (1 << 32)


@dataclass(slots=True)
class ErfRecord:
    """One ERF record; ``interface`` is the 2-bit capture interface (port A..D)."""

    timestamp: int
    payload: bytes
    rec_type: int = ERF_TYPE_INFINIBAND
    interface: int = 0
    flags: int = ErfFlag.VARLEN
    loss_counter: int = 0
    wire_length: int | None = None
    """Length of the packet on the wire; None = ``len(payload)``."""
    extension_headers: list[bytes] = field(default_factory=list)

    def encode(self) -> bytes:
        ext = b"".join(
            check_bytes(f"extension header {i}", header, ERF_EXT_HEADER_LEN)
            for i, header in enumerate(self.extension_headers)
        )
        rlen = ERF_HEADER_LEN + len(ext) + len(self.payload)
        if rlen > MAX_ERF_RECORD:
            raise FieldRangeError(f"ERF record: {rlen} bytes exceed rlen's limit {MAX_ERF_RECORD}")
        rec_type = check_uint("rec_type", self.rec_type, 7)
        if self.extension_headers:
            rec_type |= ERF_EXT_HEADER_BIT
        buf = Buffer(capacity=rlen)
        buf.push_uint64_le(self.timestamp, "timestamp")
        buf.push_uint8(rec_type, "type")
        buf.push_uint8(
            (check_uint("flags", self.flags, 8) & ~ERF_INTERFACE_MASK)
            | check_uint("interface", self.interface, 2),
            "flags",
        )
        buf.push_uint16(rlen, "rlen")
        buf.push_uint16(self.loss_counter, "lctr")
        wlen = len(self.payload) if self.wire_length is None else self.wire_length
        buf.push_uint16(wlen, "wlen")
        buf.push_bytes(ext)
        buf.push_bytes(bytes(self.payload))
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> ErfRecord:
        """Decode one record; ``data`` must be exactly the record (its rlen)."""
        check_min_length("ERF record", data, ERF_HEADER_LEN)
        buf = Buffer(data)
        timestamp = buf.pull_uint64_le("timestamp")
        rec_type, flags = buf.pull_uint8(), buf.pull_uint8()
        rlen, lctr, wlen = buf.pull_uint16(), buf.pull_uint16(), buf.pull_uint16()
        if rlen != len(data):
            raise BadLengthError(f"ERF rlen {rlen} disagrees with the {len(data)}-byte record")
        headers = []
        more = bool(rec_type & ERF_EXT_HEADER_BIT)
        while more:
            header = buf.pull_bytes(ERF_EXT_HEADER_LEN, "ERF extension header")
            headers.append(header)
            more = bool(header[0] & 0x80)
        return cls(
            timestamp=timestamp,
            payload=buf.pull_rest(),
            rec_type=rec_type & ERF_TYPE_MASK,
            interface=flags & ERF_INTERFACE_MASK,
            flags=flags & ~ERF_INTERFACE_MASK,
            loss_counter=lctr,
            wire_length=wlen,
            extension_headers=headers,
        )


# -- classic pcap container -----------------------------------------------------------------


def pcap_file_header(linktype: int = LINKTYPE_ERF, snaplen: int = PCAP_SNAPLEN) -> bytes:
    """The 24-byte header of a little-endian, microsecond pcap file."""
    buf = Buffer(capacity=PCAP_HEADER_LEN)
    buf.push_uint32_le(PCAP_MAGIC_US, "magic")
    buf.push_uint16_le(PCAP_VERSION[0], "version_major")
    buf.push_uint16_le(PCAP_VERSION[1], "version_minor")
    buf.push_uint32_le(0, "thiszone")
    buf.push_uint32_le(0, "sigfigs")
    buf.push_uint32_le(snaplen, "snaplen")
    buf.push_uint32_le(linktype, "linktype")
    return buf.data


def pcap_record(seconds: float, data: bytes) -> bytes:
    """One pcap packet record (header + data) stamped ``seconds`` after the epoch."""
    if not math.isfinite(seconds) or seconds < 0:
        raise FieldRangeError(f"timestamp: {seconds!r} is not a time after the epoch")
    whole = int(seconds)
    micros = round((seconds - whole) * 1_000_000)
    if micros >= 1_000_000:
        whole, micros = whole + 1, 0
    buf = Buffer()
    buf.push_uint32_le(check_uint("ts_sec", whole, 32), "ts_sec")
    buf.push_uint32_le(micros, "ts_usec")
    buf.push_uint32_le(len(data), "incl_len")
    buf.push_uint32_le(len(data), "orig_len")
    buf.push_bytes(bytes(data))
    return buf.data


@dataclass(frozen=True, slots=True)
class PcapPacket:
    seconds: float
    data: bytes
    orig_len: int


@dataclass(frozen=True, slots=True)
class PcapFile:
    linktype: int
    snaplen: int
    packets: list[PcapPacket]


def parse_pcap(data: bytes) -> PcapFile:
    """Decode a whole classic pcap file (either byte order, micro- or nanosecond stamps).

    A capture still being written may end in a partial record: that tail is ignored, so a
    live file can be read at any moment.
    """
    check_min_length("pcap file", data, PCAP_HEADER_LEN)
    magic_le = int.from_bytes(data[:4], "little")
    magic_be = int.from_bytes(data[:4], "big")
    if magic_le in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
        order, magic = "little", magic_le
    elif magic_be in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
        order, magic = "big", magic_be
    else:
        raise BadOpcodeError(f"pcap magic 0x{magic_le:08x} is not a classic pcap file")
    divisor = 1_000_000_000 if magic == PCAP_MAGIC_NS else 1_000_000
    buf = Buffer(data)
    buf.seek(8)  # magic and version
    buf.pull_uint(4, order, "thiszone")
    buf.pull_uint(4, order, "sigfigs")
    snaplen = buf.pull_uint(4, order, "snaplen")
    linktype = buf.pull_uint(4, order, "linktype")
    packets = []
    while buf.remaining() >= PCAP_RECORD_HEADER_LEN:
        ts_sec = buf.pull_uint(4, order, "ts_sec")
        ts_frac = buf.pull_uint(4, order, "ts_frac")
        incl_len = buf.pull_uint(4, order, "incl_len")
        orig_len = buf.pull_uint(4, order, "orig_len")
        if incl_len > buf.remaining():
            break  # a record still being written
        packet = buf.pull_bytes(incl_len, "packet data")
        packets.append(PcapPacket(ts_sec + ts_frac / divisor, packet, orig_len))
    return PcapFile(linktype, snaplen, packets)


def erf_infiniband_record(seconds: float, packet: bytes, interface: int = 0) -> bytes:
    """A pcap record holding one ERF type-21 record that carries ``packet``."""
    record = ErfRecord(timestamp=erf_timestamp(seconds), payload=packet, interface=interface)
    return pcap_record(seconds, record.encode())


__all__ = [
    "BTH_LEN",
    "DETH_LEN",
    "ERF_HEADER_LEN",
    "ERF_TYPE_INFINIBAND",
    "GRH_LEN",
    "GRH_NEXT_HEADER_IBA",
    "ICRC_LEN",
    "LINKTYPE_ERF",
    "LRH_LEN",
    "OPCODE_UD_SEND_ONLY",
    "VCRC_LEN",
    "BaseTransportHeader",
    "CrcError",
    "DatagramExtendedHeader",
    "ErfFlag",
    "ErfRecord",
    "GlobalRouteHeader",
    "LinkNextHeader",
    "LocalRouteHeader",
    "PcapFile",
    "PcapPacket",
    "UdPacket",
    "append_crcs",
    "check_crcs",
    "erf_infiniband_record",
    "erf_seconds",
    "erf_timestamp",
    "icrc",
    "parse_pcap",
    "pcap_file_header",
    "pcap_record",
    "ud_packet",
    "vcrc",
]

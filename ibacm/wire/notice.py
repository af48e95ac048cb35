"""SA event subscription and reports, pure codecs (IBA vol 1 §13.4.8-13.4.9, §14.2.5).

A port subscribes to SM traps with SubnAdmSet(InformInfo) (Subscribe = 1; 0 unsubscribes);
the SA acknowledges with SubnAdmGetResp echoing the InformInfo. Each event then arrives as a
SubnAdmReport(Notice) on QP1 of the subscriber, which must answer SubnAdmReportResp (same
TID, the Notice echoed) or the SA sends the Report again. Traps 64 and 65 tell that a GID came
into or went out of service; their data details hold the GID at byte 6 (OpenSM ``ntc_64_67``).

``InformInfo`` is 36 bytes and ``Notice`` 80, laid out as OpenSM's ``ib_inform_info_t`` and
``ib_mad_notice_attr_t`` (big-endian, 24-bit fields split as there).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from ibacm.wire.buffer import Buffer
from ibacm.wire.errors import FieldRangeError, check_bytes, check_exact_length, check_uint
from ibacm.wire.mad import (
    SA_DATA_LEN,
    Method,
    MgmtClass,
    SaAttr,
    SaHeader,
    SaMad,
    sa_mad,
)
from ibacm.wire.path_record import GID_LEN, ZERO_GID

INFORM_INFO_LEN = 36
NOTICE_LEN = 80
DATA_DETAILS_LEN = 54
ALL_LIDS = 0xFFFF
"""LIDRangeBegin meaning every LID (then LIDRangeEnd is ignored)."""
ALL_TYPES = 0xFFFF
"""Type (and TrapNumber) wildcard of an InformInfo."""
ALL_PRODUCERS = 0xFFFFFF
"""ProducerType wildcard of an InformInfo."""
PRODUCER_SUBNET_MANAGEMENT = 4
"""ProducerType of traps the SM itself issues (IBA Table 118: 4 = subnet management)."""
_GID_AT = 6
"""Offset of the GID in the data details of traps 64..67."""


class Trap(enum.IntEnum):
    """Generic trap numbers the SM issues about GIDs (IBA Table 119)."""

    GID_IN_SERVICE = 64
    GID_OUT_OF_SERVICE = 65
    MCAST_GROUP_CREATED = 66
    MCAST_GROUP_DELETED = 67


class NoticeType(enum.IntEnum):
    """Notice Type (7 bits)."""

    FATAL = 0
    URGENT = 1
    SECURITY = 2
    SUBNET_MANAGEMENT = 3
    INFO = 4
    EMPTY = 0x7F


_GID_TRAPS = frozenset(int(trap) for trap in Trap)


def _push_uint24(buf: Buffer, value: int, field: str) -> None:
    check_uint(field, value, 24)
    buf.push_uint8(value >> 16, field)
    buf.push_uint16(value & 0xFFFF, field)


def _pull_uint24(buf: Buffer, field: str) -> int:
    return (buf.pull_uint8(field) << 16) | buf.pull_uint16(field)


@dataclass(slots=True)
class InformInfo:
    """The SA InformInfo attribute (36 bytes): which events a subscriber wants.

    For a generic subscription ``trap_num`` is the TrapNumber (0xFFFF: all) and
    ``producer_type`` the ProducerType (0xFFFFFF: all); for a vendor one they are the
    DeviceID and VendorID. ``qpn`` and ``resp_time_value`` share one 32-bit word (QPN:24,
    reserved:3, RespTimeValue:5); OpenSM takes the QPN of a Subscribe from the MAD's source.
    """

    gid: bytes = ZERO_GID
    lid_range_begin: int = ALL_LIDS
    lid_range_end: int = 0
    reserved1: int = 0
    is_generic: bool = True
    subscribe: int = 1
    trap_type: int = ALL_TYPES
    trap_num: int = ALL_TYPES
    qpn: int = 1
    reserved_bits: int = 0
    resp_time_value: int = 0
    reserved2: int = 0
    producer_type: int = ALL_PRODUCERS

    def encode(self) -> bytes:
        buf = Buffer(capacity=INFORM_INFO_LEN)
        buf.push_bytes(check_bytes("gid", self.gid, GID_LEN))
        buf.push_uint16(self.lid_range_begin, "lid_range_begin")
        buf.push_uint16(self.lid_range_end, "lid_range_end")
        buf.push_uint16(self.reserved1, "reserved1")
        buf.push_uint8(1 if self.is_generic else 0, "is_generic")
        buf.push_uint8(self.subscribe, "subscribe")
        buf.push_uint16(self.trap_type, "type")
        buf.push_uint16(self.trap_num, "trap_num")
        word = (
            (check_uint("qpn", self.qpn, 24) << 8)
            | (check_uint("reserved_bits", self.reserved_bits, 3) << 5)
            | check_uint("resp_time_value", self.resp_time_value, 5)
        )
        buf.push_uint32(word, "qpn_resp_time_value")
        buf.push_uint8(self.reserved2, "reserved2")
        _push_uint24(buf, self.producer_type, "producer_type")
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> InformInfo:
        """Decode exactly 36 bytes."""
        check_exact_length("InformInfo", data, INFORM_INFO_LEN)
        buf = Buffer(data)
        info = cls(
            gid=buf.pull_bytes(GID_LEN, "gid"),
            lid_range_begin=buf.pull_uint16("lid_range_begin"),
            lid_range_end=buf.pull_uint16("lid_range_end"),
            reserved1=buf.pull_uint16("reserved1"),
        )
        generic = buf.pull_uint8("is_generic")
        if generic > 1:
            raise FieldRangeError(f"is_generic: {generic} is neither 0 nor 1")
        info.is_generic = bool(generic)
        info.subscribe = buf.pull_uint8("subscribe")
        info.trap_type = buf.pull_uint16("type")
        info.trap_num = buf.pull_uint16("trap_num")
        word = buf.pull_uint32("qpn_resp_time_value")
        info.qpn, info.reserved_bits, info.resp_time_value = word >> 8, (word >> 5) & 7, word & 31
        info.reserved2 = buf.pull_uint8("reserved2")
        info.producer_type = _pull_uint24(buf, "producer_type")
        return info

    def matches(self, notice: Notice) -> bool:
        """Whether a subscription with this InformInfo wants ``notice`` (LID range aside:
        the issuer decides what the range covers)."""
        if self.is_generic != notice.is_generic:
            return False
        if self.trap_type not in (ALL_TYPES, notice.type):
            return False
        if self.trap_num not in (ALL_TYPES, notice.trap_num):
            return False
        return self.producer_type in (ALL_PRODUCERS, notice.producer_type)


@dataclass(slots=True)
class Notice:
    """The Notice attribute (80 bytes) a Report carries.

    ``trap_num`` is the TrapNumber of a generic notice (DeviceID of a vendor one) and
    ``producer_type`` its ProducerType (VendorID). ``toggle``/``count`` form the
    NoticeToggle:1 / NoticeCount:15 word.
    """

    is_generic: bool = True
    type: int = NoticeType.SUBNET_MANAGEMENT
    producer_type: int = PRODUCER_SUBNET_MANAGEMENT
    trap_num: int = 0
    issuer_lid: int = 0
    toggle: bool = False
    count: int = 0
    data_details: bytes = bytes(DATA_DETAILS_LEN)
    issuer_gid: bytes = ZERO_GID

    @classmethod
    def gid_trap(cls, trap: Trap, gid: bytes, *, issuer_lid: int, issuer_gid: bytes) -> Notice:
        """A trap 64..67 notice about ``gid``, as the SM issues it."""
        details = bytes(_GID_AT) + check_bytes("gid", gid, GID_LEN)
        return cls(
            trap_num=trap,
            issuer_lid=issuer_lid,
            data_details=details.ljust(DATA_DETAILS_LEN, b"\0"),
            issuer_gid=issuer_gid,
        )

    @property
    def subject_gid(self) -> bytes | None:
        """The GID a generic trap 64..67 is about; None for any other notice."""
        if not self.is_generic or self.trap_num not in _GID_TRAPS:
            return None
        return self.data_details[_GID_AT : _GID_AT + GID_LEN]

    def encode(self) -> bytes:
        buf = Buffer(capacity=NOTICE_LEN)
        generic_type = (0x80 if self.is_generic else 0) | check_uint("type", self.type, 7)
        buf.push_uint8(generic_type, "generic_type")
        _push_uint24(buf, self.producer_type, "producer_type")
        buf.push_uint16(self.trap_num, "trap_num")
        buf.push_uint16(self.issuer_lid, "issuer_lid")
        toggle_count = (0x8000 if self.toggle else 0) | check_uint("count", self.count, 15)
        buf.push_uint16(toggle_count, "toggle_count")
        buf.push_bytes(check_bytes("data_details", self.data_details, DATA_DETAILS_LEN))
        buf.push_bytes(check_bytes("issuer_gid", self.issuer_gid, GID_LEN))
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> Notice:
        """Decode exactly 80 bytes."""
        check_exact_length("Notice", data, NOTICE_LEN)
        buf = Buffer(data)
        generic_type = buf.pull_uint8("generic_type")
        producer = _pull_uint24(buf, "producer_type")
        trap_num = buf.pull_uint16("trap_num")
        issuer_lid = buf.pull_uint16("issuer_lid")
        toggle_count = buf.pull_uint16("toggle_count")
        return cls(
            is_generic=bool(generic_type & 0x80),
            type=generic_type & 0x7F,
            producer_type=producer,
            trap_num=trap_num,
            issuer_lid=issuer_lid,
            toggle=bool(toggle_count & 0x8000),
            count=toggle_count & 0x7FFF,
            data_details=buf.pull_bytes(DATA_DETAILS_LEN, "data_details"),
            issuer_gid=buf.pull_bytes(GID_LEN, "issuer_gid"),
        )


# -- MADs ---------------------------------------------------------------------------------


def build_inform_info_set(tid: int, info: InformInfo) -> bytes:
    """SubnAdmSet(InformInfo): subscribe (``info.subscribe`` 1) or unsubscribe (0)."""
    return sa_mad(Method.SET, SaAttr.INFORM_INFO, tid, 0, info.encode())


def decode_inform_info_reply(reply: SaMad) -> InformInfo:
    """The InformInfo of the SA's GetResp to an InformInfo SET (status checked by the caller)."""
    _expect(reply, Method.GET_RESP, SaAttr.INFORM_INFO)
    return InformInfo.decode(reply.data[:INFORM_INFO_LEN])


def build_report(tid: int, notice: Notice) -> bytes:
    """SubnAdmReport(Notice): what the SA sends a subscriber."""
    return sa_mad(Method.REPORT, SaAttr.NOTICE, tid, 0, notice.encode())


def decode_report(mad: bytes) -> tuple[SaMad, Notice]:
    """A received SubnAdmReport(Notice): the MAD and its Notice (raises a WireError)."""
    report = SaMad.decode(mad)
    _expect(report, Method.REPORT, SaAttr.NOTICE)
    return report, Notice.decode(report.data[:NOTICE_LEN])


def build_report_resp(report: SaMad) -> bytes:
    """SubnAdmReportResp for ``report``: same TID and attribute, the Notice echoed."""
    mad = replace(report.mad, method=Method.REPORT_RESP, status=0)
    return SaMad(mad=mad, sa=SaHeader(), data=report.data[:SA_DATA_LEN]).encode()


def _expect(sa_mad: SaMad, method: int, attr: int) -> None:
    header = sa_mad.mad
    if header.mgmt_class != MgmtClass.SUBN_ADM:
        raise FieldRangeError(f"mgmt_class: {header.mgmt_class:#04x} is not the SA class 0x03")
    if header.method != method:
        raise FieldRangeError(f"method: {header.method:#04x}, expected {method:#04x}")
    if header.attr_id != attr:
        raise FieldRangeError(f"attr_id: {header.attr_id:#06x}, expected {attr:#06x}")

"""InformInfo and Notice (SA event subscription and Reports): layouts, MADs, bad input.

The layouts are OpenSM's ``ib_inform_info_t`` (36 bytes) and ``ib_mad_notice_attr_t`` (80
bytes); tests/peers/test_sm_traps.py shows OpenSM accepting what these build and sending
what they decode.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibacm.wire.errors import FieldRangeError, OversizeError, TruncatedError, WireError
from ibacm.wire.mad import MAD_SIZE, Method, SaAttr, SaMad
from ibacm.wire.notice import (
    INFORM_INFO_LEN,
    NOTICE_LEN,
    InformInfo,
    Notice,
    NoticeType,
    Trap,
    build_inform_info_set,
    build_report,
    build_report_resp,
    decode_inform_info_reply,
    decode_report,
)

GID = bytes.fromhex("fe800000000000000002c90300001234")


def test_inform_info_layout() -> None:
    info = InformInfo(trap_num=65, qpn=1, resp_time_value=19, producer_type=4)
    raw = info.encode()
    assert len(raw) == INFORM_INFO_LEN
    assert raw.hex() == (
        "00" * 16  # GID: all ports
        + "ffff"  # LIDRangeBegin: all LIDs
        + "0000"  # LIDRangeEnd
        + "0000"  # reserved
        + "01"  # IsGeneric
        + "01"  # Subscribe
        + "ffff"  # Type: all
        + "0041"  # TrapNumber 65
        + "00000113"  # QPN 1 : reserved 3 : RespTimeValue 19
        + "00"  # reserved
        + "000004"  # ProducerType
    )
    assert InformInfo.decode(raw) == info


def test_notice_layout_and_the_gid_of_traps_64_to_67() -> None:
    notice = Notice.gid_trap(Trap.GID_OUT_OF_SERVICE, GID, issuer_lid=1, issuer_gid=bytes(16))
    raw = notice.encode()
    assert len(raw) == NOTICE_LEN
    # IsGeneric:1 Type:7 = 0x83 (subnet management), ProducerType 4, TrapNumber 65.
    assert raw[:8].hex() == "83000004" + "0041" + "0001"
    assert raw[8:10] == bytes(2)  # toggle/count
    assert raw[10:16] == bytes(6) and raw[16:32] == GID  # ntc_64_67: 6 reserved, the GID
    decoded = Notice.decode(raw)
    assert decoded == notice
    assert decoded.subject_gid == GID
    assert decoded.type == NoticeType.SUBNET_MANAGEMENT


def test_other_notices_have_no_subject_gid() -> None:
    assert Notice(trap_num=128).subject_gid is None
    assert Notice(is_generic=False, trap_num=65).subject_gid is None


def test_subscribe_report_and_ack_mads() -> None:
    request = SaMad.decode(build_inform_info_set(7, InformInfo(trap_num=64)))
    assert (request.mad.method, request.mad.attr_id, request.mad.tid) == (
        Method.SET,
        SaAttr.INFORM_INFO,
        7,
    )
    assert int(SaAttr.INFORM_INFO) == 0x0003  # (0x0031 is ServiceRecord)
    notice = Notice.gid_trap(Trap.GID_IN_SERVICE, GID, issuer_lid=3, issuer_gid=GID)
    report_mad = build_report(0x1234, notice)
    assert len(report_mad) == MAD_SIZE
    report, decoded = decode_report(report_mad)
    assert decoded == notice and report.mad.attr_id == SaAttr.NOTICE
    ack = SaMad.decode(build_report_resp(report))
    assert (ack.mad.method, ack.mad.tid, ack.mad.attr_id) == (0x86, 0x1234, SaAttr.NOTICE)
    assert ack.data[:NOTICE_LEN] == notice.encode()


def test_the_reply_to_a_subscription() -> None:
    request = SaMad.decode(build_inform_info_set(9, InformInfo(trap_num=65)))
    request.mad.method = Method.GET_RESP
    assert decode_inform_info_reply(request).trap_num == 65
    request.mad.attr_id = SaAttr.PATH_RECORD
    with pytest.raises(FieldRangeError, match="attr_id"):
        decode_inform_info_reply(request)


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [(1, 0x2C, "mgmt_class"), (3, 0x01, "method"), (17, 0x35, "attr_id")],
)
def test_a_report_that_is_not_one_is_refused(offset: int, value: int, message: str) -> None:
    raw = bytearray(build_report(1, Notice(trap_num=65)))
    raw[offset] = value
    with pytest.raises(FieldRangeError, match=message):
        decode_report(bytes(raw))


def test_bad_input_is_named() -> None:
    with pytest.raises(TruncatedError, match="InformInfo"):
        InformInfo.decode(bytes(35))
    with pytest.raises(OversizeError, match="Notice"):
        Notice.decode(bytes(81))
    with pytest.raises(TruncatedError, match="SA MAD"):
        decode_report(bytes(100))
    raw = bytearray(InformInfo().encode())
    raw[22] = 2
    with pytest.raises(FieldRangeError, match="is_generic"):
        InformInfo.decode(bytes(raw))
    with pytest.raises(FieldRangeError, match="qpn"):
        InformInfo(qpn=1 << 24).encode()
    with pytest.raises(FieldRangeError, match="type"):
        Notice(type=0x80).encode()
    with pytest.raises(FieldRangeError, match="gid"):
        Notice.gid_trap(Trap.GID_OUT_OF_SERVICE, bytes(15), issuer_lid=1, issuer_gid=GID)


@given(st.binary(min_size=INFORM_INFO_LEN, max_size=INFORM_INFO_LEN))
def test_any_inform_info_decodes_or_fails_cleanly(raw: bytes) -> None:
    try:
        info = InformInfo.decode(raw)
    except WireError:
        return
    assert info.encode() == raw


@given(st.binary(min_size=NOTICE_LEN, max_size=NOTICE_LEN))
def test_any_notice_round_trips(raw: bytes) -> None:
    assert Notice.decode(raw).encode() == raw


@given(st.binary(min_size=0, max_size=300))
def test_any_bytes_as_a_report_decode_or_fail_cleanly(raw: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_report(raw)

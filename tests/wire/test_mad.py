"""SA MADs: the §9.9 examples from the spec, builders, records, RMPP, bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.wire.acm_mad import mgid_for
from ibacm.wire.errors import (
    BadLengthError,
    BadVersionError,
    FieldRangeError,
    OversizeError,
    RmppError,
    TruncatedError,
)
from ibacm.wire.mad import (
    ACM_JOIN_COMP_MASK,
    MAD_SIZE,
    MadHeader,
    MadStatus,
    McComp,
    McMemberRecord,
    Method,
    MgmtClass,
    RmppFlag,
    RmppReassembler,
    RmppType,
    SaAttr,
    SaHeader,
    SaMad,
    SaStatus,
    build_mc_join,
    build_mc_leave,
    build_path_get,
    build_path_get_table,
    build_rmpp_ack,
    build_sa_response,
    sa_status_word,
    split_rmpp,
)
from ibacm.wire.path_record import PathRecord, gid_from_text
from tests.wire.spec_hex import offset_dump, section_blocks, spec_text
from tests.wire.strategies import mc_member_records, path_records, sa_mads

PORT_GID = gid_from_text("fe80::2:c903:1:e3f1")
PEER_GID = gid_from_text("fe80::2:c903:a:2b3d")


@pytest.fixture(scope="module")
def examples() -> list[str]:
    return section_blocks(spec_text("mad-protocol.md"), "### 9.9")


def group0_join_record() -> McMemberRecord:
    return McMemberRecord(
        mgid=mgid_for(0xFFFF, rate=3, mtu=4),
        port_gid=PORT_GID,
        qkey=0x80010000,
        mtu_selector=2,
        mtu=4,
        pkey=0xFFFF,
        rate_selector=2,
        rate=3,
        scope=5,
        join_state=1,
    )


def test_9_9_join_for_group_0(examples: list[str]) -> None:
    expected = offset_dump(examples[2], MAD_SIZE)
    raw = build_mc_join(7, group0_join_record())
    assert raw == expected
    mad = SaMad.decode(raw)
    assert (mad.mad.mgmt_class, mad.mad.class_version, mad.mad.method) == (3, 2, Method.SET)
    assert (mad.mad.attr_id, mad.mad.tid, mad.sa.comp_mask) == (0x38, 7, 0x1B3F7)
    assert McMemberRecord.decode(mad.data[:56]) == group0_join_record()


def test_9_9_path_record_get(examples: list[str]) -> None:
    expected = offset_dump(examples[3], MAD_SIZE)
    path = PathRecord(dgid=PEER_GID, sgid=PORT_GID, pkey=0xFFFF)
    assert build_path_get(9, path) == expected
    mad = SaMad.decode(expected)
    assert (mad.mad.method, mad.mad.attr_id, mad.sa.comp_mask) == (Method.GET, 0x35, 0x200C)
    assert PathRecord.decode(mad.records(64)[0]) == path


def test_join_comp_mask_bits() -> None:
    bits = (
        McComp.MGID
        | McComp.PORT_GID
        | McComp.QKEY
        | McComp.MTU_SELECTOR
        | McComp.MTU
        | McComp.TCLASS
        | McComp.PKEY
        | McComp.RATE_SELECTOR
        | McComp.RATE
        | McComp.SL
        | McComp.FLOW_LABEL
        | McComp.SCOPE
        | McComp.JOIN_STATE
    )
    assert bits == ACM_JOIN_COMP_MASK == 0x1B3F7
    assert McComp.PROXY_JOIN == 1 << 17 and McComp.MLID == 1 << 3


def test_leave_and_get_table_builders() -> None:
    leave = SaMad.decode(build_mc_leave(11, group0_join_record(), ACM_JOIN_COMP_MASK))
    assert (leave.mad.method, leave.mad.attr_id, leave.mad.tid) == (Method.DELETE, 0x38, 11)
    table = SaMad.decode(build_path_get_table(12, PathRecord(dlid=4), comp_mask=0x10))
    assert (table.mad.method, table.sa.comp_mask) == (Method.GET_TABLE, 0x10)
    explicit = SaMad.decode(build_path_get(13, PathRecord(dlid=4, sl=1), comp_mask=0x10))
    assert explicit.sa.comp_mask == 0x10


def test_mc_member_record_packing() -> None:
    record = group0_join_record()
    record.sl_flow_hop = 0x3ABCDE40
    assert (record.sl, record.flow_label, record.hop_limit) == (3, 0xABCDE, 0x40)
    raw = record.encode()
    assert raw[38] == 0x84 and raw[42] == 0x83 and raw[44:48] == bytes.fromhex("3abcde40")
    assert raw[48] == 0x51 and record.scope_join == 0x51
    with pytest.raises(FieldRangeError, match="join_state: value 16"):
        McMemberRecord(join_state=16).encode()
    with pytest.raises(TruncatedError, match="MCMemberRecord: needs 56 bytes, got 52"):
        McMemberRecord.decode(bytes(52))


@given(mc_member_records)
@settings(max_examples=200)
def test_mc_member_record_round_trip(record: McMemberRecord) -> None:
    assert McMemberRecord.decode(record.encode()) == record


@given(st.binary(min_size=56, max_size=56))
@settings(max_examples=200)
def test_any_mc_member_record_bytes_round_trip(raw: bytes) -> None:
    assert McMemberRecord.decode(raw).encode() == raw


@given(sa_mads)
@settings(max_examples=200)
def test_sa_mad_round_trip(mad: SaMad) -> None:
    raw = mad.encode()
    assert len(raw) == MAD_SIZE and SaMad.decode(raw) == mad


def test_sa_mad_size_limits() -> None:
    with pytest.raises(TruncatedError, match="SA MAD: needs at least 256 bytes, got 255"):
        SaMad.decode(bytes(255))
    with pytest.raises(OversizeError, match="201 bytes do not fit one MAD"):
        SaMad(data=bytes(201)).encode()
    assert len(SaMad(data=b"\x01").encode()) == MAD_SIZE


def test_sa_response_and_status_bytes() -> None:
    request = SaMad.decode(build_path_get(0x1_0000_0021, PathRecord(dlid=5)))
    answer = PathRecord(dlid=5, slid=1, sl=2)
    raw = build_sa_response(request, 0, answer.encode())
    reply = SaMad.decode(raw)
    assert (reply.mad.method, reply.mad.tid, reply.mad.attr_id) == (0x81, 0x1_0000_0021, 0x35)
    assert PathRecord.decode(reply.records(64)[0]) == answer and reply.sa_status == 0
    missing = SaMad.decode(build_sa_response(request, sa_status_word(SaStatus.NO_RECORDS), b""))
    assert missing.mad.status == 0x0300 and missing.sa_status == 3
    busy = SaMad.decode(build_sa_response(request, MadStatus.BUSY, b""))
    assert (busy.sa_status, busy.generic_status) == (0, MadStatus.BUSY)
    join = SaMad.decode(build_mc_join(3, group0_join_record()))
    assert SaMad.decode(build_sa_response(join, 0, join.data)).mad.method == Method.SET_RESP


def path_table(count: int) -> list[PathRecord]:
    return [PathRecord(dlid=i + 1, slid=1, pkey=0xFFFF, sl=i % 16) for i in range(count)]


def test_get_table_response_records() -> None:
    request = SaMad.decode(build_path_get_table(4, PathRecord(slid=1), comp_mask=0x20))
    paths = path_table(2)
    reply = SaMad.decode(build_sa_response(request, 0, b"".join(p.encode() for p in paths)))
    assert reply.mad.method == Method.GET_TABLE_RESP and reply.sa.attr_offset == 8
    # 128 bytes of records in a 200-byte area: paylen keeps the padding out.
    assert [PathRecord.decode(r) for r in reply.records(64)] == paths
    empty = SaMad.decode(build_sa_response(request, 0, b""))
    assert empty.records(64) == []
    with pytest.raises(BadLengthError, match="attr_offset: 4 x 8 = 32 bytes is shorter"):
        SaMad(mad=MadHeader(method=Method.GET_TABLE_RESP), sa=SaHeader(attr_offset=4)).records(64)


def test_rmpp_split_and_reassemble_ten_paths() -> None:
    request = SaMad.decode(build_path_get_table(77, PathRecord(slid=1), comp_mask=0x20))
    paths = path_table(10)
    whole = build_sa_response(request, 0, b"".join(p.encode() for p in paths))
    segments = split_rmpp(whole)
    assert len(segments) == 4 and all(len(s) == MAD_SIZE for s in segments)
    headers = [SaMad.decode(s).sa for s in segments]
    assert [h.seg_num for h in headers] == [1, 2, 3, 4]
    assert [h.rmpp_flags & 7 for h in headers] == [3, 1, 1, 5]  # ACTIVE|FIRST ... ACTIVE|LAST
    assert [h.paylen_newwin for h in headers] == [720, 0, 0, 60]  # 4 x 20 + 640, 20 + 40
    assert all(h.rmpp_type == RmppType.DATA and h.attr_offset == 8 for h in headers)
    # Only the RMPP header differs between segments: the MAD and SA headers are the input's.
    assert all(s[:24] == whole[:24] and s[36:56] == whole[36:56] for s in segments)
    reassembler = RmppReassembler()
    results = [reassembler.feed(s) for s in segments]
    assert results[:3] == [None, None, None] and not reassembler.in_progress
    rebuilt = results[3]
    assert rebuilt is not None
    assert [PathRecord.decode(r) for r in SaMad.decode(rebuilt).records(64)] == paths
    assert split_rmpp(rebuilt) == segments


def test_rmpp_single_segment_and_plain_mads() -> None:
    request = SaMad.decode(build_path_get_table(5, PathRecord(slid=1), comp_mask=0x20))
    whole = build_sa_response(request, 0, PathRecord(dlid=9).encode())
    (segment,) = split_rmpp(whole)
    header = SaMad.decode(segment).sa
    assert header.rmpp_flags & 7 == RmppFlag.ACTIVE | RmppFlag.FIRST | RmppFlag.LAST
    assert header.paylen_newwin == 84
    reassembler = RmppReassembler()
    rebuilt = reassembler.feed(segment)
    assert rebuilt is not None and len(SaMad.decode(rebuilt).records(64)) == 1
    plain = build_path_get(6, PathRecord(dlid=1))
    assert reassembler.feed(plain) == plain


def segments_of(count: int, tid: int = 1) -> list[bytes]:
    request = SaMad.decode(build_path_get_table(tid, PathRecord(slid=1), comp_mask=0x20))
    return split_rmpp(
        build_sa_response(request, 0, b"".join(p.encode() for p in path_table(count)))
    )


def tamper(segment: bytes, offset: int, value: bytes) -> bytes:
    return segment[:offset] + value + segment[offset + len(value) :]


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda s: [s[1]], RmppError, "segment 2 arrived, expected 1"),
        (lambda s: [s[0], s[2]], RmppError, "segment 3 arrived, expected 2"),
        (lambda s: [s[0], s[0]], RmppError, "segment 1 arrived, expected 2"),
        (lambda s: [s[0], segments_of(10, tid=2)[1]], RmppError, "has tid 0x2"),
        (lambda s: [s[0], tamper(s[1], 1, b"\x04")], RmppError, "has mgmt_class 0x4, .* 0x3"),
        (lambda s: [s[0], tamper(s[1], 3, b"\x81")], RmppError, "has method 0x81, .* 0x92"),
        (lambda s: [s[0], tamper(s[1], 16, b"\x00\x38")], RmppError, "has attr_id 0x38"),
        (lambda s: [tamper(s[0], 26, b"\x01")], RmppError, "lacks the FIRST flag"),
        (lambda s: [tamper(s[0], 25, b"\x04")], RmppError, "rmpp_type 4 \\(ABORT\\)"),
        (lambda s: [tamper(s[0], 24, b"\x02")], BadVersionError, "rmpp_version 2"),
        (
            lambda s: [s[0], s[1], s[2], tamper(s[3], 32, bytes.fromhex("000000ff"))],
            BadLengthError,
            "last segment paylen 255",
        ),
        (
            lambda s: [tamper(s[0], 32, bytes.fromhex("00000100")), s[1], s[2], s[3]],
            BadLengthError,
            "first segment paylen 256 but the segments hold 720",
        ),
        (lambda s: [s[0], build_path_get(1, PathRecord())], RmppError, "without RMPP framing"),
        (lambda s: [s[0] + b"\0"], OversizeError, "RMPP segment: must be exactly 256"),
    ],
)
def test_rmpp_rejects_bad_sequences(make: object, error: type[Exception], message: str) -> None:
    reassembler = RmppReassembler()
    sequence = make(segments_of(10))  # type: ignore[operator]
    with pytest.raises(error, match=message):
        for segment in sequence:
            reassembler.feed(segment)
    assert not reassembler.in_progress
    segments = segments_of(7)  # 448 bytes: three segments
    assert [reassembler.feed(s) is None for s in segments] == [True, True, False]


def test_rmpp_ack() -> None:
    first = segments_of(10)[0]
    ack = SaMad.decode(build_rmpp_ack(first))
    assert (ack.sa.rmpp_type, ack.sa.rmpp_flags, ack.sa.seg_num, ack.sa.paylen_newwin) == (
        RmppType.ACK,
        RmppFlag.ACTIVE,
        1,
        2,
    )
    assert ack.mad == SaMad.decode(first).mad
    assert SaMad.decode(build_rmpp_ack(first, new_window_last=8)).sa.paylen_newwin == 8


@given(st.lists(path_records, min_size=0, max_size=12))
@settings(max_examples=50)
def test_rmpp_round_trip_any_table(paths: list[PathRecord]) -> None:
    request = SaMad.decode(build_path_get_table(1, PathRecord(slid=1), comp_mask=0x20))
    whole = build_sa_response(request, 0, b"".join(p.encode() for p in paths))
    reassembler = RmppReassembler()
    results = [reassembler.feed(segment) for segment in split_rmpp(whole)]
    rebuilt = results[-1]
    assert rebuilt is not None and all(r is None for r in results[:-1])
    assert [PathRecord.decode(r) for r in SaMad.decode(rebuilt).records(64)] == paths


def test_enums() -> None:
    assert (MgmtClass.SUBN_ADM.value, MgmtClass.ACM.value) == (3, 0x2C)
    assert (SaAttr.PATH_RECORD.value, SaAttr.MC_MEMBER_RECORD.value) == (0x35, 0x38)
    assert Method.GET_TABLE | Method.RESP == Method.GET_TABLE_RESP
    assert (MadStatus.METHOD_ATTR_UNSUPPORTED.value, SaStatus.REQ_DENIED.value) == (0x0C, 7)

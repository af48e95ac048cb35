"""PathRecord: layout, raw views, component mask (mad-protocol.md §9.4), bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.compiled import is_compiled
from ibacm.wire import path_record
from ibacm.wire.errors import FieldRangeError, OversizeError, TruncatedError
from ibacm.wire.path_record import (
    AimablePath,
    PathComp,
    PathRecord,
    gid_from_text,
    gid_to_text,
)
from tests.wire.strategies import path_records

PORT_GID = gid_from_text("fe80::2:c903:1:e3f1")
PEER_GID = gid_from_text("fe80::2:c903:a:2b3d")


def test_field_offsets_and_bit_packing() -> None:
    path = PathRecord(
        service_id=0x0102030405060708,
        dgid=bytes(range(16)),
        sgid=bytes(range(16, 32)),
        dlid=0x1122,
        slid=0x3344,
        raw_traffic=True,
        flow_label=0xABCDE,
        hop_limit=0x40,
        tclass=0x55,
        reversible=True,
        numb_path=0x7F,
        pkey=0xFFFF,
        qos_class=0xABC,
        sl=0xD,
        mtu_selector=2,
        mtu=4,
        rate_selector=2,
        rate=7,
        packet_life_selector=2,
        packet_life=18,
        preference=9,
        reserved=b"\x01\x02\x03\x04\x05\x06",
    )
    raw = path.encode()
    assert raw[0:8] == bytes.fromhex("0102030405060708")
    assert raw[8:24] == bytes(range(16)) and raw[24:40] == bytes(range(16, 32))
    assert raw[40:44] == bytes.fromhex("11223344")
    assert raw[44:48] == bytes.fromhex("8abcde40")  # raw_traffic | flow label | hop limit
    assert raw[48:58] == bytes.fromhex("55ffffffabcd84879209")
    assert raw[58:] == b"\x01\x02\x03\x04\x05\x06"
    assert PathRecord.decode(raw) == path


def test_raw_views_and_setters() -> None:
    path = PathRecord()
    path.flowlabel_hoplimit = 0x7123_4540  # reserved bits 30..28 set
    assert (path.raw_traffic, path.flow_reserved, path.flow_label, path.hop_limit) == (
        False,
        7,
        0x12345,
        0x40,
    )
    assert path.flowlabel_hoplimit == 0x7123_4540
    path.reversible_numpath = 0x81
    assert (path.reversible, path.numb_path) == (True, 1)
    path.qosclass_sl = 0xABCD
    assert (path.qos_class, path.sl, path.qosclass_sl) == (0xABC, 0xD, 0xABCD)
    path.mtu_byte, path.rate_byte, path.packetlifetime_byte = 0x84, 0x87, 0x92
    assert (path.mtu_selector, path.mtu, path.rate, path.packet_life) == (2, 4, 7, 18)


@pytest.mark.parametrize(
    ("path", "mask"),
    [
        # ACM-learned peer: dgid, sgid, pkey.
        (PathRecord(dgid=PEER_GID, sgid=PORT_GID, pkey=0xFFFF), 0x200C),
        # ib_acme -f l -s 3 -d 5: sgid = port GID, dlid, slid, pkey.
        (PathRecord(sgid=PORT_GID, dlid=5, slid=3, pkey=0xFFFF), 0x2038),
        # kernel netlink request: dgid, sgid, slid = port LID, pkey.
        (PathRecord(dgid=PEER_GID, sgid=PORT_GID, slid=3, pkey=0xFFFF), 0x202C),
        (PathRecord(service_id=1), 0x3),
        (PathRecord(raw_traffic=True), PathComp.FLOW_LABEL),  # C: raw_traffic alone counts
        (PathRecord(hop_limit=1), PathComp.HOP_LIMIT),
        (PathRecord(tclass=1, reversible=True, numb_path=5), 0x400 | 0x800),  # no NUMB_PATH
        (PathRecord(qos_class=1, sl=1), PathComp.QOS_CLASS | PathComp.SL),
        (PathRecord(mtu_selector=2), PathComp.MTU_SELECTOR),
        (PathRecord(mtu=4, rate=3), PathComp.MTU | PathComp.RATE),
        (PathRecord(rate_selector=1, packet_life=1), PathComp.RATE_SELECTOR | PathComp.PACKET_LIFE),
        (PathRecord(packet_life_selector=3), PathComp.PACKET_LIFE_SELECTOR),
        (PathRecord(preference=9, reserved=b"\xff" * 6), 0),  # never sent as components
    ],
)
def test_comp_mask(path: PathRecord, mask: int) -> None:
    assert path.comp_mask() == mask


def test_component_bit_names() -> None:
    values = {name: flag.value for name, flag in PathComp.__members__.items()}
    assert (values["SERVICE_ID"], values["DGID"], values["PKEY"]) == (0x3, 0x4, 0x2000)
    assert (values["PREFERENCE"], values["RAW_TRAFFIC"]) == (1 << 22, 1 << 6)


def test_decode_requires_exactly_64_bytes() -> None:
    with pytest.raises(TruncatedError, match="PathRecord: needs 64 bytes, got 63"):
        PathRecord.decode(bytes(63))
    with pytest.raises(OversizeError, match="PathRecord: must be exactly 64 bytes, got 65"):
        PathRecord.decode(bytes(65))


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (PathRecord(flow_label=1 << 20), r"flow_label: value 1048576 out of range 0\.\.1048575"),
        (PathRecord(numb_path=128), "numb_path: value 128"),
        (PathRecord(qos_class=4096), "qos_class: value 4096"),
        (PathRecord(sl=16), "sl: value 16"),
        (PathRecord(mtu=64), r"mtu: value 64 out of range 0\.\.63"),
        (PathRecord(rate_selector=4), "rate_selector: value 4"),
        (PathRecord(dlid=-1), "dlid: value -1"),
        (PathRecord(dgid=bytes(4)), "dgid: expected exactly 16 bytes, got 4"),
        (PathRecord(reserved=bytes(5)), "reserved: expected exactly 6 bytes, got 5"),
        (PathRecord(service_id=1 << 64), "service_id"),
    ],
)
def test_encode_rejects_out_of_range_fields(path: PathRecord, message: str) -> None:
    with pytest.raises(FieldRangeError, match=message):
        path.encode()


def test_gid_text() -> None:
    assert gid_to_text(PORT_GID) == "fe80::2:c903:1:e3f1"
    with pytest.raises(FieldRangeError, match="'fe80::g' is not a GID"):
        gid_from_text("fe80::g")


@given(path_records)
@settings(max_examples=200)
def test_object_round_trip(path: PathRecord) -> None:
    assert PathRecord.decode(path.encode()) == path


@given(st.binary(min_size=64, max_size=64))
@settings(max_examples=200)
def test_any_64_bytes_round_trip(raw: bytes) -> None:
    assert PathRecord.decode(raw).encode() == raw


@settings(max_examples=50)
@given(
    st.lists(st.binary(min_size=64, max_size=64), max_size=12),
    st.sampled_from([64, 72, 128]),
)
def test_decode_table_is_decode_of_each_record(raws: list[bytes], stride: int) -> None:
    data = b"".join(raw.ljust(stride, b"\xee") for raw in raws)
    table = PathRecord.decode_table(data, stride, len(raws))
    assert table == [PathRecord.decode(raw) for raw in raws]


def test_decode_table_shares_equal_fields_and_checks_its_bounds() -> None:
    paths = [
        PathRecord(sgid=PORT_GID, dgid=bytes([i]) * 16, slid=0x1234, dlid=0x100 + i, pkey=0xFFFF)
        for i in range(3)
    ]
    table = PathRecord.decode_table(b"".join(p.encode() for p in paths), 64, 3)
    assert table == paths
    assert table[0].sgid is table[2].sgid
    if not is_compiled(path_record):
        assert table[0].pkey is table[2].pkey  # compiled, a record holds its ints unboxed
    assert table[0].reserved is table[1].reserved
    assert PathRecord.decode_table(b"", 64, 0) == []
    with pytest.raises(TruncatedError):
        PathRecord.decode_table(bytes(64 * 3 - 1), 64, 3)
    with pytest.raises(FieldRangeError):
        PathRecord.decode_table(bytes(64), 32, 2)


@given(
    path=path_records,
    dgid=st.binary(min_size=16, max_size=16),
    dlid=st.integers(0, 0xFFFF),
)
def test_a_packed_aimed_copy_is_the_aimed_copy_packed(
    path: PathRecord, dgid: bytes, dlid: int
) -> None:
    aimable = AimablePath.of(path)
    assert aimable.packed_aimed_at(dgid, dlid) == path.aimed_at(dgid, dlid).encode()
    assert aimable.aimed_at(dgid, dlid) == path.aimed_at(dgid, dlid)


@pytest.mark.parametrize(
    ("dgid", "dlid", "field"),
    [(bytes(15), 1, "dgid"), (bytes(16), 0x10000, "dlid"), (bytes(16), -1, "dlid")],
)
def test_a_destination_that_does_not_fit_is_refused(dgid: bytes, dlid: int, field: str) -> None:
    aimable = AimablePath.of(PathRecord(dlid=5))
    with pytest.raises(FieldRangeError, match=field):
        aimable.packed_aimed_at(dgid, dlid)

"""The ERF/pcap codec: IB headers, ICRC/VCRC, ERF records, pcap files, bad input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.wire import erf
from ibacm.wire.errors import (
    BadLengthError,
    BadOpcodeError,
    FieldRangeError,
    TruncatedError,
    WireError,
)

SGID = bytes.fromhex("fe800000000000000002c9030001e3f1")
MGID = bytes.fromhex("ff154001ffff00030400000000000000")
MAD = bytes([1, 0x2C, 1, 1, 0, 0, 0, 1]) + (5).to_bytes(8, "big") + bytes(240)


def bitwise_crc32(data: bytes) -> int:
    """CRC-32 (IEEE 802.3), bit by bit: an implementation independent of zlib."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def bitwise_crc16_100b(data: bytes) -> int:
    """IBA VCRC bit by bit: polynomial 0x100B fed most significant bit first, on reversed bits."""
    crc = 0xFFFF
    for byte in data:
        for bit in range(8):  # IB sends bit 0 of each byte first
            feedback = ((crc >> 15) & 1) ^ ((byte >> bit) & 1)
            crc = ((crc << 1) & 0xFFFF) ^ (0x100B if feedback else 0)
    crc ^= 0xFFFF
    return int(f"{crc:016b}"[::-1], 2)  # the register's last bit goes out first


def local_packet(
    *,
    slid: int = 3,
    dlid: int = 1,
    dest_qp: int = 1,
    src_qp: int = 1,
    qkey: int = 0x80010000,
    pkey: int = 0xFFFF,
    sl: int = 0,
) -> bytes:
    return erf.ud_packet(
        MAD, slid=slid, dlid=dlid, dest_qp=dest_qp, src_qp=src_qp, qkey=qkey, pkey=pkey, sl=sl
    )


def global_packet(**grh: int) -> bytes:
    header = erf.GlobalRouteHeader(sgid=SGID, dgid=MGID, **grh)
    return erf.ud_packet(
        MAD,
        slid=3,
        dlid=0xC001,
        dest_qp=0xFFFFFF,
        src_qp=0x100,
        qkey=0x80010000,
        pkey=0xFFFF,
        grh=header,
    )


def test_local_ud_packet_layout() -> None:
    packet = local_packet(sl=2)
    assert len(packet) == 8 + 12 + 8 + 256 + 4 + 2
    # LRH: VL 0 LVer 0, SL 2 LNH 2 (IBA local), DLID 1, PktLen 72 words, SLID 3.
    assert packet[:8] == bytes.fromhex("0022 0001 0048 0003".replace(" ", ""))
    # BTH: UD SEND only, P_Key, Resv8a 0, DestQP 1, PSN 0; DETH: Q_Key, SrcQP 1.
    assert packet[8:20] == bytes.fromhex("6400ffff000000010000 0000".replace(" ", ""))
    assert packet[20:28] == bytes.fromhex("8001000000000001")
    assert packet[28:284] == MAD
    decoded = erf.UdPacket.decode(packet)
    assert (decoded.lrh.slid, decoded.lrh.dlid, decoded.lrh.sl) == (3, 1, 2)
    assert decoded.grh is None and decoded.payload == MAD


def test_global_ud_packet_layout() -> None:
    packet = global_packet(tclass=0x12, flow_label=0xABCDE, hop_limit=7)
    assert len(packet) == 8 + 40 + 12 + 8 + 256 + 6
    assert packet[1] & 0x3 == erf.LinkNextHeader.IBA_GLOBAL
    assert struct.unpack(">H", packet[4:6])[0] == (len(packet) - 2) // 4
    grh = erf.UdPacket.decode(packet).grh
    assert grh is not None
    assert (grh.ip_version, grh.tclass, grh.flow_label, grh.hop_limit) == (6, 0x12, 0xABCDE, 7)
    assert (grh.pay_len, grh.next_header, grh.sgid, grh.dgid) == (280, 0x1B, SGID, MGID)


def test_icrc_is_crc32_over_the_masked_fields() -> None:
    packet = local_packet()
    masked = bytearray(packet[:-6])
    masked[0] |= 0xF0  # VL
    masked[8 + 4] = 0xFF  # BTH:Resv8a
    assert packet[-6:-2] == bitwise_crc32(bytes(masked)).to_bytes(4, "little")
    assert packet[-2:] == bitwise_crc16_100b(packet[:-2]).to_bytes(2, "little")

    packet = global_packet(tclass=5, flow_label=9, hop_limit=64)
    masked = bytearray(packet[:-6])
    masked[0:8] = b"\xff" * 8  # the whole LRH
    masked[8] |= 0x0F
    masked[9:12] = b"\xff\xff\xff"  # TClass and FlowLabel
    masked[15] = 0xFF  # HopLmt
    masked[48 + 4] = 0xFF  # Resv8a
    assert packet[-6:-2] == bitwise_crc32(bytes(masked)).to_bytes(4, "little")
    assert packet[-2:] == bitwise_crc16_100b(packet[:-2]).to_bytes(2, "little")


def test_variant_fields_change_only_the_vcrc() -> None:
    base = global_packet()
    rerouted = global_packet(tclass=3, flow_label=77, hop_limit=9)
    assert base[-6:-2] == rerouted[-6:-2]  # ICRC survives switches and routers
    assert base[-2:] != rerouted[-2:]  # the VCRC is recomputed at each hop
    assert erf.icrc(local_packet()[:-6]) != erf.icrc(local_packet(dlid=2)[:-6])  # DLID counts
    moved = bytearray(local_packet()[:-6])
    moved[0] = 0x70  # another VL
    assert erf.icrc(bytes(moved)) == erf.icrc(local_packet()[:-6])


def test_corruption_is_detected() -> None:
    packet = bytearray(local_packet())
    packet[100] ^= 0x01
    with pytest.raises(erf.CrcError, match="ICRC"):
        erf.UdPacket.decode(bytes(packet))
    packet = bytearray(local_packet())
    packet[-1] ^= 0x80
    with pytest.raises(erf.CrcError, match="VCRC"):
        erf.check_crcs(bytes(packet))
    assert erf.UdPacket.decode(bytes(packet), verify_crcs=False).payload == MAD


def test_odd_payloads_are_padded_and_unpadded() -> None:
    packet = erf.ud_packet(b"abcde", slid=1, dlid=2, dest_qp=3, src_qp=4, qkey=5, pkey=6)
    decoded = erf.UdPacket.decode(packet)
    assert (decoded.bth.pad_count, decoded.payload) == (3, b"abcde")


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"dlid": 0x10000}, FieldRangeError, "dlid"),
        ({"dest_qp": 1 << 24}, FieldRangeError, "dest_qp"),
        ({"src_qp": -1}, FieldRangeError, "src_qp"),
        ({"sl": 16}, FieldRangeError, "sl"),
        ({"qkey": 1 << 32}, FieldRangeError, "qkey"),
    ],
)
def test_out_of_range_fields_are_refused(
    changes: dict[str, int], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        local_packet(**changes)


def test_oversized_payload_is_refused() -> None:
    with pytest.raises(FieldRangeError, match="PktLen"):
        erf.ud_packet(bytes(8192), slid=1, dlid=2, dest_qp=3, src_qp=4, qkey=5, pkey=6)


def test_bad_packets_get_specific_errors() -> None:
    good = local_packet()
    with pytest.raises(TruncatedError):
        erf.UdPacket.decode(good[:5])
    with pytest.raises(BadLengthError, match="PktLen"):
        erf.UdPacket.decode(good[:-4] + good[-2:])
    raw = bytearray(good)
    raw[1] &= 0xFC  # LNH raw
    with pytest.raises(BadOpcodeError, match="LNH 0"):
        erf.UdPacket.decode(bytes(raw))
    with pytest.raises(BadOpcodeError, match="LNH 1"):
        erf.icrc(bytes([0, 1]) + good[2:-6])
    rc = bytearray(good)
    rc[8] = 0x04  # RC SEND only
    with pytest.raises(BadOpcodeError, match="UD SEND only"):
        erf.UdPacket.decode(erf.append_crcs(bytes(rc[:-6])))
    wrong_paylen = bytearray(global_packet())
    wrong_paylen[12:14] = (100).to_bytes(2, "big")
    with pytest.raises(BadLengthError, match="PayLen"):
        erf.UdPacket.decode(bytes(wrong_paylen))


@settings(max_examples=60, deadline=None)
@given(
    payload=st.binary(min_size=0, max_size=300),
    slid=st.integers(0, 0xFFFF),
    dlid=st.integers(0, 0xFFFF),
    qps=st.tuples(st.integers(0, 0xFFFFFF), st.integers(0, 0xFFFFFF)),
    pkey=st.integers(0, 0xFFFF),
    sl=st.integers(0, 15),
    grh=st.one_of(
        st.none(),
        st.builds(
            erf.GlobalRouteHeader,
            sgid=st.binary(min_size=16, max_size=16),
            dgid=st.binary(min_size=16, max_size=16),
            tclass=st.integers(0, 255),
            flow_label=st.integers(0, 0xFFFFF),
            hop_limit=st.integers(0, 255),
        ),
    ),
)
def test_packets_round_trip(
    payload: bytes,
    slid: int,
    dlid: int,
    qps: tuple[int, int],
    pkey: int,
    sl: int,
    grh: erf.GlobalRouteHeader | None,
) -> None:
    packet = erf.ud_packet(
        payload,
        slid=slid,
        dlid=dlid,
        dest_qp=qps[0],
        src_qp=qps[1],
        qkey=0x80010000,
        pkey=pkey,
        sl=sl,
        grh=grh,
    )
    decoded = erf.UdPacket.decode(packet)
    assert decoded.payload == payload
    assert (decoded.lrh.slid, decoded.lrh.dlid, decoded.lrh.sl) == (slid, dlid, sl)
    assert (decoded.bth.dest_qp, decoded.deth.src_qp, decoded.bth.pkey) == (*qps, pkey)
    assert decoded.grh == grh
    assert decoded.encode() == packet


@settings(max_examples=200, deadline=None)
@given(data=st.data(), use_grh=st.booleans())
def test_every_single_byte_change_is_rejected(data: st.DataObject, use_grh: bool) -> None:
    packet = bytearray(global_packet() if use_grh else local_packet())
    index = data.draw(st.integers(0, len(packet) - 1))
    packet[index] ^= data.draw(st.integers(1, 255))
    with pytest.raises(WireError):
        erf.UdPacket.decode(bytes(packet))


@given(st.binary(max_size=400))
def test_garbage_is_refused_with_a_wire_error(data: bytes) -> None:
    with pytest.raises(WireError):
        erf.UdPacket.decode(data)


# -- ERF and pcap -------------------------------------------------------------------------------


def test_erf_timestamps() -> None:
    assert erf.erf_timestamp(1_700_000_000.5) == (1_700_000_000 << 32) | 0x80000000
    assert erf.erf_seconds(erf.erf_timestamp(12.25)) == 12.25
    assert erf.erf_timestamp(1.9999999999) == 2 << 32  # rounding carries into the seconds
    for bad in (-1.0, float("nan"), float("inf"), 2.0**32):
        with pytest.raises(FieldRangeError, match="timestamp"):
            erf.erf_timestamp(bad)


def test_erf_record_layout_and_round_trip() -> None:
    packet = local_packet()
    record = erf.ErfRecord(timestamp=erf.erf_timestamp(1.5), payload=packet, interface=1)
    data = record.encode()
    assert data[:8] == ((1 << 32) | 0x80000000).to_bytes(8, "little")
    assert data[8] == erf.ERF_TYPE_INFINIBAND
    assert data[9] == erf.ErfFlag.VARLEN | 1
    assert struct.unpack(">HHH", data[10:16]) == (16 + len(packet), 0, len(packet))
    assert data[16:] == packet
    back = erf.ErfRecord.decode(data)
    assert (back.interface, back.rec_type, back.payload, back.wire_length) == (
        1,
        21,
        packet,
        len(packet),
    )
    with pytest.raises(BadLengthError, match="rlen"):
        erf.ErfRecord.decode(data + b"\0")
    with pytest.raises(FieldRangeError, match="interface"):
        erf.ErfRecord(timestamp=0, payload=b"", interface=4).encode()


def test_erf_extension_headers_are_skipped() -> None:
    ext = [bytes([0x80 | 1]) + bytes(7), bytes([2]) + bytes(7)]
    data = erf.ErfRecord(timestamp=0, payload=b"ib", extension_headers=ext).encode()
    assert data[8] == 0x80 | erf.ERF_TYPE_INFINIBAND
    back = erf.ErfRecord.decode(data)
    assert (back.extension_headers, back.payload, back.rec_type) == (ext, b"ib", 21)
    with pytest.raises(TruncatedError, match="extension header"):
        erf.ErfRecord.decode(
            data[:8]
            + bytes([0x95])
            + data[9:10]
            + (20).to_bytes(2, "big")
            + data[12:16]
            + bytes([0x80])
            + bytes(3)
        )


def test_pcap_file_round_trip_and_live_tail() -> None:
    first = erf.erf_infiniband_record(100.25, local_packet(), interface=0)
    second = erf.erf_infiniband_record(101.0, global_packet(), interface=1)
    data = erf.pcap_file_header() + first + second
    parsed = erf.parse_pcap(data)
    assert (parsed.linktype, parsed.snaplen) == (197, 65535)
    assert [p.seconds for p in parsed.packets] == [100.25, 101.0]
    records = [erf.ErfRecord.decode(p.data) for p in parsed.packets]
    assert [r.interface for r in records] == [0, 1]
    assert erf.UdPacket.decode(records[1].payload).grh is not None
    # A record still being written is not returned (a live capture can be read any time).
    assert len(erf.parse_pcap(data[:-10]).packets) == 1


def test_pcap_big_endian_and_nanosecond_files() -> None:
    header = struct.pack(">IHHiIII", erf.PCAP_MAGIC_NS, 2, 4, 0, 0, 1000, 197)
    record = struct.pack(">IIII", 7, 500_000_000, 3, 3) + b"abc"
    parsed = erf.parse_pcap(header + record)
    assert parsed.packets == [erf.PcapPacket(7.5, b"abc", 3)]


def test_pcap_rejects_what_is_not_pcap() -> None:
    with pytest.raises(BadOpcodeError, match="magic"):
        erf.parse_pcap(b"\x0a\x0d\x0d\x0a" + bytes(40))  # pcapng
    with pytest.raises(TruncatedError):
        erf.parse_pcap(b"\xd4\xc3\xb2\xa1")

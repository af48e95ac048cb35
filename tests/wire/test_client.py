"""Client-protocol codec: byte orders, entries, replies, and every kind of bad input."""

from __future__ import annotations

import errno
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.wire.client import (
    EP_REPLY_MAX,
    MAX_EP_ADDRS,
    PATH_ALTERNATE_FLAGS,
    PATH_REPLY_FLAGS,
    AcmHdr,
    AcmMessage,
    AcmOp,
    AcmStatus,
    AddrType,
    EpAddr,
    EpConfig,
    EpFlag,
    PerfRequest,
    PerfScope,
    decode_ep_reply,
    decode_perf_reply,
    decode_perf_request,
    decode_resolve_pair,
    encode_ep_reply,
    encode_one_path_reply,
    encode_perf_reply,
    encode_perf_request,
    encode_query_sa_reply,
    encode_resolve_reply,
    pad_address,
    reply_length,
    request_length,
    status_errno,
)
from ibacm.wire.errors import (
    BadLengthError,
    BadOpcodeError,
    FieldRangeError,
    OversizeError,
    TruncatedError,
    WireError,
)
from ibacm.wire.path_record import PathRecord
from tests.wire.strategies import acm_messages, ep_addrs, path_records, resolve_headers, uint

# -- header -------------------------------------------------------------------------------


def test_resolve_length_is_little_endian_other_ops_big_endian() -> None:
    assert AcmHdr(opcode=AcmOp.RESOLVE, length=0x58).encode()[6:8] == b"\x58\x00"
    assert AcmHdr(opcode=0x81, length=0x58).encode()[6:8] == b"\x58\x00"
    assert AcmHdr(opcode=AcmOp.PERF_QUERY, length=0x48).encode()[6:8] == b"\x00\x48"
    assert AcmHdr(opcode=0x83, length=0x120).encode()[6:8] == b"\x01\x20"


def test_tid_is_opaque_and_round_trips() -> None:
    raw = bytes.fromhex("0101000000005800") + bytes(range(1, 9))
    hdr = AcmHdr.decode(raw)
    assert hdr.tid == int.from_bytes(bytes(range(1, 9)), "little")
    assert hdr.encode() == raw


def test_server_and_client_length_rules_differ_only_for_0x81() -> None:
    head = bytes.fromhex("0181000000000058")
    assert request_length(head) == 0x58  # server: big-endian unless byte is exactly 0x01
    assert reply_length(head) == 0x5800  # clients: little-endian for any RESOLVE
    assert request_length(bytes.fromhex("0101000000005800")) == 0x58
    assert request_length(bytes.fromhex("0102000000000010")) == 16
    with pytest.raises(TruncatedError, match="needs at least 8 bytes, got 7"):
        request_length(bytes(7))


def test_header_decode_needs_16_bytes() -> None:
    with pytest.raises(TruncatedError, match="acm_hdr: needs at least 16 bytes, got 15"):
        AcmHdr.decode(bytes(15))


def test_header_encode_rejects_out_of_range_fields() -> None:
    with pytest.raises(FieldRangeError, match=r"status: value 256 out of range 0\.\.255"):
        AcmHdr(opcode=1, status=256).encode()
    with pytest.raises(FieldRangeError, match="length: value 65536"):
        AcmHdr(opcode=1, length=65536).encode()


@given(resolve_headers, uint(16))
@settings(max_examples=200)
def test_header_round_trip(hdr: AcmHdr, length: int) -> None:
    hdr.length = length
    assert AcmHdr.decode(hdr.encode()) == hdr


@given(st.binary(min_size=16, max_size=16))
@settings(max_examples=200)
def test_any_header_bytes_round_trip(raw: bytes) -> None:
    assert AcmHdr.decode(raw).encode() == raw


def test_status_errno_follows_libacm() -> None:
    assert status_errno(AcmStatus.SUCCESS) == 0
    assert status_errno(AcmStatus.ENOMEM) == errno.ENOMEM
    assert status_errno(AcmStatus.ENOTCONN) == errno.ENOTCONN
    assert status_errno(AcmStatus.ETIMEDOUT) == errno.ETIMEDOUT
    assert status_errno(AcmStatus.ESRCADDR) == errno.EADDRNOTAVAIL
    assert status_errno(AcmStatus.EDESTADDR) == errno.EADDRNOTAVAIL
    assert status_errno(AcmStatus.ESRCTYPE) == errno.EINVAL
    assert status_errno(4) == errno.EINVAL  # unused value
    assert status_errno(101) == errno.EINVAL  # raw errno from source selection


# -- entries ------------------------------------------------------------------------------


def test_ep_addr_layout_is_host_order_flags_and_type() -> None:
    raw = EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE | EpFlag.NODELAY).encode()
    assert raw[:8] == bytes.fromhex("0100004002000000")
    assert raw[8:12] == bytes((10, 0, 0, 1)) and raw[12:] == bytes(60)


def test_constructors_produce_zero_padded_addresses() -> None:
    assert EpAddr.from_ip(ipaddress.ip_address("fe80::5"), 2).type == AddrType.IP6
    gid = EpAddr.from_gid("fe80::2:c903:a:2b3c")
    assert gid.type == AddrType.GID and gid.info[:2] == b"\xfe\x80" and gid.info[16:] == bytes(48)
    assert EpAddr.from_gid(gid.info[:16]) == gid
    lid = EpAddr.from_lid(0x1234)
    assert lid.info[:2] == b"\x12\x34" and lid.info[2:] == bytes(62)
    assert lid.address_text() == str(0x1234)
    assert gid.address_text() == "fe80::2:c903:a:2b3c"
    name = EpAddr.from_name("n" * 63)
    assert name.info == b"n" * 63 + b"\0"
    assert EpAddr.from_text(AddrType.LID, "0x10").info[:2] == b"\x00\x10"
    assert EpAddr.from_text(AddrType.IP6, "::1").type == AddrType.IP6


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EpAddr.from_ip("1.2.3"), r"address: '1\.2\.3' is not an IP address"),
        (lambda: EpAddr.from_name("n" * 64), "is 64 bytes, at most 63 fit"),
        (lambda: EpAddr.from_name(""), "name: must not be empty"),
        (lambda: EpAddr.from_name("a\0b"), "contains a NUL"),
        (lambda: EpAddr.from_gid(bytes(15)), "gid: expected exactly 16 bytes, got 15"),
        (lambda: EpAddr.from_gid("not-a-gid"), "is not a GID"),
        (lambda: EpAddr.from_lid(0x10000), r"lid: value 65536 out of range 0\.\.65535"),
        (lambda: EpAddr.from_text(AddrType.IP, "::1"), "is not an IP address"),
        (lambda: EpAddr.from_text(AddrType.LID, "five"), "lid: 'five' is not a number"),
        (lambda: EpAddr.from_text(AddrType.PATH, "x"), "cannot be parsed from text"),
        (lambda: EpAddr(1, 2, bytes(63)).encode(), "info: expected exactly 64 bytes, got 63"),
        (lambda: EpAddr(1 << 32, 2).encode(), "flags: value 4294967296"),
    ],
)
def test_bad_addresses_are_rejected_with_a_clear_message(build: object, message: str) -> None:
    with pytest.raises(FieldRangeError, match=message):
        build()  # type: ignore[operator]


def test_pad_address_keeps_only_significant_bytes() -> None:
    junk = bytes(range(1, 65))
    assert pad_address(AddrType.IP, junk) == junk[:4] + bytes(60)
    assert pad_address(AddrType.IP6, junk) == junk[:16] + bytes(48)
    assert pad_address(AddrType.GID, junk) == junk[:16] + bytes(48)
    assert pad_address(AddrType.LID, junk) == junk[:2] + bytes(62)
    assert pad_address(AddrType.NAME, b"node1\0stale") == b"node1" + bytes(59)
    assert pad_address(AddrType.NAME, b"x" * 70) == b"x" * 64
    assert pad_address(AddrType.PATH, junk) == junk
    with pytest.raises(FieldRangeError, match="type IP6 needs 16 bytes, got 4"):
        pad_address(AddrType.IP6, bytes(4))
    with pytest.raises(FieldRangeError, match="address type: 7 has no address layout"):
        pad_address(7, bytes(64))


def test_address_text_never_raises() -> None:
    assert EpAddr(0, 99, b"\x01" + bytes(63)).address_text() == "type 99: 01"
    assert "dlid=5" in EpAddr.from_path(PathRecord(dlid=5)).address_text()
    assert EpAddr(0, AddrType.NAME, b"\xff\xfe" + bytes(62)).address_text() == "\ufffd\ufffd"


def test_ep_addr_decode_needs_exactly_72_bytes() -> None:
    with pytest.raises(TruncatedError, match="needs 72 bytes, got 71"):
        EpAddr.decode(bytes(71))
    with pytest.raises(OversizeError, match="exactly 72 bytes, got 73"):
        EpAddr.decode(bytes(73))


@given(ep_addrs)
@settings(max_examples=200)
def test_ep_addr_round_trip(entry: EpAddr) -> None:
    assert EpAddr.decode(entry.encode()) == entry


# -- RESOLVE messages ---------------------------------------------------------------------


@given(acm_messages)
@settings(max_examples=200)
def test_acm_message_round_trip(message: AcmMessage) -> None:
    raw = message.encode()
    assert len(raw) == 16 + 72 * len(message.entries) == message.hdr.length
    assert AcmMessage.decode(raw) == message


def test_message_rejects_a_ninth_entry() -> None:
    message = AcmMessage(hdr=AcmHdr(opcode=1), entries=[EpAddr.from_lid(1)] * 9)
    with pytest.raises(OversizeError, match="9 entries, at most 8 fit in 592 bytes"):
        message.encode()


def test_trailing_partial_entry_is_ignored() -> None:
    raw = AcmMessage(hdr=AcmHdr(opcode=1), entries=[EpAddr.from_lid(7, 2)]).encode()
    raw = raw[:6] + (100).to_bytes(2, "little") + raw[8:] + bytes(12)
    message = AcmMessage.decode(raw)
    assert message.hdr.length == 100 and len(message.entries) == 1


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        (bytes.fromhex("0101000000000800") + bytes(8), BadLengthError, "length 8 is below"),
        (bytes.fromhex("0101000000005802") + bytes(592), OversizeError, "exceeds the maximum"),
        (bytes.fromhex("0101000000005800") + bytes(40), TruncatedError, "only 48 bytes"),
        (bytes.fromhex("0101000000001000") + bytes(9), BadLengthError, "but 17 bytes given"),
        (bytes.fromhex("0102000000000010") + bytes(8), BadOpcodeError, "0x02 is not RESOLVE"),
        (bytes(10), TruncatedError, "acm_hdr"),
    ],
)
def test_bad_resolve_messages(raw: bytes, error: type[WireError], message: str) -> None:
    with pytest.raises(error, match=message):
        AcmMessage.decode(raw)


def test_resolve_reply_shapes() -> None:
    request = AcmHdr(opcode=1, data0=1, data1=2, data2=3, length=88, tid=0xABCDEF)
    failure = encode_resolve_reply(request, AcmStatus.ESRCADDR, ack=True)
    assert failure == AcmHdr(opcode=0x81, status=7, tid=0xABCDEF).encode()
    paths = [PathRecord(dlid=5), PathRecord(dlid=6)]
    source = EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE)
    reply = AcmMessage.decode(encode_resolve_reply(request, 0, paths, source))
    assert (reply.hdr.opcode, reply.hdr.data0, reply.hdr.data1, reply.hdr.data2) == (1, 0, 0, 0)
    assert reply.hdr.tid == 0xABCDEF and reply.hdr.length == 16 + 3 * 72
    assert [e.flags for e in reply.entries] == [PATH_REPLY_FLAGS, PATH_ALTERNATE_FLAGS, 1]
    assert [e.path().dlid for e in reply.entries[:2]] == [5, 6]
    with pytest.raises(FieldRangeError, match="needs at least one path record"):
        encode_resolve_reply(request, AcmStatus.SUCCESS)
    with pytest.raises(OversizeError, match="9 entries"):
        encode_resolve_reply(request, 0, [PathRecord()] * 8, source)


@given(message=acm_messages)
def test_resolve_pair_is_what_the_general_decoder_sees(message: AcmMessage) -> None:
    raw = message.encode()
    pair = decode_resolve_pair(raw)
    if len(message.entries) != 2:
        assert pair is None
    else:
        assert pair is not None and list(pair) == AcmMessage.decode(raw).entries


@given(hdr=resolve_headers, path=path_records)
def test_one_path_reply_from_request_bytes_is_the_general_reply(
    hdr: AcmHdr, path: PathRecord
) -> None:
    request = AcmMessage(hdr=hdr, entries=[EpAddr.from_name("a"), EpAddr.from_name("b")]).encode()
    expected = encode_resolve_reply(AcmHdr.decode(request), AcmStatus.SUCCESS, [path])
    assert encode_one_path_reply(request, path.encode()) == expected


def test_query_sa_reply_echoes_request() -> None:
    path = PathRecord(dlid=5, slid=1, pkey=0xFFFF)
    request = AcmMessage(
        hdr=AcmHdr(opcode=1, data0=4, tid=9), entries=[EpAddr.from_path(path, EpFlag.QUERY_SA)]
    )
    request = AcmMessage.decode(request.encode())
    answer = PathRecord(dlid=5, slid=1, pkey=0xFFFF, sl=3, mtu=4)
    reply = AcmMessage.decode(encode_query_sa_reply(request, 0, answer))
    assert (reply.hdr.opcode, reply.hdr.status, reply.hdr.data0, reply.hdr.tid) == (0x81, 0, 4, 9)
    assert reply.hdr.length == 88 and reply.entries[0].flags == EpFlag.QUERY_SA
    assert reply.entries[0].path() == answer
    timed_out = AcmMessage.decode(encode_query_sa_reply(request, AcmStatus.ETIMEDOUT, None))
    assert timed_out.entries == request.entries and timed_out.hdr.status == 6


def test_query_sa_reply_keeps_an_odd_request_length() -> None:
    raw = AcmMessage(hdr=AcmHdr(opcode=1), entries=[EpAddr.from_path(PathRecord())]).encode()
    raw = raw[:6] + (100).to_bytes(2, "little") + raw[8:] + bytes(12)
    reply = encode_query_sa_reply(AcmMessage.decode(raw), AcmStatus.EINVAL, None)
    assert len(reply) == 100 and reply[88:] == bytes(12)
    assert AcmHdr.decode(reply).length == 100
    with pytest.raises(FieldRangeError, match="needs entry 0"):
        encode_query_sa_reply(AcmMessage(hdr=AcmHdr(opcode=1)), 0, PathRecord())


# -- PERF_QUERY / EP_QUERY ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "source", "scope"),
    [
        (0, None, PerfScope.GLOBAL),
        (3, None, PerfScope.INDEX),
        (0, EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE), PerfScope.ADDRESS),
        (2, EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE), PerfScope.INDEX),
        (0, EpAddr.from_ip("10.0.0.1", EpFlag.DEST), PerfScope.GLOBAL),
        (2, EpAddr.from_ip("10.0.0.1", EpFlag.DEST), PerfScope.GLOBAL),
    ],
)
def test_perf_scope_follows_c(index: int, source: EpAddr | None, scope: PerfScope) -> None:
    request = decode_perf_request(encode_perf_request(index, source, tid=5))
    assert request == PerfRequest(hdr=request.hdr, index=index, source=source)
    assert request.scope is scope and request.hdr.tid == 5


def test_perf_reply_error_keeps_data0_and_is_bare() -> None:
    request = AcmHdr(opcode=AcmOp.PERF_QUERY, data0=9, data1=4, tid=3)
    raw = encode_perf_reply(request, AcmStatus.ESRCADDR, [1, 2, 3])
    assert raw == AcmHdr(opcode=0x82, status=7, data0=9, data1=4, tid=3).encode()
    assert decode_perf_reply(raw).counters == []


def test_perf_counters_are_64_bit() -> None:
    request = AcmHdr(opcode=AcmOp.PERF_QUERY)
    assert decode_perf_reply(encode_perf_reply(request, 0, [2**64 - 1])).counters == [2**64 - 1]
    with pytest.raises(FieldRangeError, match=r"counter\[1\]: value 18446744073709551616"):
        encode_perf_reply(request, 0, [0, 2**64])
    bad = AcmHdr(opcode=0x82, length=20).encode() + bytes(4)
    with pytest.raises(BadLengthError, match="not 16 \\+ a multiple of 8"):
        decode_perf_reply(bad)


def test_ep_reply_error_and_cap() -> None:
    request = AcmHdr(opcode=AcmOp.EP_QUERY, data0=5, data1=1, tid=1)
    failure = encode_ep_reply(request, AcmStatus.EINVAL, None)
    assert failure == AcmHdr(opcode=0x83, status=2, data0=5, tid=1).encode()
    assert decode_ep_reply(failure) == (AcmHdr.decode(failure), None)
    config = EpConfig(
        1, 1, 2, 0x8001, "ibacmp", [f"10.0.{i // 256}.{i % 256}" for i in range(1100)]
    )
    raw = encode_ep_reply(request, 0, config)
    assert len(raw) == 16 + 80 + 64 * MAX_EP_ADDRS <= EP_REPLY_MAX
    _, parsed = decode_ep_reply(raw)
    assert parsed is not None and parsed.addrs == config.addrs[:MAX_EP_ADDRS]
    with pytest.raises(FieldRangeError, match="needs the endpoint config"):
        encode_ep_reply(request, 0, None)
    with pytest.raises(FieldRangeError, match=r"addrs\[0\]: 'x{64}' is 64 bytes"):
        encode_ep_reply(request, 0, EpConfig(1, 1, 1, 1, "p", ["x" * 64]))


def test_ep_reply_with_inconsistent_addr_count() -> None:
    raw = bytearray(encode_ep_reply(AcmHdr(opcode=3), 0, EpConfig(1, 1, 1, 1, "p", ["a"])))
    raw[30:32] = (2).to_bytes(2, "big")  # addr_cnt says 2, body holds 1
    with pytest.raises(BadLengthError, match="addr_cnt 2 needs 208 bytes, got 144"):
        decode_ep_reply(bytes(raw))


@given(path_records)
@settings(max_examples=100)
def test_paths_survive_a_resolve_reply(path: PathRecord) -> None:
    reply = AcmMessage.decode(encode_resolve_reply(AcmHdr(opcode=1), 0, [path]))
    assert reply.entries[0].path() == path


ep_texts = st.text(max_size=63).filter(lambda t: "\0" not in t and len(t.encode()) <= 63)


@given(
    st.builds(
        EpConfig,
        dev_guid=uint(64),
        port_num=uint(8),
        phys_port_cnt=uint(8),
        pkey=uint(16),
        prov_name=ep_texts,
        addrs=st.lists(ep_texts, max_size=12),
    ),
    uint(8),
    uint(64),
)
@settings(max_examples=200)
def test_ep_config_round_trip(config: EpConfig, index: int, tid: int) -> None:
    request = AcmHdr(opcode=AcmOp.EP_QUERY, data0=index, data1=1, tid=tid)
    hdr, parsed = decode_ep_reply(encode_ep_reply(request, AcmStatus.SUCCESS, config))
    assert parsed == config
    assert (hdr.opcode, hdr.data0, hdr.data1, hdr.tid) == (0x83, index, 0, tid)

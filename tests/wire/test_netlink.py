"""Kernel RDMA_NL_LS messages: the §16.6 bytes, validation per §16.3, the C fixes."""

from __future__ import annotations

import ipaddress
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.wire.client import EpFlag
from ibacm.wire.errors import BadLengthError, FieldRangeError, WireError
from ibacm.wire.netlink import (
    HOST_ORDER,
    NLA_F_MANDATORY,
    NLM_F_REQUEST,
    RDMA_NL_LS_F_ERR,
    IbPathFlag,
    LsAttr,
    LsAttributeError,
    LsErrorReply,
    LsHeaderError,
    LsIpResolveReply,
    LsIpResolveRequest,
    LsOp,
    LsPathReply,
    LsRequestError,
    LsResolveRequest,
    LsSetTimeout,
    LsUnsupportedOpError,
    NetlinkClientError,
    NetlinkLengthError,
    NlMsgHdr,
    PathUse,
    clamp_timeout,
    decode_ls_message,
    encode_ls_error_reply,
    encode_ls_ip_resolve_reply,
    encode_ls_ip_resolve_request,
    encode_ls_path_reply,
    encode_ls_resolve_request,
    encode_ls_set_timeout,
    ls_type,
    reply_path_flags,
    walk_attrs,
)
from ibacm.wire.path_record import PathRecord, gid_from_text
from tests.conftest import not_applicable_if
from tests.wire.spec_hex import offset_dump, section_blocks, spec_text
from tests.wire.strategies import gids, path_records, uint

little_endian_only = not_applicable_if(
    sys.byteorder != "little", "the §16.6 dump was derived for a little-endian host"
)

LOCAL_GID = gid_from_text("fe80::2:c903:a:2b3c")
REMOTE_GID = gid_from_text("fe80::2:c903:a:2b3d")


def kernel_request(**kwargs: object) -> bytes:
    params: dict[str, object] = {
        "service_id": 0x1061234,
        "dgid": REMOTE_GID,
        "sgid": LOCAL_GID,
        "tclass": 0,
        "pkey": 0xFFFF,
    }
    params.update(kwargs)
    return encode_ls_resolve_request(42, "mlx5_0", 1, PathUse.GMP, **params)  # type: ignore[arg-type]


def example_path() -> PathRecord:
    path = PathRecord(dgid=REMOTE_GID, sgid=LOCAL_GID, dlid=5, slid=3, pkey=0xFFFF)
    path.reversible_numpath, path.mtu_byte, path.rate_byte = 0x81, 0x84, 0x87
    path.packetlifetime_byte = 0x92
    return path


@pytest.fixture(scope="module")
def section() -> str:
    text = spec_text("behavior.md")
    return text[text.index("### 16.6") : text.index("## 17.")]


@little_endian_only
def test_16_6_request(section: str) -> None:
    expected = offset_dump(section_blocks(section, "### 16.6")[0], 152)
    assert kernel_request() == expected
    message = decode_ls_message(expected)
    assert isinstance(message, LsResolveRequest)
    assert (message.hdr.seq, message.hdr.type, message.hdr.flags) == (42, 0x1000, NLM_F_REQUEST)
    assert (message.device_name, message.port_num, message.path_use) == ("mlx5_0", 1, 2)
    assert (message.service_id, message.tclass, message.pkey) == (0x1061234, 0, 0xFFFF)
    assert message.encode() == expected
    path, flags = message.to_path()
    assert path == PathRecord(
        service_id=0x1061234,
        dgid=REMOTE_GID,
        sgid=LOCAL_GID,
        pkey=0xFFFF,
        reversible=True,
        numb_path=1,
    )
    assert path.reversible_numpath == 0x81 and flags == EpFlag.DEST | EpFlag.SOURCE
    assert path.comp_mask() == 0x280F  # service id, dgid, sgid, reversible, pkey


@little_endian_only
def test_16_6_success_and_error_replies(section: str) -> None:
    expected = offset_dump(section_blocks(section, "### 16.6")[1], 92)
    request_hdr = NlMsgHdr.decode(kernel_request())
    flags = reply_path_flags(PathUse.GMP)
    assert encode_ls_path_reply(request_hdr, [(flags, example_path())], pid=1234) == expected
    reply = decode_ls_message(expected)
    assert isinstance(reply, LsPathReply) and reply.paths == [(0x2B, example_path())]
    error_hex = re.search(r"Error reply: `([0-9a-f ]+)`", section)
    assert error_hex is not None
    error = bytes.fromhex(error_hex.group(1))
    assert encode_ls_error_reply(request_hdr, pid=1234) == error
    parsed = decode_ls_message(error)
    assert isinstance(parsed, LsErrorReply) and parsed.hdr.flags == RDMA_NL_LS_F_ERR


def test_reply_flags_per_path_use() -> None:
    assert reply_path_flags(PathUse.UNIDIRECTIONAL) == 0x0A
    assert reply_path_flags(PathUse.GMP) == reply_path_flags(PathUse.ALL) == 0x2B
    assert IbPathFlag.BIDIRECTIONAL == IbPathFlag.OUTBOUND | IbPathFlag.INBOUND_REVERSE


def test_unidirectional_and_qos_class_is_shifted() -> None:
    request = decode_ls_message(
        encode_ls_resolve_request(1, "mlx5_0", 1, PathUse.UNIDIRECTIONAL, qos_class=0x123)
    )
    assert isinstance(request, LsResolveRequest)
    path, flags = request.to_path()
    assert path.reversible_numpath == 0x01 and flags == 0
    assert path.qosclass_sl == 0x1230  # C would store 0x0120 (defect #48)


def test_timeout_and_ip_attributes_are_understood() -> None:
    extra = [(NLA_F_MANDATORY | LsAttr.IPV4, bytes((10, 0, 0, 7)))]
    request = decode_ls_message(kernel_request(timeout_ms=5000, extra_attrs=extra))
    assert isinstance(request, LsResolveRequest)
    assert request.timeout_ms == 5000
    assert request.ip_address == ipaddress.IPv4Address("10.0.0.7")


def test_ip_resolve_request_and_reply() -> None:
    raw = encode_ls_ip_resolve_request(7, ifindex=3, address="fe80::1234", pid=0)
    request = decode_ls_message(raw)
    assert isinstance(request, LsIpResolveRequest)
    assert (request.hdr.type, request.ifindex) == (ls_type(LsOp.IP_RESOLVE), 3)
    assert request.address == ipaddress.IPv6Address("fe80::1234")
    assert request.encode() == raw
    reply_raw = encode_ls_ip_resolve_reply(request.hdr, [REMOTE_GID], pid=99)
    assert len(reply_raw) == 16 + 20
    assert int.from_bytes(reply_raw[18:20], HOST_ORDER) == LsAttr.DGID  # no flag bits
    reply = decode_ls_message(reply_raw)
    assert isinstance(reply, LsIpResolveReply)
    assert (reply.gids, reply.hdr.seq, reply.hdr.pid, reply.hdr.flags) == ([REMOTE_GID], 7, 99, 0)
    v4 = decode_ls_message(encode_ls_ip_resolve_request(8, 2, ipaddress.IPv4Address("10.1.1.1")))
    assert isinstance(v4, LsIpResolveRequest) and str(v4.address) == "10.1.1.1"


def test_set_timeout_round_trip() -> None:
    raw = encode_ls_set_timeout(5, 4000, pid=1234)
    assert len(raw) == 24
    assert int.from_bytes(raw[18:20], HOST_ORDER) == LsAttr.TIMEOUT  # kernel needs no flags
    message = decode_ls_message(raw)
    assert isinstance(message, LsSetTimeout) and message.timeout_ms == 4000
    assert message.hdr.type == ls_type(LsOp.SET_TIMEOUT) and message.hdr.flags == NLM_F_REQUEST
    assert (clamp_timeout(10), clamp_timeout(5000), clamp_timeout(10**6)) == (100, 5000, 200000)


def test_several_paths_in_one_reply() -> None:
    request_hdr = NlMsgHdr.decode(kernel_request())
    paths = [(0x2B, example_path()), (0x0C, PathRecord(dlid=9))]
    reply = decode_ls_message(encode_ls_path_reply(request_hdr, paths, pid=1))
    assert isinstance(reply, LsPathReply) and reply.paths == paths
    assert reply.hdr.len == 16 + 2 * 76
    with pytest.raises(FieldRangeError, match="needs at least one path"):
        encode_ls_path_reply(request_hdr, [], pid=1)


def with_length(raw: bytes, length: int) -> bytes:
    return length.to_bytes(4, HOST_ORDER) + raw[4:]


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        (bytes(15), NetlinkLengthError, "15 bytes, a header needs 16"),
        (with_length(kernel_request(), 200), NetlinkLengthError, "nlmsg_len 200 outside 16..152"),
        (with_length(kernel_request(), 8), NetlinkLengthError, "nlmsg_len 8"),
        (NlMsgHdr(len=16, type=(3 << 10), flags=1).encode(), NetlinkClientError, "client 3"),
        (
            NlMsgHdr(len=16 + 69, type=0x1000, flags=1).encode() + bytes(69),
            LsHeaderError,
            "RESOLVE: 69 payload bytes",
        ),
        (
            kernel_request(extra_attrs=[(NLA_F_MANDATORY | LsAttr.DGID, bytes(15))]),
            LsAttributeError,
            "attribute DGID: payload of 15 bytes, expected 16",
        ),
        (
            kernel_request(extra_attrs=[(NLA_F_MANDATORY | 30, b"x")]),
            LsAttributeError,
            r"attribute type 30 \(0x201e\) is unknown but mandatory",
        ),
        (
            kernel_request(extra_attrs=[(NLA_F_MANDATORY | LsAttr.PATH_RECORD, bytes(72))]),
            LsAttributeError,
            "attribute type 1",
        ),
        (
            kernel_request(extra_attrs=[(NLA_F_MANDATORY | LsAttr.QOS_CLASS, b"\xff\xff")]),
            LsAttributeError,
            "QOS_CLASS: value 65535 exceeds 12 bits",
        ),
        (
            NlMsgHdr(len=16, type=ls_type(5), flags=1).encode(),
            LsUnsupportedOpError,
            "LS op 5 is not supported",
        ),
        (
            NlMsgHdr(len=18, type=ls_type(LsOp.IP_RESOLVE), flags=1).encode() + bytes(2),
            LsHeaderError,
            "IP_RESOLVE: 2 payload bytes",
        ),
        (
            NlMsgHdr(len=20, type=ls_type(LsOp.IP_RESOLVE), flags=1).encode() + bytes(4),
            LsUnsupportedOpError,
            "without IPV4/IPV6",
        ),
        (
            NlMsgHdr(len=16, type=ls_type(LsOp.SET_TIMEOUT), flags=1).encode(),
            LsUnsupportedOpError,
            "SET_TIMEOUT without a TIMEOUT",
        ),
        (
            NlMsgHdr(len=24, type=0x1000).encode()
            + (8).to_bytes(2, HOST_ORDER)
            + b"\x01\x00"
            + bytes(4),
            BadLengthError,
            "PATH_RECORD: 4 bytes, expected 72",
        ),
    ],
)
def test_invalid_messages(raw: bytes, error: type[WireError], message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        decode_ls_message(raw)
    if isinstance(caught.value, LsRequestError):
        # The daemon answers these with an error reply to the same seq/type.
        reply = decode_ls_message(encode_ls_error_reply(caught.value.hdr, pid=1))
        assert isinstance(reply, LsErrorReply)
        assert reply.hdr.seq == NlMsgHdr.decode(raw).seq


def test_unknown_optional_attribute_is_ignored() -> None:
    request = decode_ls_message(kernel_request(extra_attrs=[(30, b"abc")]))
    assert isinstance(request, LsResolveRequest) and request.to_path()[0].pkey == 0xFFFF


def test_attribute_walk_stops_at_a_bad_header_like_c() -> None:
    good = (6).to_bytes(2, HOST_ORDER) + (7).to_bytes(2, HOST_ORDER) + b"\xff\xff\0\0"
    bad = (40).to_bytes(2, HOST_ORDER) + (4).to_bytes(2, HOST_ORDER) + bytes(4)
    assert walk_attrs(good + bad) == [(7, b"\xff\xff")]
    assert walk_attrs(good + b"\x01") == [(7, b"\xff\xff")]


def test_device_name_validation() -> None:
    with pytest.raises(FieldRangeError, match="device_name"):
        encode_ls_resolve_request(1, "x" * 64, 1, 0)
    with pytest.raises(FieldRangeError, match="qos_class: value 4096"):
        encode_ls_resolve_request(1, "mlx5_0", 1, 0, qos_class=4096)


optional_gid = st.none() | gids


@given(
    seq=uint(32),
    pid=uint(32),
    port=uint(8),
    path_use=st.sampled_from(list(PathUse)),
    service_id=st.none() | uint(64),
    dgid=optional_gid,
    sgid=optional_gid,
    tclass=st.none() | uint(8),
    pkey=st.none() | uint(16),
    qos_class=st.none() | uint(12),
    mandatory=st.booleans(),
)
@settings(max_examples=200)
def test_resolve_request_round_trip(
    seq: int,
    pid: int,
    port: int,
    path_use: int,
    service_id: int | None,
    dgid: bytes | None,
    sgid: bytes | None,
    tclass: int | None,
    pkey: int | None,
    qos_class: int | None,
    mandatory: bool,
) -> None:
    raw = encode_ls_resolve_request(
        seq,
        "mlx5_1",
        port,
        path_use,
        service_id=service_id,
        dgid=dgid,
        sgid=sgid,
        tclass=tclass,
        pkey=pkey,
        qos_class=qos_class,
        pid=pid,
        mandatory=mandatory,
    )
    if len(raw) == 16 + 68:
        # No attribute at all: C requires the header plus one attribute (§16.3 item 4).
        with pytest.raises(LsHeaderError, match="68 payload bytes"):
            decode_ls_message(raw)
        return
    request = decode_ls_message(raw)
    assert isinstance(request, LsResolveRequest)
    assert request.encode() == raw and request.hdr.len == len(raw)
    assert (request.service_id, request.dgid, request.sgid) == (service_id, dgid, sgid)
    assert (request.tclass, request.pkey, request.qos_class) == (tclass, pkey, qos_class)
    path, flags = request.to_path()
    assert path.reversible == (path_use != PathUse.UNIDIRECTIONAL)
    assert path.qos_class == (qos_class or 0) and path.service_id == (service_id or 0)
    assert bool(flags & EpFlag.DEST) == (dgid is not None)
    assert bool(flags & EpFlag.SOURCE) == (sgid is not None)


@given(st.lists(st.tuples(uint(32), path_records), min_size=1, max_size=6), uint(32))
@settings(max_examples=100)
def test_path_reply_round_trip(paths: list[tuple[int, PathRecord]], seq: int) -> None:
    request_hdr = NlMsgHdr(type=0x1000, flags=NLM_F_REQUEST, seq=seq)
    reply = decode_ls_message(encode_ls_path_reply(request_hdr, paths, pid=3))
    assert isinstance(reply, LsPathReply) and reply.paths == paths and reply.hdr.seq == seq

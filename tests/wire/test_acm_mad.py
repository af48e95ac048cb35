"""ACM peer MADs (class 0x2C): the §9.9 examples, MGIDs, validation incl. defect #38."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings

from ibacm.wire.acm_mad import (
    ACM_METHOD_RESOLVE,
    ACM_METHOD_RESP,
    MAX_GIDS_IN_MAD,
    AcmMad,
    acm_request,
    acm_response,
    mgid_for,
)
from ibacm.wire.client import AcmStatus, AddrType
from ibacm.wire.errors import (
    BadOpcodeError,
    BadVersionError,
    FieldRangeError,
    GidCountError,
    OversizeError,
    TruncatedError,
    WireError,
)
from tests.wire.spec_hex import offset_dump, section_blocks, spec_text
from tests.wire.strategies import acm_mads

GROUP0 = mgid_for(0xFFFF, rate=3, mtu=4)  # 10 Gb/s, 2048
GROUP1 = mgid_for(0xFFFF, rate=7, mtu=5)  # 40 Gb/s, 4096


@pytest.fixture(scope="module")
def examples() -> list[str]:
    return section_blocks(spec_text("mad-protocol.md"), "### 9.9")


def test_9_9_request(examples: list[str]) -> None:
    expected = offset_dump(examples[0], 256)
    request = acm_request(
        5,
        AddrType.IP,
        ipaddress.IPv4Address("192.168.1.20").packed,
        AddrType.IP,
        ipaddress.IPv4Address("192.168.1.10").packed,
        [GROUP0, GROUP1],
    )
    assert request.encode() == expected
    decoded = AcmMad.decode(expected)
    assert decoded == request and not decoded.is_response
    assert (decoded.dest_length, decoded.src_length) == (64, 64)


def test_9_9_response_choosing_group_1(examples: list[str]) -> None:
    expected = offset_dump(examples[1], 256)
    response = acm_response(5, GROUP1)
    assert response.encode() == expected
    decoded = AcmMad.decode(expected)
    assert decoded.is_response and decoded.gids == [GROUP1] and decoded.acm_status == 0


def test_mgid_format() -> None:
    assert str(ipaddress.IPv6Address(GROUP0)) == "ff15:4001:ffff:3:400::"
    assert mgid_for(0x7FFF, 3, 4) == GROUP0  # the full-member bit is forced on
    assert mgid_for(0x8001, 16, 5, tos=2)[4:9] == bytes((0x80, 0x01, 2, 16, 5))
    with pytest.raises(FieldRangeError, match="pkey: value 65536"):
        mgid_for(0x10000, 3, 4)


def test_request_pads_addresses_and_response_carries_status() -> None:
    request = acm_request(1, AddrType.NAME, b"node20\0junk", AddrType.LID, b"\x00\x05zz", [GROUP0])
    assert request.dest == b"node20" + bytes(58) and request.src == b"\x00\x05" + bytes(62)
    failed = acm_response(2, GROUP0, status=AcmStatus.ENODATA)
    assert failed.status == 0x0300 and failed.acm_status == AcmStatus.ENODATA
    assert AcmMad.decode(failed.encode()).method == ACM_METHOD_RESP


def test_more_than_six_gids_never_encoded() -> None:
    with pytest.raises(GidCountError, match="gid_cnt: 7 MGIDs, at most 6 fit"):
        AcmMad(method=ACM_METHOD_RESOLVE, gids=[GROUP0] * 7).encode()
    assert len(AcmMad(method=ACM_METHOD_RESOLVE, gids=[GROUP0] * MAX_GIDS_IN_MAD).encode()) == 256


def patched(offset: int, value: bytes) -> bytes:
    raw = acm_request(9, AddrType.IP, bytes(4), AddrType.IP, bytes(4), [GROUP0]).encode()
    return raw[:offset] + value + raw[offset + len(value) :]


@pytest.mark.parametrize(
    ("raw", "error", "message"),
    [
        (patched(20, b"\x07"), GidCountError, "gid_cnt: 7 MGIDs claimed, at most 6"),
        (patched(20, b"\x0a"), GidCountError, "gid_cnt: 10"),  # C would read past the MAD
        (patched(0, b"\x02"), BadVersionError, "base_version: 2, expected 1"),
        (patched(2, b"\x02"), BadVersionError, "class_version: 2, expected 1"),
        (patched(1, b"\x03"), BadOpcodeError, "mgmt_class: 0x03 is not the ACM class 0x2c"),
        (patched(6, b"\x80\x00"), FieldRangeError, "control: 0x8000, expected 0x0001"),
        (bytes(255), TruncatedError, "ACM MAD: needs 256 bytes, got 255"),
        (bytes(296), OversizeError, "ACM MAD: must be exactly 256 bytes, got 296"),
    ],
)
def test_decode_rejects(raw: bytes, error: type[WireError], message: str) -> None:
    with pytest.raises(error, match=message):
        AcmMad.decode(raw)


def test_gid_count_error_is_a_field_range_error() -> None:
    assert issubclass(GidCountError, FieldRangeError)


@given(acm_mads)
@settings(max_examples=200)
def test_round_trip(mad: AcmMad) -> None:
    assert AcmMad.decode(mad.encode()) == mad

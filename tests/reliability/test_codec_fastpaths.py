"""The codecs' one-struct fast paths (added for throughput) agree with the field-by-field
paths byte for byte, and bad values still fail with the field named."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.compiled import is_compiled
from ibacm.wire import path_record
from ibacm.wire.acm_mad import AcmMad
from ibacm.wire.client import PATH_REPLY_FLAGS, AcmHdr, AcmMessage, EpAddr, encode_resolve_reply
from ibacm.wire.errors import FieldRangeError, WireError
from ibacm.wire.path_record import PathRecord
from tests.wire.strategies import acm_mads, ep_addrs, path_records, uint

headers = st.builds(
    AcmHdr,
    version=uint(8),
    opcode=uint(8),
    status=uint(8),
    data0=uint(8),
    data1=uint(8),
    data2=uint(8),
    length=uint(16),
    tid=uint(64),
)


@settings(max_examples=300, deadline=None)
@given(path_records)
def test_path_record_fast_path_matches(record: PathRecord) -> None:
    data = record.encode()
    assert data == record._encode_checked()
    assert PathRecord.decode(data) == record


@settings(max_examples=300, deadline=None)
@given(headers)
def test_header_fast_path_matches(hdr: AcmHdr) -> None:
    data = hdr.encode()
    assert data == hdr._encode_checked()
    assert AcmHdr.decode(data) == hdr


@settings(max_examples=300, deadline=None)
@given(ep_addrs)
def test_entry_fast_path_matches(entry: EpAddr) -> None:
    data = entry.encode()
    assert data == entry._encode_checked()
    assert EpAddr.decode(data) == entry


@settings(max_examples=300, deadline=None)
@given(acm_mads)
def test_acm_mad_fast_path_matches(mad: AcmMad) -> None:
    data = mad.encode()
    assert data == mad._encode_checked()
    if mad.control == 1:
        assert AcmMad.decode(data) == mad


@settings(max_examples=200, deadline=None)
@given(st.lists(ep_addrs, max_size=8), uint(64))
def test_message_decode_matches_entry_by_entry(entries: list[EpAddr], tid: int) -> None:
    data = AcmMessage(AcmHdr(opcode=1, tid=tid), entries).encode()
    decoded = AcmMessage.decode(data)
    assert decoded.entries == [
        EpAddr.decode(data[16 + 72 * i : 88 + 72 * i]) for i in range(len(entries))
    ]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"dlid": 1 << 16}, "dlid"),
        ({"flow_label": 1 << 20}, "flow_label"),
        ({"sl": 16}, "sl"),
        ({"mtu": 64}, "mtu"),
        ({"dgid": bytes(15)}, "dgid"),
        ({"reserved": bytes(7)}, "reserved"),
        ({"pkey": -1}, "pkey"),
    ],
)
def test_path_record_bad_values_name_the_field(change: dict[str, object], field: str) -> None:
    record = PathRecord(**change)  # type: ignore[arg-type]
    with pytest.raises(FieldRangeError, match=field):
        record.encode()


def test_path_record_of_the_wrong_type_is_refused() -> None:
    # As written the encoder names the field; compiled (mypyc) the class refuses the str
    # when it is built, as its annotation says.
    with pytest.raises((FieldRangeError, TypeError)):
        PathRecord(tclass="7").encode()  # type: ignore[arg-type]
    if not is_compiled(path_record):
        with pytest.raises(FieldRangeError, match="tclass"):
            PathRecord(tclass="7").encode()  # type: ignore[arg-type]


def test_bad_header_and_entry_values_name_the_field() -> None:
    with pytest.raises(FieldRangeError, match="length"):
        AcmHdr(opcode=2, length=1 << 16).encode()
    with pytest.raises(FieldRangeError, match="tid"):
        AcmHdr(tid=-1).encode()
    with pytest.raises(FieldRangeError, match="info"):
        EpAddr(1, 1, bytes(63)).encode()
    with pytest.raises(FieldRangeError, match="flags"):
        EpAddr(1 << 32, 1).encode()
    with pytest.raises(WireError, match="src"):
        AcmMad(method=1, src=bytes(3)).encode()


@settings(max_examples=200, deadline=None)
@given(path_records, st.binary(min_size=16, max_size=16), uint(16))
def test_aimed_at_is_replace(record: PathRecord, dgid: bytes, dlid: int) -> None:
    assert record.aimed_at(dgid, dlid) == dataclasses.replace(record, dgid=dgid, dlid=dlid)


@settings(max_examples=200, deadline=None)
@given(path_records, uint(64), st.booleans())
def test_one_path_reply_matches_the_general_encoding(
    record: PathRecord, tid: int, ack: bool
) -> None:
    request = AcmHdr(opcode=1, tid=tid)
    general = AcmMessage(
        AcmHdr(opcode=0x81 if ack else 0x01, tid=tid),
        [EpAddr.from_path(record, PATH_REPLY_FLAGS)],
    ).encode()
    assert encode_resolve_reply(request, 0, [record], None, ack=ack) == general

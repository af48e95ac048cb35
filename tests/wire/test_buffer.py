"""Buffer: byte orders, cursor, bounds and range checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.wire.buffer import Buffer
from ibacm.wire.errors import FieldRangeError, OversizeError, TruncatedError, WireError


def test_push_and_pull_both_byte_orders() -> None:
    buf = Buffer()
    buf.push_uint8(0x01)
    buf.push_uint16(0x0203)
    buf.push_uint32(0x04050607)
    buf.push_uint64(0x08090A0B0C0D0E0F)
    buf.push_uint16_le(0x1110)
    buf.push_uint32_le(0x15141312)
    buf.push_uint64_le(0x1D1C1B1A19181716)
    assert buf.data == bytes(range(1, 0x1E))
    buf.seek(0)
    assert buf.pull_uint8() == 1 and buf.pull_uint16() == 0x0203
    assert buf.pull_uint32() == 0x04050607 and buf.pull_uint64() == 0x08090A0B0C0D0E0F
    assert buf.pull_uint16_le() == 0x1110 and buf.pull_uint32_le() == 0x15141312
    assert buf.pull_uint64_le() == 0x1D1C1B1A19181716
    assert buf.eof() and buf.remaining() == 0


def test_seek_back_and_patch() -> None:
    buf = Buffer()
    buf.push_uint16(0, "length")
    buf.push_bytes(b"payload")
    end = buf.tell()
    buf.seek(0)
    buf.push_uint16(end, "length")
    assert buf.data == b"\x00\x09payload"
    with pytest.raises(TruncatedError, match="cannot seek to 10, buffer holds 9"):
        buf.seek(10)


def test_pull_past_end_names_the_field() -> None:
    buf = Buffer(b"\x01\x02\x03")
    buf.pull_uint8()
    with pytest.raises(TruncatedError, match="dlid: needs 4 bytes at offset 1, only 2 left"):
        buf.pull_uint32("dlid")
    assert buf.tell() == 1  # a failed pull consumes nothing
    assert buf.pull_rest() == b"\x02\x03"


@pytest.mark.parametrize(
    ("push", "message"),
    [
        (lambda b: b.push_uint8(256, "tclass"), r"tclass: value 256 out of range 0\.\.255"),
        (lambda b: b.push_uint16(-1, "pkey"), r"pkey: value -1 out of range 0\.\.65535"),
        (lambda b: b.push_uint32_le(1 << 32), "value 4294967296"),
        (lambda b: b.push_uint64(1 << 64), "value 18446744073709551616"),
        (lambda b: b.push_uint8("1"), "expected an integer, got '1'"),
        (lambda b: b.push_zeros(-1), "negative length"),
    ],
)
def test_push_out_of_range(push: object, message: str) -> None:
    with pytest.raises(FieldRangeError, match=message):
        push(Buffer())  # type: ignore[operator]


def test_capacity() -> None:
    buf = Buffer(capacity=4)
    buf.push_uint32(1)
    with pytest.raises(OversizeError, match="writing 1 bytes at offset 4 exceeds capacity 4"):
        buf.push_uint8(1, "extra")
    with pytest.raises(OversizeError, match="5 initial bytes exceed capacity 4"):
        Buffer(bytes(5), capacity=4)


def test_errors_are_value_errors() -> None:
    assert issubclass(WireError, ValueError)
    assert issubclass(TruncatedError, WireError) and issubclass(FieldRangeError, WireError)


@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.booleans(), st.data()), max_size=20))
@settings(max_examples=100)
def test_integer_round_trip(items: list[tuple[int, bool, st.DataObject]]) -> None:
    values = [
        (size, little, data.draw(st.integers(0, (1 << (8 * size)) - 1)))
        for size, little, data in items
    ]
    buf = Buffer()
    for size, little, value in values:
        buf.push_uint(value, size, "little" if little else "big")
    buf.seek(0)
    assert [buf.pull_uint(size, "little" if little else "big") for size, little, _ in values] == [
        value for _, _, value in values
    ]

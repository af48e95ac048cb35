"""Destination cache keys (``acmp.keys``): canonical, typed, described, refused when bad."""

from __future__ import annotations

import pytest

from ibacm.provider.acmp.keys import (
    GID,
    IP,
    IP6,
    LID,
    NAME,
    CacheKeyError,
    KeyText,
    cache_key,
    describe_key,
    gid_key,
    key_address,
    key_type,
    lid_key,
    table_key,
)


def test_name_keys_ignore_case_and_trailing_bytes() -> None:
    a = cache_key(NAME, b"Node10")
    b = cache_key(NAME, b"NODE10\0junk-after-the-terminator".ljust(64, b"\0"))
    assert a == b
    assert (key_type(a), key_address(a)) == (NAME, b"node10")


def test_keys_keep_only_significant_bytes() -> None:
    ip = bytes([10, 0, 0, 1])
    assert cache_key(IP, ip + b"\x99" * 60) == cache_key(IP, ip)
    assert cache_key(LID, b"\x00\x05") == lid_key(5)
    # Each type's significant bytes, zero-filled to that size, never to the wire's 64.
    assert key_address(cache_key(GID, bytes(16))) == bytes(16)
    assert cache_key(IP, bytes([10])) == cache_key(IP, bytes([10, 0, 0, 0]))
    assert key_address(cache_key(IP, bytes([10]))) == bytes([10, 0, 0, 0])
    assert key_address(cache_key(NAME, b"node1".ljust(64, b"\0"))) == b"node1"
    # One type's key never equals another's, whatever the bytes.
    assert cache_key(IP, bytes([10, 0, 0, 1])) != cache_key(NAME, bytes([10, 0, 0, 1]))
    assert key_type(cache_key(IP6, bytes(16))) == IP6 and key_type(lid_key(5)) == LID


@pytest.mark.parametrize(("kind", "address"), [(0, b"x"), (6, b"x"), (0x10, b"x"), (IP, bytes(65))])
def test_bad_keys_are_refused(kind: int, address: bytes) -> None:
    with pytest.raises(CacheKeyError):
        cache_key(kind, address)


def test_keys_describe_themselves() -> None:
    assert describe_key(cache_key(IP, bytes([10, 1, 2, 3]))) == "10.1.2.3"
    assert describe_key(lid_key(7)) == "lid 7"
    assert describe_key(cache_key(NAME, b"node1")) == "node1"
    assert describe_key(cache_key(GID, bytes.fromhex("fe80" + "00" * 14))) == "fe80::"


def test_key_text_formats_only_when_written() -> None:
    key = cache_key(IP, bytes([10, 1, 2, 3]))
    assert str(KeyText(key)) == repr(KeyText(key)) == "10.1.2.3"


def test_the_route_table_keys_names_and_ips_only() -> None:
    """The client loop's thread answers names and IPs from the table; a GID or a LID may be
    our own port's (the trio side answers it), and a bad address is the trio side's to
    refuse with its reason."""
    assert table_key(IP, bytes([10, 0, 0, 1])) == cache_key(IP, bytes([10, 0, 0, 1]))
    assert table_key(NAME, b"Node1") == cache_key(NAME, b"node1")
    assert table_key(GID, bytes(16)) is None and table_key(LID, b"\x00\x01") is None
    assert table_key(9, b"x") is None and table_key(IP, bytes(65)) is None
    assert gid_key(bytes(16)) == cache_key(GID, bytes(16))

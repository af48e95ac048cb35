"""Classifying an address written in a configuration file, as the C daemon does.

``inet_pton(AF_INET)`` first, then ``inet_pton(AF_INET6)``, else a host name. The binary form is
the 64-byte zero-padded value the daemon keeps and puts on the wire (4 bytes for IPv4, 16 for
IPv6, the name's bytes for a name).
"""

from __future__ import annotations

import socket

from ibacm.wire.client import AddrType

ADDRESS_SIZE = 64


def encode_text(text: str) -> bytes:
    """The bytes C sees for ``text`` (file bytes that were not UTF-8 come back unchanged)."""
    return text.encode("utf-8", "surrogateescape")


def pton(family: int, text: str) -> bytes | None:
    """``inet_pton``: the packed address, or None if ``text`` is not one of ``family``."""
    try:
        return socket.inet_pton(family, text)
    except (OSError, ValueError, UnicodeError):
        return None


def classify(text: str) -> tuple[AddrType, bytes]:
    """(type, 64-byte binary address) of ``text``: IP, IP6 or NAME."""
    packed = pton(socket.AF_INET, text)
    if packed is not None:
        return AddrType.IP, packed.ljust(ADDRESS_SIZE, b"\0")
    packed = pton(socket.AF_INET6, text)
    if packed is not None:
        return AddrType.IP6, packed.ljust(ADDRESS_SIZE, b"\0")
    raw = encode_text(text)
    if len(raw) >= ADDRESS_SIZE:
        raise ValueError(f"name {text!r} is {len(raw)} bytes; at most {ADDRESS_SIZE - 1} fit")
    return AddrType.NAME, raw.ljust(ADDRESS_SIZE, b"\0")


def match_key(addr_type: int, packed: bytes) -> tuple[int, bytes]:
    """Key under which the daemon treats two local addresses as the same (names: any case)."""
    if addr_type == AddrType.NAME:
        return addr_type, packed.lower()
    return addr_type, packed

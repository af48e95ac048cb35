"""Destination cache keys: one canonical bytes object per address.

Keys are canonical (defect 34): the address type's byte followed by the address; a name
lower-cased and cut at its first NUL, every other type only its significant bytes (IPv4 4,
IPv6/GID 16, LID 2), zero-filled to that size. Not padded to the wire's 64 bytes: at 40,000
peers the padding was 2 MB of a daemon's cache (the codecs pad when a key goes on the wire);
not a (type, address) tuple: 56 bytes an entry, and a second object to compare in every dict
probe. Lookups are one dict access.
"""

from __future__ import annotations

import ipaddress

ADDRESS_LEN = 64

# Address types of the peer protocol (ACM_ADDRESS_*), and how many bytes of each are significant.
NAME, IP, IP6, GID, LID = 1, 2, 3, 4, 5
SIGNIFICANT: dict[int, int] = {NAME: ADDRESS_LEN, IP: 4, IP6: 16, GID: 16, LID: 2}
TYPE_NAMES: dict[int, str] = {NAME: "name", IP: "ip", IP6: "ip6", GID: "gid", LID: "lid"}

CacheKey = bytes
"""The address type's byte, then the canonical address (see the module docstring)."""

_TYPE_BYTE = {addr_type: bytes((addr_type,)) for addr_type in SIGNIFICANT}


class CacheKeyError(ValueError):
    """An address cannot be a cache key (unknown type, too long)."""


def cache_key(addr_type: int, address: bytes) -> CacheKey:
    """The canonical key of an address (see the module docstring).

    Not memoised: a memo (an LRU of 16,384 keys until bench-scale) held each address it was
    asked for besides the key, about 245 bytes a peer and 3.8 MB from 16,384 peers on, and a
    job start of more nodes walks it in ring order, so every lookup missed and cost twice
    the key it was to save. A daemon holds a key once, in its cache."""
    if addr_type == NAME and len(address) <= ADDRESS_LEN:
        # Names first: an all-to-all job start makes two keys per resolution (ours, peers').
        return _NAME_BYTE + address.split(b"\0", 1)[0].lower()
    size = SIGNIFICANT.get(int(addr_type))
    if size is None:
        raise CacheKeyError(f"address type {addr_type} cannot be cached (expected 1..5)")
    if len(address) > ADDRESS_LEN:
        raise CacheKeyError(f"address is {len(address)} bytes, at most {ADDRESS_LEN} fit")
    return _TYPE_BYTE[int(addr_type)] + address[:size].ljust(size, b"\0")


_NAME_BYTE = _TYPE_BYTE[NAME]


def key_type(key: CacheKey) -> int:
    return key[0]


def key_address(key: CacheKey) -> bytes:
    """The canonical address of a key (unpadded; see ``cache_key``)."""
    return key[1:]


def lid_key(lid: int) -> CacheKey:
    return _TYPE_BYTE[LID] + lid.to_bytes(2, "big")


def gid_key(gid: bytes) -> CacheKey:
    return cache_key(GID, gid)


def describe_key(key: CacheKey) -> str:
    """Human form of a key for logs and the admin snapshot."""
    addr_type, address = key[0], key[1:]
    try:
        if addr_type == NAME:
            return address.rstrip(b"\0").decode("ascii", "backslashreplace")
        if addr_type == IP:
            return ".".join(str(octet) for octet in address[:4])
        if addr_type in (IP6, GID):
            return str(ipaddress.IPv6Address(address[:16]))
        if addr_type == LID:
            return f"lid {int.from_bytes(address[:2], 'big')}"
    except ValueError:  # pragma: no cover - every canonical key formats
        pass
    return address.hex()


class KeyText:
    """A key formatted only if a log record is really written (debug logs per request)."""

    __slots__ = ("key",)

    def __init__(self, key: CacheKey) -> None:
        self.key = key

    def __str__(self) -> str:
        return describe_key(self.key)

    def __repr__(self) -> str:
        return describe_key(self.key)


def table_key(dest_type: int, dest: bytes) -> CacheKey | None:
    """``RouteTable.key`` of an endpoint: the cache key of a destination, or None for a GID
    or LID (it may be our own port's, which ``resolve`` answers) and for what cannot be a
    key (``resolve`` says why). Pure: the client loop's thread calls it."""
    if dest_type in (GID, LID):
        return None
    try:
        return cache_key(dest_type, dest)
    except CacheKeyError:
        return None

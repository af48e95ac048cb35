"""Exceptions raised by the wire codecs.

Every codec failure is a ``WireError`` (a ``ValueError``), so a caller that only wants to drop
bad input catches one class. The subclasses say what kind of damage was found; every message
names the field and the offending values so a log line is enough to diagnose a peer.
"""

from __future__ import annotations


class WireError(ValueError):
    """Base class: bytes could not be encoded or decoded."""


class TruncatedError(WireError):
    """The input is shorter than the layout needs."""


class OversizeError(WireError):
    """The input (or the message being built) is longer than allowed."""


class FieldRangeError(WireError):
    """A field value is out of range, on encode or on decode."""


class BadVersionError(WireError):
    """A version field (ACM version, MAD base/class version) has an unsupported value."""


class BadOpcodeError(WireError):
    """An opcode, method, class or netlink client/op is not one this codec handles."""


class BadLengthError(WireError):
    """A length field disagrees with the data or with what the message type allows."""


class GidCountError(FieldRangeError):
    """An ACM resolve record claims more MGIDs than fit in a 256-byte MAD (C defect #38)."""


class RmppError(WireError):
    """RMPP segments arrived out of order or disagree with each other."""


def check_uint(field: str, value: int, bits: int) -> int:
    """Return ``value`` if it fits in ``bits`` unsigned bits, else raise FieldRangeError."""
    if not isinstance(value, int):
        raise FieldRangeError(f"{field}: expected an integer, got {value!r}")
    limit = (1 << bits) - 1
    if not 0 <= value <= limit:
        raise FieldRangeError(f"{field}: value {value} out of range 0..{limit}")
    return value


def check_bytes(field: str, value: bytes, size: int) -> bytes:
    """Return ``value`` as bytes if it is exactly ``size`` bytes long, else FieldRangeError."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise FieldRangeError(f"{field}: expected {size} bytes, got {type(value).__name__}")
    raw = bytes(value)
    if len(raw) != size:
        raise FieldRangeError(f"{field}: expected exactly {size} bytes, got {len(raw)}")
    return raw


def check_exact_length(what: str, data: bytes, size: int) -> None:
    """Raise TruncatedError/OversizeError unless ``data`` is exactly ``size`` bytes."""
    if len(data) < size:
        raise TruncatedError(f"{what}: needs {size} bytes, got {len(data)}")
    if len(data) > size:
        raise OversizeError(f"{what}: must be exactly {size} bytes, got {len(data)}")


def check_min_length(what: str, data: bytes, size: int) -> None:
    """Raise TruncatedError if ``data`` is shorter than ``size`` bytes."""
    if len(data) < size:
        raise TruncatedError(f"{what}: needs at least {size} bytes, got {len(data)}")

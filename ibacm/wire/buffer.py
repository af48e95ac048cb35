"""A bounds-checked byte buffer for the pure codecs (in the style of aioquic's ``Buffer``).

One cursor serves both directions: ``pull_*`` read at the cursor, ``push_*`` write at the
cursor (overwriting, then extending), so a codec can push a placeholder, ``seek`` back and patch
it. Integers are big-endian unless the name ends in ``_le``. Reading past the end raises
``TruncatedError``; pushing a value that does not fit raises ``FieldRangeError``; growing past
``capacity`` raises ``OversizeError``. The optional ``field`` argument names the field in the
error message.
"""

from __future__ import annotations

import struct

from ibacm.wire.errors import FieldRangeError, OversizeError, TruncatedError, check_uint

_FORMATS: dict[tuple[int, str], struct.Struct] = {
    (1, "big"): struct.Struct(">B"),
    (1, "little"): struct.Struct("<B"),
    (2, "big"): struct.Struct(">H"),
    (4, "big"): struct.Struct(">I"),
    (8, "big"): struct.Struct(">Q"),
    (2, "little"): struct.Struct("<H"),
    (4, "little"): struct.Struct("<I"),
    (8, "little"): struct.Struct("<Q"),
}


def _format(size: int, order: str) -> struct.Struct:
    try:
        return _FORMATS[(size, order)]
    except KeyError:
        raise FieldRangeError(
            f"integer layout: {size} bytes {order}-endian is not supported (1, 2, 4, 8)"
        ) from None


class Buffer:
    """Bytes with a cursor; see the module docstring."""

    __slots__ = ("_capacity", "_data", "_pos")

    def __init__(self, data: bytes = b"", capacity: int | None = None) -> None:
        if capacity is not None and len(data) > capacity:
            raise OversizeError(f"buffer: {len(data)} initial bytes exceed capacity {capacity}")
        self._data = bytearray(data)
        self._pos = 0
        self._capacity = capacity

    # -- cursor ---------------------------------------------------------------------------

    @property
    def data(self) -> bytes:
        """Everything in the buffer: the initial bytes plus all bytes pushed so far."""
        return bytes(self._data)

    @property
    def capacity(self) -> int | None:
        return self._capacity

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int) -> None:
        if not 0 <= pos <= len(self._data):
            raise TruncatedError(f"buffer: cannot seek to {pos}, buffer holds {len(self._data)}")
        self._pos = pos

    def eof(self) -> bool:
        return self._pos >= len(self._data)

    def remaining(self) -> int:
        return len(self._data) - self._pos

    # -- pull -----------------------------------------------------------------------------

    def pull_bytes(self, n: int, field: str = "bytes") -> bytes:
        if n < 0:
            raise FieldRangeError(f"{field}: cannot read a negative length {n}")
        end = self._pos + n
        if end > len(self._data):
            raise TruncatedError(
                f"{field}: needs {n} bytes at offset {self._pos}, only {self.remaining()} left"
            )
        value = bytes(self._data[self._pos : end])
        self._pos = end
        return value

    def pull_rest(self) -> bytes:
        return self.pull_bytes(self.remaining(), "rest")

    def pull_uint8(self, field: str = "uint8") -> int:
        return self.pull_bytes(1, field)[0]

    def pull_uint16(self, field: str = "uint16") -> int:
        return self._pull_int(2, "big", field)

    def pull_uint32(self, field: str = "uint32") -> int:
        return self._pull_int(4, "big", field)

    def pull_uint64(self, field: str = "uint64") -> int:
        return self._pull_int(8, "big", field)

    def pull_uint16_le(self, field: str = "uint16") -> int:
        return self._pull_int(2, "little", field)

    def pull_uint32_le(self, field: str = "uint32") -> int:
        return self._pull_int(4, "little", field)

    def pull_uint64_le(self, field: str = "uint64") -> int:
        return self._pull_int(8, "little", field)

    def pull_uint(self, size: int, byteorder: str, field: str = "uint") -> int:
        """Read a 1-, 2-, 4- or 8-byte integer in ``byteorder`` ("big" or "little")."""
        return self._pull_int(size, byteorder, field)

    def _pull_int(self, size: int, order: str, field: str) -> int:
        value: int = _format(size, order).unpack(self.pull_bytes(size, field))[0]
        return value

    # -- push -----------------------------------------------------------------------------

    def push_bytes(self, value: bytes, field: str = "bytes") -> None:
        end = self._pos + len(value)
        if self._capacity is not None and end > self._capacity:
            raise OversizeError(
                f"{field}: writing {len(value)} bytes at offset {self._pos} exceeds "
                f"capacity {self._capacity}"
            )
        self._data[self._pos : end] = value
        self._pos = end

    def push_zeros(self, n: int, field: str = "padding") -> None:
        if n < 0:
            raise FieldRangeError(f"{field}: cannot write a negative length {n}")
        self.push_bytes(bytes(n), field)

    def push_uint8(self, value: int, field: str = "uint8") -> None:
        self.push_bytes(bytes((check_uint(field, value, 8),)), field)

    def push_uint16(self, value: int, field: str = "uint16") -> None:
        self._push_int(value, 2, "big", field)

    def push_uint32(self, value: int, field: str = "uint32") -> None:
        self._push_int(value, 4, "big", field)

    def push_uint64(self, value: int, field: str = "uint64") -> None:
        self._push_int(value, 8, "big", field)

    def push_uint16_le(self, value: int, field: str = "uint16") -> None:
        self._push_int(value, 2, "little", field)

    def push_uint32_le(self, value: int, field: str = "uint32") -> None:
        self._push_int(value, 4, "little", field)

    def push_uint64_le(self, value: int, field: str = "uint64") -> None:
        self._push_int(value, 8, "little", field)

    def push_uint(self, value: int, size: int, byteorder: str, field: str = "uint") -> None:
        """Write a 1-, 2-, 4- or 8-byte integer in ``byteorder`` ("big" or "little")."""
        self._push_int(value, size, byteorder, field)

    def _push_int(self, value: int, size: int, order: str, field: str) -> None:
        check_uint(field, value, size * 8)
        self.push_bytes(_format(size, order).pack(value), field)

"""C library number conversions (glibc ``strtol``/``strtoul``/``strtoull``/``atoi``), exactly.

The C daemon reads every number in its files with one of these, and files written for it must
mean the same thing to us: ``12abc`` is 12, ``abc`` is 0, ``010`` in base 0 is octal 8. Each
function also says what was odd about the text, so parsers can warn while using the C value.
"""

from __future__ import annotations

from dataclasses import dataclass

# isspace() in the C locale.
C_SPACE = " \t\n\v\f\r"

LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
ULONG_MAX = 2**64 - 1


@dataclass(frozen=True)
class CNumber:
    """Result of a conversion: ``end`` is the index after the last character used (0 when no
    digits were found, like C's ``endptr == nptr``); ``overflow`` means C returned a clamped
    value (``ERANGE``)."""

    value: int
    end: int
    overflow: bool

    @property
    def converted(self) -> bool:
        return self.end > 0


def _digit(char: str) -> int:
    """Value of an ASCII digit or letter, 99 for anything else."""
    if "0" <= char <= "9":
        return ord(char) - ord("0")
    lower = char.lower()
    if "a" <= lower <= "z" and char.isascii():
        return ord(lower) - ord("a") + 10
    return 99


def _scan(text: str, base: int) -> tuple[bool, int, int]:
    """Shared front end: returns (negative, magnitude, end index); end 0 = nothing converted."""
    if base != 0 and not 2 <= base <= 36:
        raise ValueError(f"invalid base {base}")
    pos = 0
    while pos < len(text) and text[pos] in C_SPACE:
        pos += 1
    negative = False
    if pos < len(text) and text[pos] in "+-":
        negative = text[pos] == "-"
        pos += 1
    # A "0x" prefix counts only when a hex digit follows; otherwise the "0" alone is the number.
    has_hex_prefix = (
        text[pos : pos + 2].lower() == "0x" and pos + 2 < len(text) and _digit(text[pos + 2]) < 16
    )
    if base == 0:
        if has_hex_prefix:
            base = 16
        elif text[pos : pos + 1] == "0":
            base = 8
        else:
            base = 10
    if base == 16 and has_hex_prefix:
        pos += 2
    start = pos
    magnitude = 0
    while pos < len(text) and _digit(text[pos]) < base:
        magnitude = magnitude * base + _digit(text[pos])
        pos += 1
    if pos == start:
        return False, 0, 0
    return negative, magnitude, pos


def strtol(text: str, base: int = 10) -> CNumber:
    """glibc ``strtol`` on a 64-bit ``long``: clamps to LONG_MIN/LONG_MAX on overflow."""
    negative, magnitude, end = _scan(text, base)
    value = -magnitude if negative else magnitude
    if value > LONG_MAX:
        return CNumber(LONG_MAX, end, True)
    if value < LONG_MIN:
        return CNumber(LONG_MIN, end, True)
    return CNumber(value, end, False)


def strtoul(text: str, base: int = 10) -> CNumber:
    """glibc ``strtoul``/``strtoull`` (64-bit): a leading ``-`` negates modulo 2**64."""
    negative, magnitude, end = _scan(text, base)
    if magnitude > ULONG_MAX:
        return CNumber(ULONG_MAX, end, True)
    value = (-magnitude) & ULONG_MAX if negative else magnitude
    return CNumber(value, end, False)


def to_int32(value: int) -> int:
    """C conversion of a wider integer to ``int`` (two's complement truncation)."""
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def atoi(text: str) -> int:
    """glibc ``atoi``: ``(int) strtol(text, NULL, 10)``."""
    return to_int32(strtol(text, 10).value)


def atoi_problem(text: str) -> str | None:
    """Why ``atoi(text)`` is not simply the number written, or None if it is."""
    result = strtol(text, 10)
    if not result.converted:
        return "is not a number"
    if result.overflow or to_int32(result.value) != result.value:
        return "is out of range for a C int"
    if text[result.end :]:
        return "has trailing characters after the number"
    return None

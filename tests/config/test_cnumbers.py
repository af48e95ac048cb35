"""The C number conversions agree with the real C library, character for character."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibacm.config import cnumbers

_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_LIBC.strtol.restype = ctypes.c_long
_LIBC.strtol.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int]
_LIBC.strtoul.restype = ctypes.c_ulong
_LIBC.strtoul.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int]
_LIBC.atoi.restype = ctypes.c_int
_LIBC.atoi.argtypes = [ctypes.c_char_p]


def _libc(function: str, text: str, base: int) -> tuple[int, int]:
    """(value, characters consumed) from the real libc function."""
    buffer = ctypes.create_string_buffer(text.encode("ascii"))
    end = ctypes.c_char_p()
    value = getattr(_LIBC, function)(buffer, ctypes.byref(end), base)
    consumed = ctypes.cast(end, ctypes.c_void_p).value or 0
    return value, consumed - ctypes.addressof(buffer)


# Text that exercises signs, prefixes, digits of every base, white space and junk.
_C_TEXT = st.text(alphabet=" \t+-0123456789abcdefxXgz", max_size=24) | st.from_regex(
    r"\A[ \t]*[+-]?(0[xX])?[0-9a-fA-F]{0,25}[g ]?\Z"
)


@given(text=_C_TEXT, base=st.sampled_from([0, 8, 10, 16]))
def test_strtol_matches_libc(text: str, base: int) -> None:
    ours = cnumbers.strtol(text, base)
    assert (ours.value, ours.end) == _libc("strtol", text, base)


@given(text=_C_TEXT, base=st.sampled_from([0, 10, 16]))
def test_strtoul_matches_libc(text: str, base: int) -> None:
    ours = cnumbers.strtoul(text, base)
    assert (ours.value, ours.end) == _libc("strtoul", text, base)


@given(text=_C_TEXT)
def test_atoi_matches_libc(text: str) -> None:
    assert cnumbers.atoi(text) == _LIBC.atoi(text.encode("ascii"))


@pytest.mark.parametrize(
    ("text", "value", "problem"),
    [
        ("12", 12, None),
        ("-1", -1, None),
        ("+7", 7, None),
        ("12abc", 12, "has trailing characters after the number"),
        ("abc", 0, "is not a number"),
        ("", 0, "is not a number"),
        ("99999999999", 1215752191, "is out of range for a C int"),
    ],
)
def test_atoi_quirks_are_reported(text: str, value: int, problem: str | None) -> None:
    assert cnumbers.atoi(text) == value
    assert cnumbers.atoi_problem(text) == problem


def test_base_zero_reads_octal_and_hex() -> None:
    assert cnumbers.strtoul("010", 0).value == 8
    assert cnumbers.strtoul("0x10", 0).value == 16
    assert cnumbers.strtoul("0x", 0) == cnumbers.CNumber(0, 1, False)
    assert cnumbers.strtoul("-1", 0).value == cnumbers.ULONG_MAX

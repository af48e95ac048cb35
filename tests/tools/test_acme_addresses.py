"""Address classification of -d in the unspecified format (ib_acme.md §3.1), exactly as the C
tool does it: scripts read its output and exit status (defect 54 is kept for their sake)."""

from __future__ import annotations

import socket

import pytest

from ibacm.tools.ib_acme import classify, inet_any_pton, parse_lid


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.2", ("10.0.0.2", "i")),
        ("fe80::2:c903:a:2b3d", ("fe80::2:c903:a:2b3d", "i")),
        ("::ffff:10.0.0.1", ("::ffff:10.0.0.1", "i")),
    ],
)
def test_ip_literals_are_ip_and_unchanged(text: str, expected: tuple[str, str]) -> None:
    assert classify(text, "u") == expected


def test_a_resolvable_name_becomes_its_first_address() -> None:
    first = socket.getaddrinfo("localhost", None, 0, 0, socket.IPPROTO_TCP)[0]
    assert classify("localhost", "u") == (first[4][0], "i")


def test_plain_numbers_are_ipv4_shorthand_as_the_resolver_reads_them() -> None:
    # C asks getaddrinfo, which reads "5" as 0.0.0.5 (defect 54, kept: scripts see C's text).
    assert classify("5", "u") == ("0.0.0.5", "i")


def test_unknown_names_are_lids_as_in_c() -> None:
    assert classify("nosuchnode.invalid", "u") == ("nosuchnode.invalid", "l")


@pytest.mark.parametrize("fmt", ["i", "n", "l", "g"])
def test_an_explicit_format_is_never_second_guessed(fmt: str) -> None:
    assert classify("localhost", fmt) == ("localhost", fmt)


def test_inet_any_pton_is_the_c_library_parser() -> None:
    assert inet_any_pton("10.0.0.1") == bytes([10, 0, 0, 1])
    assert inet_any_pton("::1") == bytes(15) + b"\x01"
    assert inet_any_pton("10.0.0") is None  # inet_pton wants all four parts
    assert inet_any_pton("fe80::1%lo") is None


def test_lids_are_read_with_atoi_into_16_bits_as_in_c() -> None:
    assert parse_lid(" 42 ") == 42
    assert parse_lid("65535") == 65535
    assert parse_lid("65536") == 0
    assert parse_lid("-1") == 0xFFFF
    for zero in ("0x5", "node3", "x", ""):
        assert parse_lid(zero) == 0

"""ibacm_addr.cfg: parsing, endpoint matching and the ``ib_acme -A`` generator."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.config.addr_file import (
    IPS_NOT_ALLOWED,
    AddrEntry,
    entries_for,
    generate_addr_file,
    parse_addr_file,
)
from ibacm.config.ctext import c_tokens
from ibacm.wire.client import AddrType

PATH = "ibacm_addr.cfg"

# The example of options.md §6.1.
SPEC_EXAMPLE = """\
# address  device  port  pkey
node31      mlx5_0  1     default
node31-1    mlx5_0  1     default
node31-2    mlx5_0  2     0x8001
10.1.0.31   mlx5_0  1     0xffff        # accepted only with support_ips_in_addr_cfg 1
"""


def test_spec_example_with_ips_allowed() -> None:
    entries, issues = parse_addr_file(SPEC_EXAMPLE, PATH, support_ips=True)
    assert issues == []
    assert entries == [
        AddrEntry("node31", AddrType.NAME, "mlx5_0", 1, None, 2),
        AddrEntry("node31-1", AddrType.NAME, "mlx5_0", 1, None, 3),
        AddrEntry("node31-2", AddrType.NAME, "mlx5_0", 2, 0x8001, 4),
        AddrEntry("10.1.0.31", AddrType.IP, "mlx5_0", 1, 0xFFFF, 5),
    ]


def test_ip_lines_without_support_ips_are_errors_and_skipped() -> None:
    text = SPEC_EXAMPLE + "fe80::1 mlx5_0 1 default\nnode31-3 mlx5_0 1 default\n"
    entries, issues = parse_addr_file(text, PATH)
    assert [entry.address for entry in entries] == ["node31", "node31-1", "node31-2", "node31-3"]
    assert [(issue.line, issue.severity) for issue in issues] == [(5, "error"), (6, "error")]
    assert str(issues[0]).startswith(f"{PATH}:5: {IPS_NOT_ALLOWED}")


def test_ipv6_literal_with_support_ips() -> None:
    entries, issues = parse_addr_file("fe80::2:c903:1:e3f1 mlx5_0 1 default\n", support_ips=True)
    assert issues == [] and entries[0].type == AddrType.IP6
    assert entries[0].address_bytes[:16] == socket.inet_pton(socket.AF_INET6, "fe80::2:c903:1:e3f1")
    assert entries[0].address_bytes[16:] == bytes(48)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("node1 mlx5_0 x default", "port 'x'"),
        ("node1 mlx5_0 0 default", "port '0'"),
        ("node1 mlx5_0 1 0x10000", "pkey '0x10000'"),
        ("node1 mlx5_0 1 0x8000", "not a valid partition"),
        ("node1 mlx5_0 1 zz", "pkey 'zz'"),
        ("node1 mlx5_0 1", "expected 4 fields"),
        ("n" * 47 + " mlx5_0 1 default", "longer than 46"),
        ("node1 " + "d" * 32 + " 1 default", "longer than 31"),
    ],
)
def test_bad_line_is_reported_and_the_rest_still_loads(line: str, reason: str) -> None:
    text = f"good1 mlx5_0 1 default\n{line}\ngood2 mlx5_0 1 default\n"
    entries, issues = parse_addr_file(text, PATH)
    assert [entry.address for entry in entries] == ["good1", "good2"]
    assert len(issues) == 1 and issues[0].line == 2 and issues[0].severity == "error"
    assert reason in issues[0].message


@pytest.mark.parametrize(
    ("text", "pkey"),
    [("default", None), ("DEFAULT", None), ("0x8001", 0x8001), ("8001", 0x8001), ("7fff", 0x7FFF)],
)
def test_pkey_field(text: str, pkey: int | None) -> None:
    entries, issues = parse_addr_file(f"node1 mlx5_0 1 {text}\n")
    assert issues == [] and entries[0].pkey == pkey


def test_duplicates_are_warned_and_skipped_without_stopping() -> None:
    text = (
        "node1 mlx5_0 1 default\n"
        "NODE1 MLX5_0 1 default\n"  # names and devices compare in any case
        "node2 mlx5_0 1 0xffff\n"
        "node2 mlx5_0 1 0x7fff\n"  # same partition
        "node3 mlx5_0 1 default\n"
    )
    entries, issues = parse_addr_file(text, PATH)
    assert [entry.line for entry in entries] == [1, 3, 5]
    assert [(issue.line, issue.severity) for issue in issues] == [(2, "warning"), (4, "warning")]
    assert "duplicate of line 1" in issues[0].message


def test_indented_hash_is_a_comment_with_a_warning() -> None:
    entries, issues = parse_addr_file("  #node1 mlx5_0 1 default\n  # just words\n")
    assert entries == []
    assert len(issues) == 1 and "would read '#node1'" in issues[0].message


def test_entries_for_matches_device_port_and_partition() -> None:
    text = (
        "a mlx5_0 1 default\n"
        "b MLX5_0 1 0x7fff\n"
        "c mlx5_0 1 0x8001\n"
        "d mlx5_0 2 default\n"
        "e mlx5_1 1 default\n"
        "A mlx5_0 1 0xffff\n"
    )
    entries, issues = parse_addr_file(text)
    assert issues == []

    def names(device: str, port: int, pkey: int, default: int = 0xFFFF) -> list[str]:
        return [e.address for e in entries_for(entries, device, port, pkey, default)]

    # 'A' is the same name as 'a' on the same endpoint: listed once.
    assert names("mlx5_0", 1, 0xFFFF) == ["a", "b"]
    assert names("Mlx5_0", 1, 0x7FFF) == ["a", "b"]  # membership bit ignored
    assert names("mlx5_0", 1, 0x8001) == ["c"]
    assert names("mlx5_0", 1, 0x0001) == ["c"]
    assert names("mlx5_0", 1, 0x8001, default=0x8001) == ["a", "c"]
    assert names("mlx5_0", 2, 0xFFFF) == ["d"]
    assert names("mlx5_1", 1, 0xFFFF) == ["e"]
    assert names("mlx5_2", 1, 0xFFFF) == []


def test_generate_matches_ib_acme_example() -> None:
    # ib_acme.md §7.1: host node10.example.com, mlx5_0 port 1 active, mlx5_1 port 1 down.
    text = generate_addr_file([("mlx5_0", 1, True), ("mlx5_1", 1, False)], "node10.example.com")
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert body == [
        "node10 mlx5_0 1 default",
        "node10-1 mlx5_0 1 default",
        "node10-2 mlx5_1 1 default",
    ]
    assert text.startswith("#") and text.endswith("\n")
    entries, issues = parse_addr_file(text)
    assert issues == [] and len(entries) == 3


def test_generate_names_the_first_active_port_only() -> None:
    ports = [("mlx4_0", 1, False), ("mlx4_0", 2, True), ("mlx5_0", 1, True)]
    body = [
        line
        for line in generate_addr_file(ports, "host").splitlines()
        if line and not line.startswith("#")
    ]
    assert body == [
        "host-1 mlx4_0 1 default",
        "host mlx4_0 2 default",
        "host-2 mlx4_0 2 default",
        "host-3 mlx5_0 1 default",
    ]
    no_active = generate_addr_file([("mlx5_0", 1, False)], "host")
    assert [c_tokens(line)[0] for line in no_active.splitlines() if line[:1] not in ("#", "")] == [
        "host-1"
    ]


@pytest.mark.parametrize(
    ("ports", "hostname"),
    [
        ([("mlx5_0", 1, True)], ""),
        ([("mlx5_0", 1, True)], ".example.com"),
        ([("mlx5_0", 1, True)], "my host"),
        ([("mlx5_0", 1, True)], "h" * 45),
        ([("mlx 5", 1, True)], "host"),
        ([("mlx5_0", 0, True)], "host"),
    ],
)
def test_generate_rejects_what_the_daemon_could_not_read(
    ports: list[tuple[str, int, bool]], hostname: str
) -> None:
    with pytest.raises(ValueError):
        generate_addr_file(ports, hostname)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.booleans())
def test_parser_never_raises(text: str, support_ips: bool) -> None:
    entries, issues = parse_addr_file(text, PATH, support_ips)
    assert all(1 <= entry.port <= 255 for entry in entries)
    assert all(issue.path == PATH for issue in issues)

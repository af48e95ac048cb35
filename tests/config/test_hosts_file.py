"""ibacm_hosts.data (addr_preload acm_hosts)."""

from __future__ import annotations

import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.config.hosts_file import HostEntry, parse_hosts_file
from ibacm.wire.client import AddrType

PATH = "ibacm_hosts.data"
GID = socket.inet_pton(socket.AF_INET6, "fe80::8:f104:39a:169")

# The shipped sample of options.md §7.1, uncommented.
SAMPLE = """\
# address  IB GID
luna3 fe80::8:f104:39a:169
192.168.1.3 fe80::8:f104:39a:169
fe80::208:f104:39a:169 fe80::8:f104:39a:169
"""


def test_sample_gives_name_ip_and_ip6_for_one_gid() -> None:
    entries, issues = parse_hosts_file(SAMPLE, PATH)
    assert issues == []
    assert entries == [
        HostEntry("luna3", AddrType.NAME, GID, 2),
        HostEntry("192.168.1.3", AddrType.IP, GID, 3),
        HostEntry("fe80::208:f104:39a:169", AddrType.IP6, GID, 4),
    ]
    assert entries[1].address_bytes == bytes([192, 168, 1, 3]) + bytes(60)
    assert entries[0].address_bytes == b"luna3" + bytes(59)


def test_bad_gid_is_an_error_and_the_rest_loads() -> None:
    text = "a fe80::1\nb 10.0.0.1\nc\nd fe80::4 # comment\n"
    entries, issues = parse_hosts_file(text, PATH)
    assert [entry.address for entry in entries] == ["a", "d"]
    assert [(issue.line, issue.severity) for issue in issues] == [(2, "error"), (3, "error")]
    assert str(issues[0]) == (
        f"{PATH}:2: '10.0.0.1' is not an IB GID (IPv6 address text); line skipped"
    )


def test_overlong_field_is_rejected() -> None:
    entries, issues = parse_hosts_file("x" * 46 + " fe80::1\n")
    assert entries == [] and "longer than 45" in issues[0].message


def test_repeated_address_is_kept_and_reported() -> None:
    entries, issues = parse_hosts_file("h fe80::1\nh fe80::2\n", PATH)
    assert [entry.gid[-1] for entry in entries] == [1, 2]
    assert len(issues) == 1 and issues[0].severity == "warning" and issues[0].line == 2


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parser_never_raises(text: str) -> None:
    entries, _ = parse_hosts_file(text, PATH)
    assert all(len(entry.gid) == 16 for entry in entries)

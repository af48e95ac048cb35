"""The sample configuration files in contrib/ load cleanly with the daemon's own parsers."""

from __future__ import annotations

import ipaddress

from ibacm.config.addr_file import parse_addr_file
from ibacm.config.hosts_file import parse_hosts_file
from ibacm.config.option_file import parse_options
from ibacm.config.options import Options
from ibacm.config.opts_template import render_opts_file
from ibacm.config.route_file import parse_route_file, render_route_file
from ibacm.wire.client import AddrType
from tests.conftest import REPO

CONTRIB = REPO / "contrib"
REGENERATE = (
    ".venv/bin/python -c 'from ibacm.config.opts_template import render_opts_file; "
    'print(render_opts_file(), end="")\' > contrib/ibacm_opts.cfg'
)


def _read(name: str) -> str:
    return (CONTRIB / name).read_text(encoding="utf-8")


def test_sample_options_are_what_ib_acme_dash_o_writes() -> None:
    # The package installs this file as /etc/rdma/ibacm_opts.cfg: it must stay identical to
    # the generated template, or operators get stale explanations and defaults.
    assert _read("ibacm_opts.cfg") == render_opts_file(), f"regenerate it: {REGENERATE}"


def test_sample_options_parse_without_issues_to_the_defaults() -> None:
    options, issues = parse_options(_read("ibacm_opts.cfg"), "contrib/ibacm_opts.cfg")
    assert issues == []
    assert options == Options()


def test_sample_options_keep_the_c_daemon_active_lines() -> None:
    # A C ibacm reading the installed file must see its own keys, uncommented.
    active = [
        line.split()[0]
        for line in _read("ibacm_opts.cfg").splitlines()
        if line and not line.startswith("#")
    ]
    for key in ("log_file", "lock_file", "server_mode", "min_mtu", "min_rate", "route_prot"):
        assert key in active


def test_sample_address_file_parses_without_issues() -> None:
    entries, issues = parse_addr_file(_read("ibacm_addr.cfg"), "contrib/ibacm_addr.cfg")
    assert issues == []
    assert [e.address for e in entries] == ["node1", "node1-1", "node1-2", "node1-p1"]
    assert {e.device for e in entries} == {"mlx5_0"}
    by_name = {e.address: e for e in entries}
    assert by_name["node1"].pkey is None  # "default"
    assert by_name["node1-p1"].pkey == 0x8001
    assert by_name["node1-2"].port == 2


def test_sample_address_file_ip_line_needs_support_ips() -> None:
    # The commented IP example becomes valid only with support_ips_in_addr_cfg 1.
    text = _read("ibacm_addr.cfg").replace("# 192.168.10.1", "192.168.10.1")
    _, refused = parse_addr_file(text, "addr", support_ips=False)
    assert [issue.severity for issue in refused] == ["error"]
    entries, accepted = parse_addr_file(text, "addr", support_ips=True)
    assert accepted == []
    assert entries[-1].type == AddrType.IP


def test_sample_hosts_file_parses_without_issues() -> None:
    entries, issues = parse_hosts_file(_read("ibacm_hosts.data"), "contrib/ibacm_hosts.data")
    assert issues == []
    kinds = {e.address: AddrType(e.type) for e in entries}
    assert kinds["node2"] == AddrType.NAME
    assert kinds["192.168.10.2"] == AddrType.IP
    assert kinds["fd00:10::2"] == AddrType.IP6


def test_sample_route_dump_parses_without_issues() -> None:
    dump, issues = parse_route_file(_read("ibacm_route.data"), "contrib/ibacm_route.data")
    assert issues == []
    assert sorted(dump.lid_to_guid) == [1, 2, 3, 4]
    node2 = dump.section_for(0x0008F10500200011, 3)
    assert node2 is not None
    assert node2.node_type == "Channel Adapter"
    assert [p.dlid for p in node2.paths] == [1, 2, 3, 4]
    assert node2.unreachable == (9,)
    # HCA-to-HCA paths are 4096 bytes (enum 5) at 100 Gb/s (enum 16).
    to_node3 = next(p for p in node2.paths if p.dlid == 4)
    assert (to_node3.sl, to_node3.mtu, to_node3.rate) == (0, 5, 16)


def test_sample_route_dump_is_in_opensm_format() -> None:
    # Everything but the leading comment is exactly what the dump writer produces.
    text = _read("ibacm_route.data")
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    dump, _ = parse_route_file(text)
    rendered = render_route_file(dump.sections)
    assert [line for line in body.splitlines() if line] == [
        line for line in rendered.splitlines() if line and not line.startswith("#")
    ]


def test_sample_hosts_gids_belong_to_ports_of_the_route_sample() -> None:
    # The two samples describe one fabric: every preloaded GID is a port of the dump.
    dump, _ = parse_route_file(_read("ibacm_route.data"))
    guids = set(dump.lid_to_guid.values())
    entries, _ = parse_hosts_file(_read("ibacm_hosts.data"))
    for entry in entries:
        gid = ipaddress.IPv6Address(entry.gid)
        assert int(gid) >> 64 == 0xFE80000000000000
        assert int(gid) & (2**64 - 1) in guids, entry.address


def test_samples_are_plain_ascii_with_short_lines() -> None:
    # The C daemon reads 120-byte (128 for the route dump) lines; stay well inside.
    for name in ("ibacm_opts.cfg", "ibacm_addr.cfg", "ibacm_hosts.data", "ibacm_route.data"):
        text = _read(name)
        assert text.isascii(), name
        assert text.endswith("\n"), name
        too_long = [line for line in text.splitlines() if len(line) > 119]
        assert too_long == [], name

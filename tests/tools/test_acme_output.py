"""ib_acme's text formats (ib_acme.md §3.3, §5, §6) and the --json document."""

from __future__ import annotations

import io
import json

from ibacm.tools.acme_output import (
    EP_HEADER,
    JsonReporter,
    Progress,
    TextReporter,
    ep_row,
    path_lines,
    perf_column,
    perf_header,
    perf_row,
)
from ibacm.wire.client import EpConfig
from ibacm.wire.counters import Counter
from ibacm.wire.path_record import PathRecord, gid_from_text

SPEC_EXAMPLE = """\
Path information
  dgid: fe80::2:c903:a:2b3d
  sgid: fe80::2:c903:a:2b3c
  dlid: 5
  slid: 3
  flow label: 0x0
  hop limit: 0
  tclass: 0
  reversible: 1
  pkey: 0xffff
  sl: 0
  mtu: 4
  rate: 7
  packet lifetime: 18
"""


def spec_path() -> PathRecord:
    """The record of client-protocol.md §9 (mtu 0x84, rate 0x87, lifetime 0x92)."""
    path = PathRecord(
        dgid=gid_from_text("fe80::2:c903:a:2b3d"),
        sgid=gid_from_text("fe80::2:c903:a:2b3c"),
        dlid=5,
        slid=3,
        pkey=0xFFFF,
    )
    path.reversible_numpath = 0x81
    path.mtu_byte, path.rate_byte, path.packetlifetime_byte = 0x84, 0x87, 0x92
    return path


def test_path_block_matches_the_spec_example() -> None:
    assert "\n".join(path_lines(spec_path())) + "\n" == SPEC_EXAMPLE


def test_path_block_keeps_the_c_masks_and_hex_fields() -> None:
    path = spec_path()
    path.rate_byte = 0x25  # 6-bit rate 37: the 0x1F mask shows 5, exactly as C prints it
    path.flow_label, path.hop_limit, path.tclass, path.sl = 0xABCDE, 64, 3, 9
    path.pkey = 0x8001
    lines = path_lines(path)
    assert "  rate: 5" in lines
    assert "  flow label: 0xabcde" in lines
    assert "  hop limit: 64" in lines
    assert "  sl: 9" in lines
    assert "  pkey: 0x8001" in lines


def test_gids_are_written_like_inet_ntop() -> None:
    path = spec_path()
    path.dgid = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
    # glibc prints an IPv4-mapped tail in dotted form; Python's ipaddress would not.
    assert path_lines(path)[1] == "  dgid: ::ffff:10.0.0.1"


def test_perf_formats() -> None:
    counters = [0, 12, 1, 2, 0, 3, 8]
    assert perf_header(7) == (
        "svc,Error Count,Resolve Count,No Data,Addr Query Count,Addr Cache Count,"
        "Route Query Count,Route Cache Count"
    )
    assert perf_row("/run/ibacm-unix.sock", counters) == "/run/ibacm-unix.sock,0,12,1,2,0,3,8"
    assert perf_column("svc", counters) == [
        "svc",
        "Error Count : 0",
        "Resolve Count : 12",
        "No Data : 1",
        "Addr Query Count : 2",
        "Addr Cache Count : 0",
        "Route Query Count : 3",
        "Route Cache Count : 8",
    ]
    # A reply with more counters than this tool knows (no daemon of ours sends one).
    assert perf_header(len(Counter) + 1).endswith(f",{max(Counter).label},Unknown")


def test_endpoint_row_matches_the_spec_example() -> None:
    config = EpConfig(
        0x0002C9030001E3F0, 1, 2, 0xFFFF, "ibacmp",
        ["192.168.1.10/24", "fe80::202:c903:1:e3f1/64", "node10", "node10-1"],
    )  # fmt: skip
    assert ep_row("/run/ibacm-unix.sock", 1, config) == (
        "/run/ibacm-unix.sock,0x0002c9030001e3f0,1,0xffff,1,ibacmp,192.168.1.10/24,"
        "fe80::202:c903:1:e3f1/64,node10,node10-1"
    )
    assert EP_HEADER == "svc,guid,port,pkey,ep_index,prov,addr_0,addresses"


def test_text_headers_are_printed_once_per_process() -> None:
    out = io.StringIO()
    reporter = TextReporter(out, verbose=False)
    config = EpConfig(1, 1, 1, 0x7FFF, "ibacmp", [])
    reporter.perf("a", [1, 2], "global", False)
    reporter.perf("b", [3, 4], "global", False)
    reporter.endpoint("a", 1, config)
    reporter.endpoint("b", 1, config)
    reporter.finish(-1, True)
    assert out.getvalue().splitlines() == [
        "svc,Error Count,Resolve Count",
        "a,1,2",
        "b,3,4",
        EP_HEADER,
        "a,0x0000000000000001,1,0x7fff,1,ibacmp",
        "b,0x0000000000000001,1,0x7fff,1,ibacmp",
        "return status 0xffffffff",
    ]


def test_verbose_lines_only_with_v() -> None:
    quiet, loud = io.StringIO(), io.StringIO()
    TextReporter(quiet, verbose=False).verbose("Generating /etc/rdma/x")
    TextReporter(loud, verbose=True).verbose("Generating /etc/rdma/x")
    assert (quiet.getvalue(), loud.getvalue()) == ("", "Generating /etc/rdma/x\n")


def test_json_document_carries_every_result_unmasked() -> None:
    out = io.StringIO()
    reporter = JsonReporter(out)
    reporter.contact_failed("/nope.sock", "No such file or directory")
    reporter.service_start("/run/x.sock")
    reporter.resolve_start("/run/x.sock")
    reporter.pair_start("10.0.0.2", None, "i")
    reporter.server_source("10.0.0.1")
    path = spec_path()
    path.rate_byte = 0xA5  # selector 2, rate 37
    reporter.path(path)
    reporter.verified(False, "Connection timed out")
    reporter.pair_end(-1)
    reporter.perf("/run/x.sock", [0, 1], "global", False)
    reporter.endpoint("/run/x.sock", 1, EpConfig(2, 1, 1, 0xFFFF, "ibacmp", ["node1"]))
    reporter.endpoint_missing(4)
    reporter.finish(-1, False)
    doc = json.loads(out.getvalue())
    assert doc["return_status"] == -1
    failed, served = doc["services"]
    assert failed == {
        "service": "/nope.sock",
        "contacted": False,
        "error": "No such file or directory",
    }
    pair = served["resolutions"][0]
    assert (pair["destination"], pair["format"], pair["status"]) == ("10.0.0.2", "ip", -1)
    assert pair["chosen_sources"] == ["10.0.0.1"]
    assert (pair["path"]["rate"], pair["path"]["rate_selector"]) == (37, 2)
    assert pair["path"]["record"] == path.encode().hex()
    assert pair["verification"] == {"success": False, "error": "Connection timed out"}
    assert served["perf"] == [
        {"scope": "global", "counters": {"Error Count": 0, "Resolve Count": 1}}
    ]
    assert served["endpoints"][0]["addresses"] == ["node1"]
    assert served["errors"] == ["Endpoint 4 is not available"]


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal() -> None:
    tty, pipe = FakeTty(), io.StringIO()
    for stream in (tty, pipe):
        progress = Progress(stream, 3, "node2:")
        for _ in range(3):
            progress.advance()
        progress.close()
    assert pipe.getvalue() == ""
    assert "node2: [" in tty.getvalue()
    assert "3/3" in tty.getvalue()
    assert tty.getvalue().endswith("\r\033[K")


def test_no_progress_bar_for_a_single_resolution() -> None:
    tty = FakeTty()
    progress = Progress(tty, 1, "x")
    progress.advance()
    progress.close()
    assert tty.getvalue() == ""

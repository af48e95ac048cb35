"""Captures read by the real tshark (Debian's 4.0): SA MADs natively, ACM MADs via our Lua script.

Each test makes a capture of real simulated traffic (or of hand-built packets for the odd
cases), runs ``tshark`` on it and checks the decoded fields against what was sent.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import trio
import trio.testing

from ibacm.fabric.capture import CaptureControl, TapFabric
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire import erf
from ibacm.wire.acm_mad import AcmMad, acm_request, acm_response, mgid_for
from ibacm.wire.client import AddrType
from tests.capture.traffic import GROUP0, GROUP1, REQUEST_TID, Exchange, acm_exchange, running
from tests.conftest import REPO, require_peer

pytestmark = pytest.mark.peer

LUA = REPO / "contrib" / "wireshark" / "acm.lua"


def tshark(home: Path, *args: str) -> str:
    """Run tshark with a private profile directory; stdout, after checking it went well."""
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    done = subprocess.run(
        [require_peer("tshark"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Lua" not in done.stderr and "rror" not in done.stderr, done.stderr
    return done.stdout


def rows(output: str) -> list[list[str]]:
    return [line.split("\t") for line in output.splitlines()]


async def _capture(path: Path) -> Exchange:
    world = SimWorld(generate(3))
    async with running(world):
        tap = TapFabric(world.fabric("node2"))
        control = CaptureControl(tap)
        async with trio.open_nursery() as nursery:
            await nursery.start(control.run)
            await control.start(str(path))
            exchange = await acm_exchange(tap, world.fabric("node3"))
            await control.stop()
            nursery.cancel_scope.cancel()
    return exchange


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Exchange, Path]:
    path = tmp_path_factory.mktemp("tshark") / "acm.pcap"
    clock = trio.testing.MockClock(autojump_threshold=0)
    exchange = trio.run(_capture, path, clock=clock)
    return exchange, path


def test_tshark_decodes_the_sa_mads(captured: tuple[Exchange, Path], tmp_path: Path) -> None:
    ex, path = captured
    fields = tshark(
        tmp_path / "home",
        "-r",
        str(path),
        "-T",
        "fields",
        "-e",
        "erf.flags.cap",
        "-e",
        "infiniband.lrh.slid",
        "-e",
        "infiniband.lrh.dlid",
        "-e",
        "infiniband.bth.destqp",
        "-e",
        "infiniband.mad.method",
        "-e",
        "infiniband.mcmemberrecord.mgid",
        "-e",
        "infiniband.mcmemberrecord.mlid",
        "-e",
        "infiniband.pathrecord.dgid",
        "-e",
        "infiniband.pathrecord.dlid",
        "-e",
        "infiniband.pathrecord.slid",
    )
    req, resp, sm = ex.requester.lid, ex.responder.lid, ex.requester.sm_lid
    mgid, dgid = "ff15:4001:ffff:3:400::", "fe80::2:c903:0:3001"
    assert ex.responder.gids[0] == bytes.fromhex("fe800000000000000002c90300003001")
    got = rows(fields)
    assert got[:4] == [
        ["0", str(req), str(sm), "0x000001", "0x02", mgid, "0x0000", "", "", ""],
        ["1", str(sm), str(req), "0x000001", "0x81", mgid, f"0x{ex.mlid:04x}", "", "", ""],
        ["0", str(req), str(sm), "0x000001", "0x01", "", "", dgid, "0x0000", "0x0000"],
        ["1", str(sm), str(req), "0x000001", "0x81", "", "", dgid, f"0x{resp:04x}", f"0x{req:04x}"],
    ]
    # The ACM MADs are UD sends with a GRH to the group, then back to the requester's QP.
    assert [row[:4] for row in got[4:]] == [
        ["0", str(req), str(ex.mlid), "0xffffff"],
        ["1", str(req), str(ex.mlid), "0xffffff"],
        ["1", str(resp), str(req), f"0x{ex.requester_qpn:06x}"],
    ]

    verbose = tshark(tmp_path / "home", "-r", str(path), "-V")
    for text in (
        "SA SubnAdmSet(MCMemberRecord)",
        "SA SubnAdmGet(PathRecord)",
        "Component Mask: 0x000000000001b3f7",  # the ACM join mask (mad-protocol §9.6)
        "Queue Key: 0x0000000080010000",
        "Q_Key: 0x80010000",
        "Scope: 0x5",
        "Record type: 0x15 (Type 21: INFINIBAND)",
        "Source GID: fe80::2:c903:0:2001",
        "Destination GID: ff15:4001:ffff:3:400::",
    ):
        assert text in verbose, text
    assert "Malformed" not in verbose


def test_lua_dissector_decodes_acm_mads(captured: tuple[Exchange, Path], tmp_path: Path) -> None:
    ex, path = captured
    script = f"lua_script:{LUA}"
    fields = tshark(
        tmp_path / "home",
        "-X",
        script,
        "-r",
        str(path),
        "-Y",
        "acm",
        "-T",
        "fields",
        "-e",
        "acm.method",
        "-e",
        "acm.tid",
        "-e",
        "acm.dest.ip",
        "-e",
        "acm.src.ip",
        "-e",
        "acm.gid_cnt",
        "-e",
        "acm.gid",
        "-e",
        "_ws.col.Info",
    )
    request = "dest 10.0.0.2 src 10.0.0.1 gid_cnt 2"
    assert rows(fields) == [
        ["0x01", "0x0000000000001234", "10.0.0.2", "10.0.0.1", "2",
         "ff15:4001:ffff:3:400::,ff15:4001:ffff:10:500::",
         f"Resolve Request TID 0x1234 {request}"],
    ] * 2 + [
        ["0x81", "0x0000000000001234", "", "", "1", "ff15:4001:ffff:3:400::",
         "Resolve Response TID 0x1234 status Success MGID ff15:4001:ffff:3:400::"],
    ]  # fmt: skip
    assert ex.request.tid == ex.response.tid == REQUEST_TID
    assert (ex.request.gids, ex.response.gids) == ([GROUP0, GROUP1], [GROUP0])

    verbose = tshark(tmp_path / "home", "-X", script, "-r", str(path), "-V", "-Y", "acm")
    for text in (
        "InfiniBand Communication Management Assistant (ACM)",
        "Method: Resolve Request (0x01)",
        "Control: Resolve (0x0001)",
        "Transaction ID: 0x0000000000001234",
        "Destination Type: IPv4 (2)",
        "Destination Length: 64",
        "Destination IPv4 Address: 10.0.0.2",
        "Source IPv4 Address: 10.0.0.1",
        "gid_cnt: 2",
        "gid[0] MGID: ff15:4001:ffff:3:400::",
        "gid[1] MGID: ff15:4001:ffff:10:500::",
        "Method: Resolve Response (0x81)",
        "ACM Status: Success (0)",
    ):
        assert text in verbose, text
    assert "Data (256 bytes)" not in verbose  # every ACM payload was claimed


def _odd_packets() -> list[bytes]:
    """ACM MADs the simulated exchange never produces: other address types, QP1, bad counts."""
    by_name = acm_request(
        0xABCDEF, AddrType.NAME, b"node7", AddrType.IP6, bytes(15) + b"\x01", [GROUP0]
    ).encode()
    by_gid = acm_request(
        2, AddrType.GID, bytes.fromhex("fe80000000000000000200000000000a"), AddrType.LID,
        (0x1234).to_bytes(2, "big"), [mgid_for(0x8001, 3, 4)],
    ).encode()  # fmt: skip
    too_many = bytearray(by_name)
    too_many[20] = 9  # gid_cnt 9: only 6 MGIDs fit in a MAD (C defect #38)
    failed = acm_response(3, GROUP0, status=3).encode()
    mads = [by_name, by_gid, bytes(too_many), failed]

    def packet(mad: bytes, qpn: int) -> bytes:
        return erf.ud_packet(
            mad, slid=2, dlid=3, dest_qp=qpn, src_qp=qpn, qkey=0x80010000, pkey=0xFFFF
        )

    packets = [packet(mads[0], 1)]  # on QP1, as MADs travel through umad (ibsim)
    packets += [packet(mad, 0x101) for mad in mads[1:]]
    assert AcmMad.decode(failed).acm_status == 3
    return packets


def test_lua_dissector_on_other_address_types_qp1_and_bad_counts(tmp_path: Path) -> None:
    path = tmp_path / "odd.pcap"
    records = [erf.erf_infiniband_record(1.5e9 + i, p) for i, p in enumerate(_odd_packets())]
    path.write_bytes(erf.pcap_file_header() + b"".join(records))
    script = f"lua_script:{LUA}"
    fields = tshark(
        tmp_path / "home",
        "-X",
        script,
        "-r",
        str(path),
        "-T",
        "fields",
        "-e",
        "infiniband.bth.destqp",
        "-e",
        "acm.dest.name",
        "-e",
        "acm.src.ip6",
        "-e",
        "acm.dest.gid",
        "-e",
        "acm.src.lid",
        "-e",
        "acm.gid_cnt",
        "-e",
        "acm.acm_status",
        "-e",
        "_ws.expert.message",
    )
    expert = "gid_cnt claims more MGIDs than fit in a MAD (at most 6)"
    assert rows(fields) == [
        ["0x000001", "node7", "::1", "", "", "1", "0", ""],
        ["0x000101", "", "", "fe80::2:0:0:a", "4660", "1", "0", ""],
        ["0x000101", "node7", "::1", "", "", "9", "0", expert],
        ["0x000101", "", "", "", "", "1", "3", ""],
    ]
    verbose = tshark(tmp_path / "home", "-X", script, "-r", str(path), "-V")
    assert "APP - Application Specific MAD" in verbose  # the built-in view of the QP1 MAD
    assert verbose.count("gid[5] MGID: ::") == 1  # decoding stops at the sixth MGID
    assert "gid[6]" not in verbose
    assert "status ENODATA" in verbose

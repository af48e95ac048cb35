"""Our umad SA client against a real OpenSM on the ibsim fabric simulator.

The client runs in a subprocess started with the ``libumad2sim.so`` preload (it has to be in
the process from the start) and goes through ``HwFabric`` (umad-only mode) exactly as the
daemon does. What it gets is compared with what OpenSM's own tool, ``saquery``, reports.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
from typing import Any

import pytest

from ibacm.wire.path_record import PathRecord
from tests.peers.ibsim import HCAS, SimFabric, parse_dump, saquery_path

pytestmark = pytest.mark.peer

ACM_GROUP = "ff15:4001:ffff:3:400::"
UNKNOWN = "fe80::dead:beef"


def probe(fabric: SimFabric, host: str, *actions: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(fabric.python(host, "-m", "tests.peers.sa_probe", *actions))
    return result


def members(fabric: SimFabric) -> list[dict[str, str]]:
    return parse_dump(fabric.saquery("Hca1", "--smkey", "1", "-m"), "member dump:")


def test_our_port_view_matches_the_sm(sim_fabric: SimFabric) -> None:
    seen = probe(sim_fabric, "Hca2")
    node = sim_fabric.nodes["Hca2"]
    assert (seen["device"], seen["lid"], seen["gid"]) == ("ibsim0", node.lid, node.gid)
    (record,) = parse_dump(sim_fabric.saquery("Hca1", "NR", str(seen["lid"])), "NodeRecord dump:")
    assert record["NodeDescription"] == "Hca2"
    assert int(record["port_guid"], 16) == int(ipaddress.IPv6Address(seen["gid"])) & (2**64 - 1)
    sm_info = parse_dump(sim_fabric.saquery("Hca2", "-s"), "PortInfoRecord dump:")
    assert seen["sm_lid"] == int(sm_info[0]["EndPortLid"], 0)


def test_join_creates_the_acm_group_and_leave_removes_the_member(sim_fabric: SimFabric) -> None:
    gid = sim_fabric.nodes["Hca3"].gid
    joined = probe(sim_fabric, "Hca3", "join")["join"]
    assert joined["status"] == 0
    assert ipaddress.IPv6Address(joined["mgid"]) == ipaddress.IPv6Address(ACM_GROUP)
    assert joined["mlid"] >= 0xC000  # assigned by OpenSM
    assert joined["scope_join"] == 0x51
    assert joined["qkey"] == 0x80010000
    listed = [m for m in members(sim_fabric) if m["PortGid"] == gid]
    assert [(m["MGID"], int(m["Mlid"], 16), m["ScopeState"]) for m in listed] == [
        (ACM_GROUP, joined["mlid"], "0x51")
    ]
    left = probe(sim_fabric, "Hca3", "leave")["leave"]
    assert left["status"] == 0
    assert not [m for m in members(sim_fabric) if m["PortGid"] == gid]


def test_path_records_for_every_hca_pair_equal_saquerys(sim_fabric: SimFabric) -> None:
    compared = 0
    for source in HCAS:
        others = [h for h in HCAS if h != source]
        actions = [f"path={sim_fabric.nodes[dest].gid}" for dest in others]
        answers = probe(sim_fabric, source, *actions, f"path={UNKNOWN}")["paths"]
        assert answers[UNKNOWN]["status"] == 0x0300  # SA status 3: no records
        for dest in others:
            answer = answers[sim_fabric.nodes[dest].gid]
            assert answer["status"] == 0, (source, dest)
            ours = PathRecord.decode(bytes.fromhex(answer["record"]))
            assert ours == saquery_path(sim_fabric, source, dest), (source, dest)
            compared += 1
    assert compared == len(list(itertools.permutations(HCAS, 2)))

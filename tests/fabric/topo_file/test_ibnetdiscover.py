"""ibnetdiscover output and ibsim net files read into a topology."""

from __future__ import annotations

import pytest

from ibacm.fabric.sim.topo_file.ibnetdiscover import parse_ibnetdiscover
from ibacm.fabric.sim.topo_file.model import SPEED_CODES, WIDTH_4X, WIDTH_12X, TopologyError
from tests.fabric.helpers import DATA, net_example


def test_parse_ibsim_example_assigns_like_ibsim_and_an_sm() -> None:
    topo = parse_ibnetdiscover(net_example("net.2sw2path4hca"))
    assert topo.host_names == ["Hca1", "Hca2", "Hca3", "Hca4"]
    assert [(s.name, s.guid, s.lid) for s in topo.switches] == [
        ("Switch1", 0x200000, 1),
        ("Switch2", 0x200001, 2),
    ]
    # ibsim gives each HCA a node GUID and one GUID per port, in file order.
    hca1 = topo.host("Hca1").hcas[0]
    assert (hca1.node_guid, [p.guid for p in hca1.ports]) == (0x100000, [0x100001, 0x100002])
    assert topo.host("Hca4").hcas[0].node_guid == 0x100009
    # Port 2 of every HCA has no cable: no LID, no address (it stays DOWN).
    assert [p.lid for p in hca1.ports] == [3, 0]
    assert hca1.ports[1].ipv4 == ()
    assert topo.sm_guid == 0x200000  # "the first port in the file is used as the SM port"
    assert {(link.width, link.speed) for link in topo.links} == {(WIDTH_4X, SPEED_CODES["SDR"])}
    assert len(topo.links) == 6  # four HCA cables and two between the switches


@pytest.mark.parametrize(
    "name", ["net", "net.1", "net.2sw2path", "net.2sw2path4hca", "net.2sw2path4hca2port"]
)
def test_every_ibsim_example_parses(name: str) -> None:
    topo = parse_ibnetdiscover(net_example(name))
    assert topo.hosts and all(p.lid or not p.ipv4 for _h, _c, p in topo.hca_ports())


def test_parse_real_ibnetdiscover_output_keeps_its_lids() -> None:
    # Captured from OpenSM on ibsim running net.2sw2path4hca (tests/fabric/data).
    topo = parse_ibnetdiscover((DATA / "net.2sw2path4hca.ibnetdiscover").read_text())
    lids = {h.name: h.hcas[0].ports[0].lid for h in topo.hosts}
    assert lids == {"Hca1": 2, "Hca2": 4, "Hca3": 5, "Hca4": 6}
    assert {s.name: s.lid for s in topo.switches} == {"Switch1": 1, "Switch2": 3}
    assert topo.host("Hca4").hcas[0].ports[0].guid == 0x10000A
    assert topo.sm_guid == 0x200000  # OpenSM took LID 1 for itself


def test_parse_width_speed_hints_name_map_and_sm_choice() -> None:
    text = """
switchguid=0x0002c90200000001
Switch 36 "S-0002c90200000001" # "core" base port 0 lid 10 lmc 0
[1] "H-0002c90300000010"[1](2c90300000011) # "node7 mlx5_0" lid 11 4xHDR
[2] "H-0002c90300000020"[1](2c90300000021) # "node8 mlx5_0" lid 12 12xEDR

caguid=0x0002c90300000010
Ca 1 "H-0002c90300000010" # "node7 mlx5_0"
[1](2c90300000011) "S-0002c90200000001"[1] # lid 11 lmc 0 "core" lid 10 4xHDR

caguid=0x0002c90300000020
Ca 1 "H-0002c90300000020" # "node8 mlx5_0"
[1](2c90300000021) "S-0002c90200000001"[2] # lid 12 lmc 0 "core" lid 10 12xEDR
"""
    topo = parse_ibnetdiscover(text, name_map={0x0002C90300000020: "login1"}, sm="node7")
    assert topo.host_names == ["login1", "node7"]
    links = {link.a.port: (link.width, link.speed) for link in topo.links}
    assert links == {1: (WIDTH_4X, SPEED_CODES["HDR"]), 2: (WIDTH_12X, SPEED_CODES["EDR"])}
    assert topo.host("node7").hcas[0].ports[0].lid == 11
    assert topo.sm_guid == 0x0002C90300000011
    assert topo.switches[0].name == "core"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no Switch/Hca/Ca node"),
        ('Hca 1 "a"\n[1] "nowhere"[1]\n', "unknown 'nowhere'"),
        ('Hca 1 "a"\nHca 1 "a"\n', "defined twice"),
        ('[1] "b"[1]\n', "port line before any node header"),
        ('Hca 1 "a"\n[2] "b"[1]\nHca 1 "b"\n[1] "a"[2]\n', "port 2 outside"),
        ('Hca 1 "a"\nwhat is this\n', "line 2: cannot parse"),
        ("include other.net\n", "not supported"),
        ('Switch 2 "s"\n[1] "a"[1] w=3\nHca 1 "a"\n', "w=3"),
        ('Switch 4 "s"\n[1] "a"[1]\n[2] "a"[1]\nHca 1 "a"\n', "already linked"),
    ],
)
def test_parse_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        parse_ibnetdiscover(text)

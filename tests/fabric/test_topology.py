"""Topologies: generated clusters and ibnetdiscover/ibsim files."""

from __future__ import annotations

import ipaddress

import pytest

from ibacm.fabric.sim.topology import (
    SPEED_CODES,
    WIDTH_4X,
    WIDTH_12X,
    Topology,
    TopologyError,
    generate,
    parse_ibnetdiscover,
)
from tests.fabric.helpers import DATA, net_example


def test_generate_names_lids_guids_and_addresses_are_deterministic() -> None:
    topo = generate(4)
    assert topo.host_names == ["node1", "node2", "node3", "node4"]
    assert [s.lid for s in topo.switches] == [1]
    ports = [p for _h, _hca, p in topo.hca_ports()]
    assert [p.lid for p in ports] == [2, 3, 4, 5]
    assert [str(p.ipv4[0]) for p in ports] == [f"10.0.0.{i}/16" for i in (1, 2, 3, 4)]
    assert [str(p.ipv6[0]) for p in ports] == [f"fd00::{i}/64" for i in (1, 2, 3, 4)]
    assert topo.hosts[0].hcas[0].name == "mlx5_0"
    assert topo.sm_guid == ports[0].guid  # node1 runs the SM
    assert generate(4).to_json() == topo.to_json()
    assert generate(4, seed=7).to_json() != topo.to_json()  # only GUIDs move with the seed
    assert [p.lid for _h, _c, p in generate(4, seed=7).hca_ports()] == [2, 3, 4, 5]


def test_generate_16384_nodes_has_no_collisions() -> None:
    topo = generate(16384)
    ports = [p for _h, _hca, p in topo.hca_ports()]
    assert len({p.lid for p in ports}) == 16384
    assert len({p.guid for p in ports}) == 16384
    assert len({p.ipv4[0].ip for p in ports}) == 16384
    assert str(ports[-1].ipv4[0].ip) == "10.0.64.0"  # 16384 = 64 * 256
    assert len(topo.switches) > 512  # leaves of 32 ports plus spines
    topo.validate()


def test_generate_multi_port_nodes_get_one_subnet_per_port() -> None:
    topo = generate(3, hcas_per_node=2, ports_per_hca=2, switches=3)
    node2 = topo.host("node2")
    assert [h.name for h in node2.hcas] == ["mlx5_0", "mlx5_1"]
    names = [(p.ifname, str(p.ipv4[0].ip)) for h in node2.hcas for p in h.ports]
    assert names == [
        ("ib0", "10.0.0.2"),
        ("ib1", "10.1.0.2"),
        ("ib2", "10.2.0.2"),
        ("ib3", "10.3.0.2"),
    ]
    assert [s.name for s in topo.switches] == ["leaf1", "leaf2", "leaf3", "spine1", "spine2"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 0}, "nodes must be"),
        ({"nodes": 2, "ports_per_hca": 0}, "ports_per_hca"),
        ({"nodes": 2, "pkeys": ()}, "must not be empty"),
        ({"nodes": 2, "pkeys": (0x1FFFF,)}, "16-bit"),
        ({"nodes": 2, "mtu": 7}, "MTU enum"),
        ({"nodes": 40000, "hcas_per_node": 2}, "unicast LIDs"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        generate(**kwargs)  # type: ignore[arg-type]


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


def test_json_round_trip_and_validation() -> None:
    topo = generate(3, ports_per_hca=2)
    again = Topology.from_json(topo.to_json())
    assert again == topo
    assert again.host("node3").hcas[0].ports[1].ipv6[0] == ipaddress.IPv6Interface(
        "fd00:0:0:1::3/64"
    )
    with pytest.raises(TopologyError, match="JSON"):
        Topology.from_json("{")
    with pytest.raises(TopologyError, match="missing or bad field"):
        Topology.from_json('{"subnet_prefix": "0x0"}')
    broken = generate(2)
    broken.hosts[1].hcas[0].ports[0].lid = broken.hosts[0].hcas[0].ports[0].lid
    with pytest.raises(TopologyError, match="already used"):
        broken.validate()

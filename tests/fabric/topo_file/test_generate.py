"""Generated clusters: names, LIDs, GUIDs and addresses, and the arguments refused."""

from __future__ import annotations

import pytest

from ibacm.fabric.sim.topo_file.generate import generate
from ibacm.fabric.sim.topo_file.model import TopologyError


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

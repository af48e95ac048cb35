"""The topology model: its JSON form and its validation."""

from __future__ import annotations

import ipaddress

import pytest

from ibacm.fabric.sim.topo_file.generate import generate
from ibacm.fabric.sim.topo_file.model import Topology, TopologyError


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

"""The rules every answer of the simulated SA shares: partitions, GID prefixes, rates."""

from __future__ import annotations

from ibacm.fabric.api import PortState
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.sa_view import (
    LINK_LOCAL_PREFIX,
    common_pkey,
    gid_port,
    has_pkey,
    pkey_shared,
    rate_gbps,
)
from ibacm.fabric.sim.topo_file import generate


def test_a_partition_is_shared_with_one_full_member_at_least() -> None:
    assert pkey_shared(0xFFFF, 0x7FFF) and pkey_shared(0x8001, 0x0001)
    assert not pkey_shared(0x0001, 0x0001)  # two limited members cannot talk
    assert not pkey_shared(0x8001, 0x8002)
    assert not pkey_shared(0x8000, 0x8000)  # partition 0 is invalid
    assert common_pkey((0x0002, 0x8001), (0xFFFF, 0x0001)) == 0x8001
    assert common_pkey((0x0001,), (0x0001, 0x8002)) is None
    assert has_pkey((0x0001,), 0x8001) and not has_pkey((0x8002,), 0x8001)


def test_a_gid_names_a_port_of_the_subnet_under_either_prefix() -> None:
    topology = generate(2, seed=3)
    topology.subnet_prefix = 0xFEC0000000000000  # a site-local subnet
    directory = Directory(topology, Router(topology))
    port = directory.port("node2", "mlx5_0", 1)
    guid = port.guid.to_bytes(8, "big")
    assert port.gid0[:2] == b"\xfe\xc0" and gid_port(directory, port.gid0) is port
    assert gid_port(directory, LINK_LOCAL_PREFIX.to_bytes(8, "big") + guid) is port
    assert gid_port(directory, (0xFE90 << 48).to_bytes(8, "big") + guid) is None
    directory.set_state(port, PortState.DOWN)
    assert gid_port(directory, port.gid0) is None  # out of the subnet


def test_an_unknown_rate_counts_as_no_bandwidth() -> None:
    assert rate_gbps(3) == 10.0 and rate_gbps(0) == 0.0 and rate_gbps(99) == 0.0

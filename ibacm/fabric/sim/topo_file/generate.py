"""Generated clusters ``node1..nodeN`` for the simulated fabric, and their address scheme."""

from __future__ import annotations

import ipaddress
import math
import random
from collections.abc import Sequence

from ibacm.fabric.sim.topo_file.model import (
    MTU_CODES,
    SPEED_CODES,
    UNICAST_LID_MAX,
    WIDTH_4X,
    Hca,
    HcaPort,
    Host,
    Link,
    LinkEnd,
    Switch,
    Topology,
    TopologyError,
    check_pkeys,
)

_HCA_OUI_GUID = 0x0002C90300000000
_SWITCH_OUI_GUID = 0x0002C90200000000
_PORTS_PER_LEAF = 32


def generate(
    nodes: int,
    *,
    hcas_per_node: int = 1,
    ports_per_hca: int = 1,
    switches: int | None = None,
    pkeys: Sequence[int] = (0xFFFF,),
    width: int = WIDTH_4X,
    speed: int = SPEED_CODES["EDR"],
    mtu: int = 5,
    seed: int = 0,
) -> Topology:
    """A cluster ``node1..nodeN``: leaf switches (plus spines when there are several leaves).

    ``switches`` is the number of leaf switches (default: one per 32 HCA ports). LIDs go to
    switches first, then to HCA ports in node order. Port k (counting all ports of a node
    from 0, interface ``ib<k>``) of node i gets ``10.<k>.<i // 256>.<i % 256>/16`` and
    ``fd00:0:0:<k>::<i>/64``. ``seed`` only varies the GUIDs (and so the GIDs). The SM runs
    behind node1's first port. Raises TopologyError when the LIDs or addresses run out.
    """
    _check_generate_args(nodes, hcas_per_node, ports_per_hca, switches, pkeys, mtu)
    guid_base = random.Random(seed).randrange(1 << 20) if seed else 0
    total_ports = nodes * hcas_per_node * ports_per_hca
    leaves = switches if switches is not None else max(1, math.ceil(total_ports / _PORTS_PER_LEAF))
    spines = 0 if leaves == 1 else max(2, math.ceil(leaves / 16))
    per_leaf = math.ceil(total_ports / leaves)
    if total_ports + leaves + spines > UNICAST_LID_MAX:
        raise TopologyError(
            f"{total_ports} HCA ports and {leaves + spines} switches need more than "
            f"{UNICAST_LID_MAX} unicast LIDs"
        )
    topo = Topology()
    topo.switches = _generated_switches(leaves, spines, per_leaf, guid_base, mtu)
    for index, leaf in enumerate(topo.switches[:leaves]):
        for s, spine in enumerate(topo.switches[leaves:]):
            up, down = LinkEnd(leaf.guid, per_leaf + 1 + s), LinkEnd(spine.guid, index + 1)
            topo.links.append(Link(up, down, width, speed))
    next_lid = len(topo.switches) + 1
    ordinal = 0
    for i in range(1, nodes + 1):
        host = Host(f"node{i}", [])
        for h in range(hcas_per_node):
            node_guid = _HCA_OUI_GUID | (((guid_base + i) & 0xFFFFF) << 12) | (h << 4)
            hca = Hca(f"mlx5_{h}", node_guid, f"node{i} mlx5_{h}", [])
            for p in range(1, ports_per_hca + 1):
                k = h * ports_per_hca + p - 1
                port = HcaPort(
                    num=p,
                    guid=node_guid + p,
                    lid=next_lid,
                    width=width,
                    speed=speed,
                    mtu=mtu,
                    pkeys=tuple(pkeys),
                    ifname=f"ib{k}",
                    ipv4=(ipv4_of(k, i),),
                    ipv6=(ipv6_of(k, i),),
                )
                next_lid += 1
                hca.ports.append(port)
                leaf = topo.switches[ordinal // per_leaf]
                down = LinkEnd(leaf.guid, ordinal % per_leaf + 1)
                topo.links.append(Link(LinkEnd(node_guid, p), down, width, speed))
                ordinal += 1
            host.hcas.append(hca)
        topo.hosts.append(host)
    topo.sm_guid = topo.hosts[0].hcas[0].ports[0].guid
    return topo.validate()


_IPV4_BASE = int(ipaddress.IPv4Address("10.0.0.0"))
_IPV6_BASE = int(ipaddress.IPv6Address("fd00::"))


def ipv4_of(k: int, i: int) -> ipaddress.IPv4Interface:
    """10.<k>.<i // 256>.<i % 256>/16 (built from integers: parsing text is slow at scale)."""
    return ipaddress.IPv4Interface((_IPV4_BASE | k << 16 | i, 16))


def ipv6_of(k: int, i: int) -> ipaddress.IPv6Interface:
    """fd00:0:0:<k>::<i>/64."""
    return ipaddress.IPv6Interface((_IPV6_BASE | k << 64 | i, 64))


def _check_generate_args(
    nodes: int,
    hcas_per_node: int,
    ports_per_hca: int,
    switches: int | None,
    pkeys: Sequence[int],
    mtu: int,
) -> None:
    if not 1 <= nodes <= 65534:
        raise TopologyError(f"nodes must be 1..65534, got {nodes}")
    if not 1 <= hcas_per_node <= 16:
        raise TopologyError(f"hcas_per_node must be 1..16, got {hcas_per_node}")
    if not 1 <= ports_per_hca <= 15:
        raise TopologyError(f"ports_per_hca must be 1..15, got {ports_per_hca}")
    if hcas_per_node * ports_per_hca > 256:
        raise TopologyError("at most 256 ports per node (one 10.<k>.0.0/16 net per port)")
    if switches is not None and not 1 <= switches <= 4096:
        raise TopologyError(f"switches must be 1..4096, got {switches}")
    check_pkeys(pkeys, "generate")
    if mtu not in MTU_CODES.values():
        raise TopologyError(f"mtu must be an IBA MTU enum 1..5, got {mtu}")


def _generated_switches(
    leaves: int, spines: int, per_leaf: int, guid_base: int, mtu: int
) -> list[Switch]:
    result = []
    for s in range(leaves + spines):
        if leaves == 1:
            name = "switch1"
        elif s < leaves:
            name = f"leaf{s + 1}"
        else:
            name = f"spine{s - leaves + 1}"
        guid = _SWITCH_OUI_GUID | (((guid_base + s + 1) & 0xFFFFF) << 12)
        ports = per_leaf + spines if s < leaves else leaves
        result.append(Switch(name, guid, s + 1, max(ports, 1), name, mtu=mtu))
    return result

"""The simulated fabric's topology as its files describe it: hosts, HCAs, switches, links.

A ``Topology`` is plain data: hosts with HCAs and ports (GUID, LID, width/speed/MTU, P_Key
table, IPoIB addresses), switches, links and where the SM runs. ``validate`` checks it whole;
``to_json``/``from_json`` carry it between processes (the hub writes it to DIR/topology.json
for ``ibacm-sim status``). Builders: ``generate.py`` (clusters), ``ibnetdiscover.py`` (files).
(Not to be confused with the daemon's view of its local ports, ``ibacm.core.local_topology``.)
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SUBNET_PREFIX = 0xFE80000000000000
UNICAST_LID_MAX = 0xBFFF
DEFAULT_SUBNET_TIMEOUT = 18
"""PortInfo:SubnetTimeout OpenSM programs by default (also its PathRecord packet lifetime)."""

WIDTH_1X, WIDTH_4X, WIDTH_8X, WIDTH_12X, WIDTH_2X = 1, 2, 4, 8, 16
SPEED_CODES = {
    "SDR": 1,
    "DDR": 2,
    "QDR": 4,
    "FDR10": 8,
    "FDR": 16,
    "EDR": 32,
    "HDR": 64,
    "NDR": 128,
    "XDR": 256,
}
WIDTH_CODES = {1: WIDTH_1X, 2: WIDTH_2X, 4: WIDTH_4X, 8: WIDTH_8X, 12: WIDTH_12X}
"""Lane count -> IBA width code."""
MTU_CODES = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


class TopologyError(ValueError):
    """A topology (generated, parsed or loaded) is inconsistent; the message says where."""


@dataclass(slots=True)
class HcaPort:
    """One HCA port: identity, link attributes and what sits on it (P_Keys, IPoIB)."""

    num: int
    guid: int
    lid: int = 0
    """0 when the port has no link (it stays DOWN)."""
    lmc: int = 0
    width: int = WIDTH_4X
    speed: int = SPEED_CODES["EDR"]
    mtu: int = 5
    """MTU capability (IBA enum); the active MTU is the minimum with the link peer."""
    pkeys: tuple[int, ...] = (0xFFFF,)
    ifname: str = ""
    """IPoIB interface on this port ('' = none)."""
    ipv4: tuple[ipaddress.IPv4Interface, ...] = ()
    ipv6: tuple[ipaddress.IPv6Interface, ...] = ()


@dataclass(slots=True)
class Hca:
    """One channel adapter (a verbs device)."""

    name: str
    node_guid: int
    description: str
    ports: list[HcaPort]

    def port(self, num: int) -> HcaPort:
        for port in self.ports:
            if port.num == num:
                return port
        raise TopologyError(f"{self.name} has no port {num}")


@dataclass(slots=True)
class Host:
    """A host: what one ibacm daemon sees."""

    name: str
    hcas: list[Hca]

    def hca(self, name: str) -> Hca:
        for hca in self.hcas:
            if hca.name == name:
                return hca
        raise TopologyError(f"host {self.name} has no device {name!r}")


@dataclass(slots=True)
class Switch:
    name: str
    guid: int
    lid: int
    num_ports: int
    description: str
    lmc: int = 0
    mtu: int = 5
    """MTU capability of the ports (and of management port 0)."""


@dataclass(frozen=True, slots=True)
class LinkEnd:
    """A physical port: node GUID of its switch or HCA, and the port number."""

    node_guid: int
    port: int


@dataclass(frozen=True, slots=True)
class Link:
    a: LinkEnd
    b: LinkEnd
    width: int = WIDTH_4X
    speed: int = SPEED_CODES["EDR"]


@dataclass(slots=True)
class Topology:
    """The whole fabric; see the module docstring."""

    hosts: list[Host] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    sm_guid: int = 0
    """Port GUID of the port the SM runs behind (a switch GUID for switch port 0)."""
    subnet_prefix: int = DEFAULT_SUBNET_PREFIX
    subnet_timeout: int = DEFAULT_SUBNET_TIMEOUT
    sm_sl: int = 0

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise TopologyError(f"no host named {name!r}")

    @property
    def host_names(self) -> list[str]:
        return [host.name for host in self.hosts]

    def hca_ports(self) -> Iterable[tuple[Host, Hca, HcaPort]]:
        for host in self.hosts:
            for hca in host.hcas:
                for port in hca.ports:
                    yield host, hca, port

    def validate(self) -> Topology:
        """Check names, GUIDs, LIDs, links and the SM location; return self."""
        _validate(self)
        return self

    def to_json(self) -> str:
        return json.dumps(_to_dict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Topology:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TopologyError(f"topology JSON: {exc}") from exc
        return _from_dict(raw).validate()


def gid_of(subnet_prefix: int, guid: int) -> bytes:
    """Port GID = subnet prefix + port GUID (16 bytes, big-endian)."""
    return subnet_prefix.to_bytes(8, "big") + guid.to_bytes(8, "big")


def check_pkeys(pkeys: Sequence[int], where: str) -> None:
    if not pkeys:
        raise TopologyError(f"{where}: the P_Key table must not be empty")
    for pkey in pkeys:
        if not isinstance(pkey, int) or not 0 <= pkey <= 0xFFFF:
            raise TopologyError(f"{where}: P_Key {pkey!r} is not a 16-bit value")


# -- validation ---------------------------------------------------------------------------


def _validate(topo: Topology) -> None:
    if not topo.hosts:
        raise TopologyError("the topology has no host")
    names: set[str] = set()
    guids: dict[int, str] = {}
    lids: dict[int, str] = {}

    def claim_guid(guid: int, what: str) -> None:
        if not 0 < guid < 1 << 64:
            raise TopologyError(f"{what}: GUID {guid:#x} is not a non-zero 64-bit value")
        if guid in guids:
            raise TopologyError(f"{what}: GUID 0x{guid:016x} already used by {guids[guid]}")
        guids[guid] = what

    def claim_lids(lid: int, lmc: int, what: str) -> None:
        if not 0 <= lmc <= 7:
            raise TopologyError(f"{what}: LMC {lmc} outside 0..7")
        if lid % (1 << lmc):
            raise TopologyError(f"{what}: LID {lid} is not aligned to LMC {lmc}")
        for value in range(lid, lid + (1 << lmc)):
            if not 1 <= value <= UNICAST_LID_MAX:
                raise TopologyError(f"{what}: LID {value} outside 1..{UNICAST_LID_MAX}")
            if value in lids:
                raise TopologyError(f"{what}: LID {value} already used by {lids[value]}")
            lids[value] = what

    for switch in topo.switches:
        if switch.name in names:
            raise TopologyError(f"name {switch.name!r} used twice")
        names.add(switch.name)
        claim_guid(switch.guid, f"switch {switch.name}")
        claim_lids(switch.lid, switch.lmc, f"switch {switch.name}")
    addresses: dict[tuple[int, int], str] = {}
    for host in topo.hosts:
        if not host.name or any(c.isspace() or c == "/" for c in host.name):
            raise TopologyError(f"host name {host.name!r} is empty or has a space or '/'")
        if host.name in names:
            raise TopologyError(f"name {host.name!r} used twice")
        names.add(host.name)
        if not host.hcas:
            raise TopologyError(f"host {host.name} has no HCA")
        for hca in host.hcas:
            what = f"{host.name}/{hca.name}"
            claim_guid(hca.node_guid, what)
            for port in hca.ports:
                claim_guid(port.guid, f"{what} port {port.num}")
                check_pkeys(port.pkeys, f"{what} port {port.num}")
                if port.lid:
                    claim_lids(port.lid, port.lmc, f"{what} port {port.num}")
                ifaces: list[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = [
                    *port.ipv4,
                    *port.ipv6,
                ]
                for iface in ifaces:
                    key = (iface.version, int(iface))  # cheaper than building .ip objects
                    if key in addresses:
                        raise TopologyError(f"{what}: address {iface.ip} also on {addresses[key]}")
                    addresses[key] = what
    _validate_links(topo)
    if topo.sm_guid not in guids:
        raise TopologyError(f"SM port GUID 0x{topo.sm_guid:016x} is not in the topology")


def _validate_links(topo: Topology) -> None:
    ports: dict[int, int] = {sw.guid: sw.num_ports for sw in topo.switches}
    for host in topo.hosts:
        for hca in host.hcas:
            ports[hca.node_guid] = max((p.num for p in hca.ports), default=0)
    used: set[LinkEnd] = set()
    for link in topo.links:
        for end in (link.a, link.b):
            if end.node_guid not in ports:
                raise TopologyError(f"link end 0x{end.node_guid:016x} is not a switch or HCA")
            if not 1 <= end.port <= ports[end.node_guid]:
                raise TopologyError(f"link end 0x{end.node_guid:016x} has no port {end.port}")
            if end in used:
                raise TopologyError(
                    f"port {end.port} of 0x{end.node_guid:016x} has more than one link"
                )
            used.add(end)
        if link.width not in WIDTH_CODES.values() or link.speed not in SPEED_CODES.values():
            raise TopologyError(f"link {link}: unknown width/speed code")


# -- JSON ---------------------------------------------------------------------------------


def _hex(value: int) -> str:
    return f"0x{value:016x}"


def _to_dict(topo: Topology) -> dict[str, Any]:
    return {
        "subnet_prefix": _hex(topo.subnet_prefix),
        "subnet_timeout": topo.subnet_timeout,
        "sm_guid": _hex(topo.sm_guid),
        "sm_sl": topo.sm_sl,
        "switches": [
            {
                "name": s.name,
                "guid": _hex(s.guid),
                "lid": s.lid,
                "lmc": s.lmc,
                "num_ports": s.num_ports,
                "description": s.description,
                "mtu": s.mtu,
            }
            for s in topo.switches
        ],
        "hosts": [{"name": h.name, "hcas": [_hca_dict(hca) for hca in h.hcas]} for h in topo.hosts],
        "links": [
            [
                _hex(link.a.node_guid),
                link.a.port,
                _hex(link.b.node_guid),
                link.b.port,
                link.width,
                link.speed,
            ]
            for link in topo.links
        ],
    }


def _hca_dict(hca: Hca) -> dict[str, Any]:
    return {
        "name": hca.name,
        "node_guid": _hex(hca.node_guid),
        "description": hca.description,
        "ports": [
            {
                "num": p.num,
                "guid": _hex(p.guid),
                "lid": p.lid,
                "lmc": p.lmc,
                "width": p.width,
                "speed": p.speed,
                "mtu": p.mtu,
                "pkeys": [f"0x{k:04x}" for k in p.pkeys],
                "ifname": p.ifname,
                "ipv4": [str(a) for a in p.ipv4],
                "ipv6": [str(a) for a in p.ipv6],
            }
            for p in hca.ports
        ],
    }


def _from_dict(raw: Any) -> Topology:
    try:
        topo = Topology(
            subnet_prefix=int(raw["subnet_prefix"], 16),
            subnet_timeout=int(raw["subnet_timeout"]),
            sm_guid=int(raw["sm_guid"], 16),
            sm_sl=int(raw.get("sm_sl", 0)),
        )
        topo.switches = [
            Switch(
                s["name"],
                int(s["guid"], 16),
                int(s["lid"]),
                int(s["num_ports"]),
                s["description"],
                int(s.get("lmc", 0)),
                int(s.get("mtu", 5)),
            )
            for s in raw["switches"]
        ]
        topo.hosts = [
            Host(h["name"], [_hca_from_dict(hca) for hca in h["hcas"]]) for h in raw["hosts"]
        ]
        topo.links = [
            Link(LinkEnd(int(a, 16), int(pa)), LinkEnd(int(b, 16), int(pb)), int(w), int(sp))
            for a, pa, b, pb, w, sp in raw["links"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise TopologyError(f"topology JSON: missing or bad field: {exc!r}") from exc
    return topo


def _hca_from_dict(raw: Any) -> Hca:
    ports = [
        HcaPort(
            num=int(p["num"]),
            guid=int(p["guid"], 16),
            lid=int(p["lid"]),
            lmc=int(p["lmc"]),
            width=int(p["width"]),
            speed=int(p["speed"]),
            mtu=int(p["mtu"]),
            pkeys=tuple(int(k, 16) for k in p["pkeys"]),
            ifname=p["ifname"],
            ipv4=tuple(ipaddress.IPv4Interface(a) for a in p["ipv4"]),
            ipv6=tuple(ipaddress.IPv6Interface(a) for a in p["ipv6"]),
        )
        for p in raw["ports"]
    ]
    return Hca(raw["name"], int(raw["node_guid"], 16), raw["description"], ports)

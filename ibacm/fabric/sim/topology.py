"""Fabric topologies for the simulator: generated clusters and ibnetdiscover/ibsim files.

A ``Topology`` is plain data: hosts with HCAs and ports (GUID, LID, width/speed/MTU, P_Key
table, IPoIB addresses), switches, links and where the SM runs. ``generate`` builds a cluster
of ``node1..nodeN`` with deterministic LIDs, GUIDs and addresses; ``parse_ibnetdiscover``
reads ``ibnetdiscover`` output and ibsim's net-example format so an operator can rehearse
their own fabric. ``to_json``/``from_json`` carry a topology between processes (the hub
writes it to DIR/topology.json for ``ibacm-sim status``).
"""

from __future__ import annotations

import ipaddress
import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
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

_HCA_OUI_GUID = 0x0002C90300000000
_SWITCH_OUI_GUID = 0x0002C90200000000
_PORTS_PER_LEAF = 32
_IBSIM_HCA_GUID_BASE = 0x100000
_IBSIM_SWITCH_GUID_BASE = 0x200000


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


# -- generated clusters -------------------------------------------------------------------


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
                    ipv4=(_ipv4(k, i),),
                    ipv6=(_ipv6(k, i),),
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


def _ipv4(k: int, i: int) -> ipaddress.IPv4Interface:
    """10.<k>.<i // 256>.<i % 256>/16 (built from integers: parsing text is slow at scale)."""
    return ipaddress.IPv4Interface((_IPV4_BASE | k << 16 | i, 16))


def _ipv6(k: int, i: int) -> ipaddress.IPv6Interface:
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
    _check_pkeys(pkeys, "generate")
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


def _check_pkeys(pkeys: Sequence[int], where: str) -> None:
    if not pkeys:
        raise TopologyError(f"{where}: the P_Key table must not be empty")
    for pkey in pkeys:
        if not isinstance(pkey, int) or not 0 <= pkey <= 0xFFFF:
            raise TopologyError(f"{where}: P_Key {pkey!r} is not a 16-bit value")


# -- ibnetdiscover / ibsim files ----------------------------------------------------------

_HEADER = re.compile(r'^(Switch|Hca|Ca|Rt)\s+(\d+)\s+"([^"]+)"(.*)$')
_PORT = re.compile(
    r'^\[(\d+)\](?:\(([0-9A-Fa-f]+)\))?\s*"([^"]+)"\s*\[(\d+)\](?:\(([0-9A-Fa-f]+)\))?(.*)$'
)
_GUID_LINE = re.compile(r"^(caguid|switchguid|rtguid)\s*=\s*(0x[0-9A-Fa-f]+|[0-9A-Fa-f]+)")
_LID_HINT = re.compile(r"\blid\s+(\d+)")
_LMC_HINT = re.compile(r"\blmc\s+(\d+)")
_SPEED_HINT = re.compile(r"\b(\d+)x(SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR)\b")
_DESC_HINT = re.compile(r'#\s*"([^"]*)"')
_OPTION = re.compile(r"\b([ws])=(\d+)\b")
_DEVICE_WORD = re.compile(r"^[A-Za-z]+[A-Za-z0-9]*_\d+$")


@dataclass(slots=True)
class _Record:
    kind: str  # "switch" or "hca"
    node_id: str
    num_ports: int
    line: int
    guid: int | None
    description: str
    lid: int = 0
    lmc: int = 0
    port_lids: dict[int, tuple[int, int]] = field(default_factory=dict)
    port_guids: dict[int, int] = field(default_factory=dict)
    links: list[tuple[int, str, int, int | None, int | None, int]] = field(default_factory=list)
    """(local port, remote id, remote port, width, speed, line)."""


def parse_ibnetdiscover(
    text: str,
    *,
    name_map: Mapping[int, str] | None = None,
    mtu: int = 4,
    pkeys: Sequence[int] = (0xFFFF,),
    sm: str | None = None,
) -> Topology:
    """Read ``ibnetdiscover`` output or an ibsim net file into a Topology.

    Hosts are named by ``name_map`` (node GUID -> host name, like ibnetdiscover's node name
    map), else by the first word of the HCA's node description ("node31 mlx5_0" -> node31,
    "Hca1" -> Hca1); HCAs of one host are grouped. LIDs come from the file's ``lid`` hints
    when present, else switches get the first LIDs then HCA ports, in file order. GUIDs come
    from ``caguid``/``switchguid`` lines, else are assigned as ibsim does. Link width/speed
    come from hints such as ``4xEDR`` or ibsim's ``w=``/``s=`` options (default 4x SDR, as
    ibsim); ``mtu`` (IBA enum, default 2048 like ibsim) applies to every port. Switches are
    named by their description when it is a unique single word. Hosts are listed in natural
    name order (Hca2 before Hca10). The SM runs behind ``sm`` (a host or switch name), else
    behind the port with LID 1 when the file gave LIDs (where OpenSM puts itself), else
    behind the first node of the file (ibsim's rule). Raises TopologyError naming the line.
    """
    if mtu not in MTU_CODES.values():
        raise TopologyError(f"mtu must be an IBA MTU enum 1..5, got {mtu}")
    _check_pkeys(pkeys, "parse_ibnetdiscover")
    records = _read_records(text)
    if not records:
        raise TopologyError("topology file: no Switch/Hca/Ca node found")
    _assign_file_guids(records)
    topo = _build_from_records(records, name_map or {}, mtu, tuple(pkeys))
    topo.sm_guid = _choose_sm(topo, records, sm)
    return topo.validate()


def _read_records(text: str) -> list[_Record]:
    records: list[_Record] = []
    pending_guid: int | None = None
    current: _Record | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("include ", "do ")):
            raise TopologyError(f"line {number}: ibsim directive {line.split()[0]!r} not supported")
        guid_match = _GUID_LINE.match(line)
        if guid_match:
            pending_guid = int(guid_match.group(2), 16)
            continue
        if re.match(r"^(vendid|devid|sysimgguid)\s*=", line):
            continue
        header = _HEADER.match(line)
        if header:
            current = _header_record(header, number, pending_guid)
            pending_guid = None
            records.append(current)
            continue
        port = _PORT.match(line)
        if port:
            if current is None:
                raise TopologyError(f"line {number}: port line before any node header")
            _add_port_line(current, port, number)
            continue
        raise TopologyError(f"line {number}: cannot parse {raw.strip()!r}")
    return records


def _header_record(match: re.Match[str], number: int, guid: int | None) -> _Record:
    kind_word, ports_text, node_id, rest = match.groups()
    if kind_word == "Rt":
        raise TopologyError(f"line {number}: routers are not simulated")
    kind = "switch" if kind_word == "Switch" else "hca"
    num_ports = int(ports_text)
    if not 1 <= num_ports <= 255:
        raise TopologyError(f"line {number}: {num_ports} ports is outside 1..255")
    desc = _DESC_HINT.search(rest)
    record = _Record(kind, node_id, num_ports, number, guid, desc.group(1) if desc else node_id)
    if kind == "switch":
        lid = _LID_HINT.search(rest)
        lmc = _LMC_HINT.search(rest)
        record.lid = int(lid.group(1)) if lid else 0
        record.lmc = int(lmc.group(1)) if lmc else 0
    return record


def _add_port_line(record: _Record, match: re.Match[str], number: int) -> None:
    local_text, local_guid, remote_id, remote_text, _remote_guid, rest = match.groups()
    local = int(local_text)
    first = 0 if record.kind == "switch" else 1
    if not first <= local <= record.num_ports or local == 0:
        raise TopologyError(
            f"line {number}: port {local} outside 1..{record.num_ports} of {record.node_id!r}"
        )
    width, speed = _link_hints(rest, number)
    if record.kind == "hca":
        comment = rest.split("#", 1)[1] if "#" in rest else ""
        own = comment.split('"', 1)[0]  # "lid 6 lmc 0" before the remote description
        lid = _LID_HINT.search(own)
        lmc = _LMC_HINT.search(own)
        if lid:
            record.port_lids[local] = (int(lid.group(1)), int(lmc.group(1)) if lmc else 0)
        if local_guid:
            record.port_guids[local] = int(local_guid, 16)
    record.links.append((local, remote_id, int(remote_text), width, speed, number))


def _link_hints(rest: str, number: int) -> tuple[int | None, int | None]:
    width: int | None = None
    speed: int | None = None
    hint = _SPEED_HINT.search(rest)
    if hint:
        lanes = int(hint.group(1))
        if lanes not in WIDTH_CODES:
            raise TopologyError(f"line {number}: link width {lanes}x is not an IB width")
        width, speed = WIDTH_CODES[lanes], SPEED_CODES[hint.group(2)]
    for key, value_text in _OPTION.findall(rest.split("#", 1)[0]):
        value = int(value_text)
        if key == "w":
            if value not in WIDTH_CODES:
                raise TopologyError(f"line {number}: w={value} is not 1, 2, 4, 8 or 12")
            width = WIDTH_CODES[value]
        else:
            if not 1 <= value <= 7:
                raise TopologyError(f"line {number}: s={value} is not an ibsim speed mask 1..7")
            speed = 1 << (value.bit_length() - 1)
    return width, speed


def _assign_file_guids(records: list[_Record]) -> None:
    """GUIDs missing from the file are handed out as ibsim does (HCA: node + port GUIDs)."""
    next_hca, next_switch = _IBSIM_HCA_GUID_BASE, _IBSIM_SWITCH_GUID_BASE
    for record in records:
        if record.kind == "switch":
            if record.guid is None:
                record.guid = next_switch
                next_switch += 1
        else:
            if record.guid is None:
                record.guid = next_hca
                next_hca += record.num_ports + 1


def _build_from_records(
    records: list[_Record], name_map: Mapping[int, str], mtu: int, pkeys: tuple[int, ...]
) -> Topology:
    by_id: dict[str, _Record] = {}
    for record in records:
        if record.node_id in by_id:
            raise TopologyError(f"line {record.line}: node {record.node_id!r} defined twice")
        by_id[record.node_id] = record
    links = _collect_links(records, by_id)
    topo = Topology()
    connected = {(end.node_guid, end.port) for link in links for end in (link.a, link.b)}
    descriptions = [r.description for r in records if r.kind == "switch"]
    for record in records:
        if record.kind == "switch":
            assert record.guid is not None
            desc = record.description
            unique = descriptions.count(desc) == 1 and desc not in by_id and desc.split() == [desc]
            name = desc if unique else record.node_id
            topo.switches.append(
                Switch(name, record.guid, record.lid, record.num_ports, desc, record.lmc, mtu)
            )
    hosts: dict[str, Host] = {}
    for record in records:
        if record.kind == "hca":
            host_name, hca = _record_hca(record, name_map, connected, mtu, pkeys)
            hosts.setdefault(host_name, Host(host_name, [])).hcas.append(hca)
    for host in hosts.values():
        for index, hca in enumerate(host.hcas):
            if any(other.name == hca.name for other in host.hcas[:index]):
                hca.name = f"mlx5_{index}"
    topo.hosts = sorted(hosts.values(), key=lambda host: _natural_key(host.name))
    topo.links = links
    _assign_missing_lids(topo)
    _assign_addresses(topo)
    return topo


def _natural_key(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name)]


def _choose_sm(topo: Topology, records: list[_Record], sm: str | None) -> int:
    if sm is not None:
        for switch in topo.switches:
            if sm == switch.name:
                return switch.guid
        for host in topo.hosts:
            if sm == host.name:
                return _first_connected_port_guid(topo, host.hcas[0].node_guid)
        raise TopologyError(f"SM location {sm!r} is neither a host nor a switch")
    file_gave_lids = any(r.lid or r.port_lids for r in records)
    if file_gave_lids:
        for switch in topo.switches:
            if switch.lid == 1:
                return switch.guid
        for _host, _hca, port in topo.hca_ports():
            if port.lid == 1:
                return port.guid
    first = records[0]
    assert first.guid is not None
    return first.guid if first.kind == "switch" else _first_connected_port_guid(topo, first.guid)


def _collect_links(records: list[_Record], by_id: dict[str, _Record]) -> list[Link]:
    seen: dict[tuple[str, int], tuple[str, int]] = {}
    links: list[Link] = []
    for record in records:
        for local, remote_id, remote_port, width, speed, line in record.links:
            remote = by_id.get(remote_id)
            if remote is None:
                raise TopologyError(
                    f"line {line}: {record.node_id!r} links to unknown {remote_id!r}"
                )
            here, there = (record.node_id, local), (remote_id, remote_port)
            if here in seen:
                if seen[here] != there:
                    raise TopologyError(
                        f"line {line}: {record.node_id}[{local}] is linked to both "
                        f"{seen[here][0]}[{seen[here][1]}] and {remote_id}[{remote_port}]"
                    )
                continue
            if there in seen and seen[there] != here:
                raise TopologyError(
                    f"line {line}: {remote_id}[{remote_port}] is already linked to "
                    f"{seen[there][0]}[{seen[there][1]}]"
                )
            seen[here], seen[there] = there, here
            assert record.guid is not None and remote.guid is not None
            links.append(
                Link(
                    LinkEnd(record.guid, local),
                    LinkEnd(remote.guid, remote_port),
                    width or WIDTH_4X,
                    speed or SPEED_CODES["SDR"],
                )
            )
    return links


def _record_hca(
    record: _Record,
    name_map: Mapping[int, str],
    connected: set[tuple[int, int]],
    mtu: int,
    pkeys: tuple[int, ...],
) -> tuple[str, Hca]:
    assert record.guid is not None
    words = record.description.split()
    host_name = name_map.get(record.guid) or (words[0] if words else record.node_id)
    device = words[1] if len(words) > 1 and _DEVICE_WORD.match(words[1]) else "mlx5_0"
    ports = []
    for num in range(1, record.num_ports + 1):
        lid, lmc = record.port_lids.get(num, (0, 0))
        guid = record.port_guids.get(num, record.guid + num)
        port = HcaPort(num=num, guid=guid, lid=lid, lmc=lmc, mtu=mtu, pkeys=pkeys)
        if (record.guid, num) not in connected:
            port.lid = 0
        ports.append(port)
    return host_name, Hca(device, record.guid, record.description, ports)


def _assign_missing_lids(topo: Topology) -> None:
    """Like an SM: keep LIDs the file gave, hand out the rest (switches first, then HCAs)."""
    used = {sw.lid for sw in topo.switches if sw.lid}
    connected = {(end.node_guid, end.port) for link in topo.links for end in (link.a, link.b)}
    for _host, hca, port in topo.hca_ports():
        if port.lid and (hca.node_guid, port.num) in connected:
            used.add(port.lid)
    next_lid = 1

    def take() -> int:
        nonlocal next_lid
        while next_lid in used:
            next_lid += 1
        if next_lid > UNICAST_LID_MAX:
            raise TopologyError(f"more ports than the {UNICAST_LID_MAX} unicast LIDs")
        used.add(next_lid)
        return next_lid

    for switch in topo.switches:
        if not switch.lid:
            switch.lid = take()
    for _host, hca, port in topo.hca_ports():
        if not port.lid and (hca.node_guid, port.num) in connected:
            port.lid = take()


def _assign_addresses(topo: Topology) -> None:
    """IPoIB addresses for parsed fabrics: the ``generate`` scheme, per connected port."""
    for i, host in enumerate(topo.hosts, start=1):
        k = 0
        for hca in host.hcas:
            for port in hca.ports:
                if not port.lid:
                    continue
                if i > 65534 or k > 255:
                    raise TopologyError("too many hosts/ports for the 10.<k>.x.y/16 scheme")
                port.ifname = f"ib{k}"
                port.ipv4 = (_ipv4(k, i),)
                port.ipv6 = (_ipv6(k, i),)
                k += 1


def _first_connected_port_guid(topo: Topology, node_guid: int) -> int:
    for _host, hca, port in topo.hca_ports():
        if hca.node_guid == node_guid and port.lid:
            return port.guid
    raise TopologyError(f"the SM node 0x{node_guid:016x} has no connected port")


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
                _check_pkeys(port.pkeys, f"{what} port {port.num}")
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

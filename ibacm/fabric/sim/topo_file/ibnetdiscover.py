"""``ibnetdiscover`` output and ibsim net files read into a simulated fabric's ``Topology``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ibacm.fabric.sim.topo_file.generate import ipv4_of, ipv6_of
from ibacm.fabric.sim.topo_file.model import (
    MTU_CODES,
    SPEED_CODES,
    UNICAST_LID_MAX,
    WIDTH_4X,
    WIDTH_CODES,
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

_IBSIM_HCA_GUID_BASE = 0x100000
_IBSIM_SWITCH_GUID_BASE = 0x200000


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
    check_pkeys(pkeys, "parse_ibnetdiscover")
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
                port.ipv4 = (ipv4_of(k, i),)
                port.ipv6 = (ipv6_of(k, i),)
                k += 1


def _first_connected_port_guid(topo: Topology, node_guid: int) -> int:
    for _host, hca, port in topo.hca_ports():
        if hca.node_guid == node_guid and port.lid:
            return port.guid
    raise TopologyError(f"the SM node 0x{node_guid:016x} has no connected port")

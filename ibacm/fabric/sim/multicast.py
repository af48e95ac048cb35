"""The SM's multicast group database: groups by MGID and MLID, members and their join states.

Group parameters are stored without selectors (the SA answers them as "exactly"). MLIDs are
handed out lowest-free-first from 0xC000, as OpenSM does. IPoIB broadcast groups created at
start are "well known": they stay when their last member leaves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MLID_FIRST = 0xC000
MLID_LAST = 0xFFFE
JOIN_FULL = 0x1
JOIN_NON_MEMBER = 0x2
JOIN_SEND_ONLY = 0x4
JOIN_SEND_ONLY_FULL = 0x8
IPOIB_QKEY = 0x0B1B
IPOIB_SIGNATURES = (0x401B, 0x601B)


@dataclass(slots=True)
class Member:
    port_guid: int
    port_gid: bytes
    join_state: int
    proxy: bool = False


@dataclass(slots=True)
class McGroup:
    mgid: bytes
    mlid: int
    qkey: int
    pkey: int
    mtu: int
    rate: int
    packet_life: int
    tclass: int = 0
    sl: int = 0
    flow_label: int = 0
    hop_limit: int = 0
    scope_state: int = 0
    """Scope and join state of the creating request (the group's own record)."""
    well_known: bool = False
    members: dict[int, Member] = field(default_factory=dict)

    @property
    def sl_flow_hop(self) -> int:
        return (self.sl << 28) | (self.flow_label << 8) | self.hop_limit

    def full_members(self) -> int:
        return sum(
            1 for m in self.members.values() if m.join_state & (JOIN_FULL | JOIN_SEND_ONLY_FULL)
        )

    def forwards_to(self, port_guid: int) -> bool:
        """Whether the fabric forwards this group's packets to the port (it joined to receive)."""
        member = self.members.get(port_guid)
        return member is not None and bool(member.join_state & (JOIN_FULL | JOIN_NON_MEMBER))


def mgid_signature(mgid: bytes) -> int:
    return int.from_bytes(mgid[2:4], "big")


def is_ipoib_mgid(mgid: bytes) -> bool:
    return mgid[0] == 0xFF and mgid_signature(mgid) in IPOIB_SIGNATURES


def ipoib_broadcast_mgid(pkey: int, scope: int = 2) -> bytes:
    """ff1<scope>:401b:<pkey|0x8000>::ffff:ffff, the IPoIB broadcast group of a partition."""
    head = bytes((0xFF, 0x10 | (scope & 0xF), 0x40, 0x1B)) + (pkey | 0x8000).to_bytes(2, "big")
    return head + bytes(6) + b"\xff\xff\xff\xff"


class GroupTable:
    """All groups of the subnet; see the module docstring."""

    def __init__(self) -> None:
        self.by_mgid: dict[bytes, McGroup] = {}
        self.by_mlid: dict[int, McGroup] = {}

    def __len__(self) -> int:
        return len(self.by_mgid)

    def allocate_mlid(self) -> int | None:
        for mlid in range(MLID_FIRST, MLID_LAST + 1):
            if mlid not in self.by_mlid:
                return mlid
        return None

    def add(self, group: McGroup) -> McGroup:
        if group.mgid in self.by_mgid or group.mlid in self.by_mlid:
            raise ValueError(f"MGID or MLID {group.mlid:#x} already in use")
        self.by_mgid[group.mgid] = group
        self.by_mlid[group.mlid] = group
        return group

    def remove(self, group: McGroup) -> None:
        self.by_mgid.pop(group.mgid, None)
        self.by_mlid.pop(group.mlid, None)

    def drop_if_unused(self, group: McGroup) -> bool:
        """Delete a group that has no full member left (unless well known); True if deleted."""
        if group.well_known or group.full_members():
            return False
        self.remove(group)
        return True

    def remove_port(self, port_guid: int) -> list[McGroup]:
        """The SM forgets a port that left the subnet; returns the groups that lost it."""
        touched = []
        for group in list(self.by_mgid.values()):
            if group.members.pop(port_guid, None) is not None:
                touched.append(group)
                self.drop_if_unused(group)
        return touched

    def clear(self) -> None:
        """A new SM starts with no groups but the well-known ones (members forgotten)."""
        for group in list(self.by_mgid.values()):
            if group.well_known:
                group.members.clear()
            else:
                self.remove(group)

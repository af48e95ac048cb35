"""MCMemberRecord requests to the simulated SA: joins, leaves and queries, as OpenSM does.

SET creates a group on the first full-member join (MLID from 0xC000 up); later joiners must
match Q_Key/P_Key/TClass/SL/flow/hop and the MTU/rate selectors and be able to carry the
group's MTU and rate, else status REQ_INVALID. IPoIB groups other than a partition's
broadcast group are only created when that broadcast group exists and their components match
it. DELETE removes the member, and the group with its last full member. GET/GetTable list the
groups (members only to a trusted requester, one with an SM_Key).
"""

from __future__ import annotations

from ibacm.fabric.sim.multicast import (
    IPOIB_SIGNATURES,
    JOIN_FULL,
    JOIN_SEND_ONLY_FULL,
    GroupTable,
    McGroup,
    Member,
    ipoib_broadcast_mgid,
    mgid_signature,
)
from ibacm.fabric.sim.sa_view import (
    RATES_BY_SPEED,
    SaEndpoint,
    SaFabric,
    SaFail,
    common_pkey,
    fail,
    has_pkey,
    invalid,
    prefix_known,
    rate_gbps,
)
from ibacm.wire.mad import MC_MEMBER_RECORD_LEN, McComp, McMemberRecord, SaMad, SaStatus

_JOIN_MASK = McComp.MGID | McComp.PORT_GID | McComp.JOIN_STATE
_CREATE_MASK = (
    _JOIN_MASK | McComp.QKEY | McComp.TCLASS | McComp.PKEY | McComp.FLOW_LABEL | McComp.SL
)


class MemberRecords:
    """See the module docstring: the SA's multicast requests against its ``groups``."""

    def __init__(self, fabric: SaFabric, groups: GroupTable) -> None:
        self.fabric = fabric
        self.groups = groups
        self._mgid_counter = 0

    def _member_port(self, record: McMemberRecord) -> SaEndpoint:
        if not prefix_known(self.fabric, record.port_gid):
            raise fail(SaStatus.REQ_INVALID_GID)
        port = self.fabric.endpoint_by_guid(int.from_bytes(record.port_gid[8:], "big"))
        if port is None:
            raise invalid()
        return port

    def join(self, requester: SaEndpoint, request: SaMad) -> bytes:
        """A SET: the member's record as the group now has it."""
        comp = request.sa.comp_mask
        record = McMemberRecord.decode(request.data[:MC_MEMBER_RECORD_LEN])
        if comp & _JOIN_MASK != _JOIN_MASK:
            raise fail(SaStatus.REQ_INSUFFICIENT_COMPONENTS)
        port = self._member_port(record)
        proxy = port is not requester
        if proxy and common_pkey(port.pkeys, requester.pkeys) is None:
            raise invalid()
        if comp & McComp.PKEY and not record.pkey & 0x7FFF:
            raise invalid()
        group = self.groups.by_mgid.get(record.mgid) if any(record.mgid) else None
        created = group is None
        if group is None:
            group = self._create(record, comp, port)
        elif not _other_fields_match(record, comp, group):
            raise invalid()
        try:
            if (
                not _more_fields_match(record, comp, group)
                or not self._port_carries(port, group)
                or record.join_state == 0
                or not has_pkey(port.pkeys, group.pkey)
            ):
                raise invalid()
            member = group.members.get(port.guid)
            if member is not None and not member.proxy and requester is not port:
                raise invalid()
            if member is not None and member.proxy and not has_pkey(requester.pkeys, group.pkey):
                raise invalid()
        except SaFail:
            if created:
                self.groups.remove(group)
            raise
        if member is None:
            member = Member(port.guid, record.port_gid, 0, proxy)
            group.members[port.guid] = member
        member.join_state |= record.join_state
        reply = McMemberRecord.decode(record.encode())
        _fill_from_group(reply, group)
        reply.scope, reply.join_state = record.scope, member.join_state
        return reply.encode()

    def _create(self, record: McMemberRecord, comp: int, port: SaEndpoint) -> McGroup:
        if not record.join_state & (JOIN_FULL | JOIN_SEND_ONLY_FULL):
            raise invalid()
        if comp & _CREATE_MASK != _CREATE_MASK:
            raise fail(SaStatus.REQ_INSUFFICIENT_COMPONENTS)
        mgid = record.mgid if any(record.mgid) else self._new_mgid(record, comp)
        self._check_requested_mgid(mgid, record, comp)
        mtu = _realizable_mtu(record, comp, port.mtu_cap)
        rate = _realizable_rate(record, comp, port.rate)
        if mtu is None or rate is None:
            raise invalid()
        mlid = self.groups.allocate_mlid()
        if mlid is None:
            raise fail(SaStatus.NO_RESOURCES)
        return self.groups.add(
            McGroup(
                mgid=mgid,
                mlid=mlid,
                qkey=record.qkey,
                pkey=record.pkey,
                mtu=mtu,
                rate=rate,
                packet_life=record.packet_life,
                tclass=record.tclass,
                sl=record.sl,
                flow_label=record.flow_label,
                hop_limit=record.hop_limit,
                scope_state=record.scope_join,
            )
        )

    def _new_mgid(self, record: McMemberRecord, comp: int) -> bytes:
        scope = record.scope if comp & McComp.SCOPE else 2
        prefix = self.fabric.subnet_prefix.to_bytes(8, "big")
        while True:
            self._mgid_counter = (self._mgid_counter + 1) & 0xFFFFFFFF
            head = bytes((0xFF, 0x10 | scope, 0xA0, 0x1B)) + prefix[:6]
            mgid = head + self._mgid_counter.to_bytes(4, "big") + bytes(2)
            if mgid not in self.groups.by_mgid:
                return mgid

    def _check_requested_mgid(self, mgid: bytes, record: McMemberRecord, comp: int) -> None:
        if mgid[0] != 0xFF:
            raise invalid()
        signature = mgid_signature(mgid)
        if signature in IPOIB_SIGNATURES:
            broadcast = ipoib_broadcast_mgid(int.from_bytes(mgid[4:6], "big"), mgid[1] & 0xF)
            if signature != 0x401B or mgid != broadcast:
                parent = self.groups.by_mgid.get(broadcast)
                if parent is None or not _other_fields_match(record, comp, parent):
                    raise invalid()
            return
        if mgid[1] & 0xE0:
            raise invalid()
        if signature == 0xA01B and mgid[1] & 0xF == 2:
            raise invalid()

    def _port_carries(self, port: SaEndpoint, group: McGroup) -> bool:
        return port.mtu_cap >= group.mtu and rate_gbps(port.rate) >= rate_gbps(group.rate)

    def leave(self, requester: SaEndpoint, request: SaMad) -> bytes:
        """A DELETE: the member's record with what is left of its join state."""
        comp = request.sa.comp_mask
        record = McMemberRecord.decode(request.data[:MC_MEMBER_RECORD_LEN])
        if comp & _JOIN_MASK != _JOIN_MASK:
            raise fail(SaStatus.REQ_INSUFFICIENT_COMPONENTS)
        if not prefix_known(self.fabric, record.port_gid):
            raise fail(SaStatus.REQ_INVALID_GID)
        group = self.groups.by_mgid.get(record.mgid)
        if group is None:
            raise invalid()
        member = group.members.get(int.from_bytes(record.port_gid[8:], "big"))
        leaving = record.join_state
        if (
            member is None
            or not leaving & member.join_state
            or leaving | member.join_state != member.join_state
        ):
            raise invalid()
        port = self.fabric.endpoint_by_guid(member.port_guid)
        if not member.proxy and port is not requester:
            raise invalid()
        if member.proxy and not has_pkey(requester.pkeys, group.pkey):
            raise invalid()
        member.join_state &= ~leaving
        if not member.join_state:
            del group.members[member.port_guid]
        self.groups.drop_if_unused(group)
        reply = McMemberRecord.decode(record.encode())
        reply.mtu_selector = reply.rate_selector = reply.packet_life_selector = 2
        reply.join_state = member.join_state
        return reply.encode()

    def query(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        """A GET or GetTable: the records of the groups (and members) that match."""
        comp = request.sa.comp_mask
        query = McMemberRecord.decode(request.data[:MC_MEMBER_RECORD_LEN])
        trusted = request.sa.sm_key != 0
        found: list[bytes] = []
        for mgid in sorted(self.groups.by_mgid):
            group = self.groups.by_mgid[mgid]
            for reply in _query_matches(query, comp, group, requester, trusted):
                if not trusted:
                    reply.port_gid, reply.join_state, reply.proxy_join = bytes(16), 0, False
                found.append(reply.encode())
        return found


def _other_fields_match(record: McMemberRecord, comp: int, group: McGroup) -> bool:
    """OpenSM's join validation: Q_Key, P_Key, TClass, SL, FlowLabel, HopLimit."""
    if comp & McComp.QKEY and record.qkey != group.qkey:
        return False
    if comp & McComp.PKEY:
        if not (record.pkey | group.pkey) & 0x8000:
            return False
        if record.pkey & 0x7FFF != group.pkey & 0x7FFF:
            return False
    if comp & McComp.TCLASS and record.tclass != group.tclass:
        return False
    if comp & McComp.SL and record.sl != group.sl:
        return False
    if comp & McComp.FLOW_LABEL and record.flow_label != group.flow_label:
        return False
    return not (comp & McComp.HOP_LIMIT and record.hop_limit != group.hop_limit)


def _compare(selector: int, group_value: float, wanted: float) -> bool:
    if selector == 0:
        return group_value > wanted
    if selector == 1:
        return group_value < wanted
    if selector == 2:
        return group_value == wanted
    return True


def _more_fields_match(record: McMemberRecord, comp: int, group: McGroup) -> bool:
    """MTU and rate selectors against the group (packet lifetime is ignored, as OpenSM)."""
    if comp & McComp.MTU_SELECTOR and not _compare(record.mtu_selector, group.mtu, record.mtu):
        return False
    return not (
        comp & McComp.RATE_SELECTOR
        and not _compare(record.rate_selector, rate_gbps(group.rate), rate_gbps(record.rate))
    )


def _realizable_mtu(record: McMemberRecord, comp: int, port_mtu: int) -> int | None:
    """OpenSM's choice of a new group's MTU from the request and the creating port."""
    selector, wanted = record.mtu_selector, record.mtu
    if not (comp & McComp.MTU and comp & McComp.MTU_SELECTOR) or selector == 3:
        return port_mtu
    value = wanted
    if selector == 0:
        if wanted >= port_mtu:
            return None
        value = port_mtu
    elif selector == 1:
        value = port_mtu if wanted > port_mtu else wanted - 1
    return value if 1 <= value <= 5 else None


def _realizable_rate(record: McMemberRecord, comp: int, port_rate: int) -> int | None:
    """The same choice for the rate (compared in Gb/s, the enum is not ordered)."""
    selector, wanted = record.rate_selector, record.rate
    if not (comp & McComp.RATE and comp & McComp.RATE_SELECTOR) or selector == 3:
        return port_rate or None
    if not rate_gbps(wanted):
        return None
    if selector == 0:
        return port_rate if rate_gbps(wanted) < rate_gbps(port_rate) else None
    if selector == 1:
        if rate_gbps(wanted) > rate_gbps(port_rate):
            return port_rate
        lower = [r for gbps, r in RATES_BY_SPEED if gbps < rate_gbps(wanted)]
        return lower[-1] if lower else None
    return wanted


def _fill_from_group(reply: McMemberRecord, group: McGroup) -> None:
    reply.mgid, reply.qkey, reply.mlid = group.mgid, group.qkey, group.mlid
    reply.tclass, reply.pkey = group.tclass, group.pkey
    reply.sl, reply.flow_label, reply.hop_limit = group.sl, group.flow_label, group.hop_limit
    reply.mtu_selector, reply.mtu = 2, group.mtu
    reply.rate_selector, reply.rate = 2, group.rate
    reply.packet_life_selector, reply.packet_life = 2, group.packet_life


def _query_matches(
    query: McMemberRecord, comp: int, group: McGroup, requester: SaEndpoint, trusted: bool
) -> list[McMemberRecord]:
    if comp & McComp.MGID and query.mgid != group.mgid:
        return []
    if comp & McComp.MLID and query.mlid != group.mlid:
        return []
    if not has_pkey(requester.pkeys, group.pkey):
        return []
    if comp & McComp.PKEY and query.pkey != group.pkey:
        return []
    if not _other_fields_match(query, comp & ~McComp.PKEY, group):
        return []
    if comp & McComp.PROXY_JOIN and query.proxy_join:
        return []
    if not _more_fields_match(query, comp, group):
        return []
    mask = (0xF0 if comp & McComp.SCOPE else 0) | (0x0F if comp & McComp.JOIN_STATE else 0)
    wanted = query.scope_join & mask

    def record_for(scope_state: int, port_gid: bytes, proxy: bool) -> McMemberRecord:
        reply = McMemberRecord()
        _fill_from_group(reply, group)
        reply.scope, reply.join_state = scope_state >> 4, scope_state & 0xF
        reply.port_gid, reply.proxy_join = port_gid, proxy
        return reply

    scope = group.scope_state & 0xF0
    if comp & McComp.PORT_GID:
        member = group.members.get(int.from_bytes(query.port_gid[8:], "big"))
        if member is None:
            return []
        state = scope | member.join_state
        if state & mask != wanted:
            return []
        return [record_for(state, member.port_gid, member.proxy)]
    if trusted:
        return [
            record_for(scope | m.join_state, m.port_gid, m.proxy)
            for m in group.members.values()
            if (scope | m.join_state) & mask == wanted
        ]
    if group.scope_state & mask != wanted:
        return []
    return [record_for(group.scope_state, bytes(16), False)]

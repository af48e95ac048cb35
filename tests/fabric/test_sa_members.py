"""MCMemberRecord joins, leaves and queries at the simulated SA, on its group table alone."""

from __future__ import annotations

import pytest

from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.multicast import MLID_FIRST, GroupTable
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.runtime import PortRuntime
from ibacm.fabric.sim.sa_members import MemberRecords
from ibacm.fabric.sim.sa_view import SaFail
from ibacm.fabric.sim.topo_file import generate
from ibacm.wire.mad import (
    MadHeader,
    McComp,
    McMemberRecord,
    Method,
    SaAttr,
    SaHeader,
    SaMad,
    SaStatus,
    build_mc_join,
    build_mc_leave,
    sa_status_word,
)
from tests.fabric.helpers import ACM_QKEY, acm_join_record


def mc_query(tid: int, *, sm_key: int = 0) -> SaMad:
    """A GetTable of every MCMemberRecord (no component), with or without an SM_Key."""
    header = MadHeader(method=Method.GET_TABLE, tid=tid, attr_id=SaAttr.MC_MEMBER_RECORD)
    return SaMad.decode(SaMad(mad=header, sa=SaHeader(sm_key=sm_key), data=bytes(56)).encode())


def setup(nodes: int = 3) -> tuple[MemberRecords, GroupTable, list[PortRuntime]]:
    topology = generate(nodes)
    directory = Directory(topology, Router(topology))
    groups = GroupTable()
    ports = [directory.port(f"node{i}", "mlx5_0", 1) for i in range(1, nodes + 1)]
    return MemberRecords(directory, groups), groups, ports


def join(
    members: MemberRecords, port: PortRuntime, tid: int, *, qkey: int = ACM_QKEY
) -> McMemberRecord:
    request = SaMad.decode(build_mc_join(tid, acm_join_record(port.gid0, qkey=qkey)))
    return McMemberRecord.decode(members.join(port, request))


def leave(members: MemberRecords, port: PortRuntime, tid: int, gid: bytes) -> McMemberRecord:
    request = SaMad.decode(build_mc_leave(tid, acm_join_record(gid)))
    return McMemberRecord.decode(members.leave(port, request))


def test_the_first_full_member_creates_the_group_and_the_last_one_ends_it() -> None:
    members, groups, (a, b, _c) = setup()
    created = join(members, a, 1)
    assert created.mlid == MLID_FIRST and created.join_state == 1
    joined = join(members, b, 2)
    assert joined.mlid == created.mlid
    assert set(groups.by_mlid[MLID_FIRST].members) == {a.guid, b.guid}
    left = leave(members, a, 3, a.gid0)
    assert left.join_state == 0 and MLID_FIRST in groups.by_mlid
    leave(members, b, 4, b.gid0)
    assert not groups.by_mlid


def test_a_joiner_that_does_not_match_the_group_is_refused_and_changes_nothing() -> None:
    members, groups, (a, b, c) = setup()
    join(members, a, 1)
    with pytest.raises(SaFail) as failure:
        join(members, b, 2, qkey=0x80010001)
    assert failure.value.status == sa_status_word(SaStatus.REQ_INVALID)
    # Leaving someone else's membership; creating a group without its components.
    with pytest.raises(SaFail):
        leave(members, c, 3, a.gid0)
    sparse = build_mc_join(
        4,
        acm_join_record(c.gid0, mgid=bytes.fromhex("ff15" + "11" * 14)),
        comp_mask=McComp.MGID | McComp.PORT_GID | McComp.JOIN_STATE,
    )
    with pytest.raises(SaFail) as failure:
        members.join(c, SaMad.decode(sparse))
    assert failure.value.status == sa_status_word(SaStatus.REQ_INSUFFICIENT_COMPONENTS)
    assert list(groups.by_mlid) == [MLID_FIRST] and set(groups.by_mlid[MLID_FIRST].members) == {
        a.guid
    }


def test_a_query_lists_members_only_to_a_trusted_requester() -> None:
    members, _groups, (a, b, _c) = setup()
    for port in (a, b):
        join(members, port, 1)
    untrusted = members.query(a, mc_query(5))
    (group,) = (McMemberRecord.decode(r) for r in untrusted)
    assert group.port_gid == bytes(16) and group.mlid == MLID_FIRST
    trusted = members.query(a, mc_query(6, sm_key=1))
    assert sorted(McMemberRecord.decode(r).port_gid for r in trusted) == sorted((a.gid0, b.gid0))

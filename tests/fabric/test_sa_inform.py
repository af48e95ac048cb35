"""InformInfo subscriptions at the simulated SA and the Reports they lead to, on their own."""

from __future__ import annotations

import pytest

from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.runtime import PortRuntime
from ibacm.fabric.sim.sa_inform import Subscriptions
from ibacm.fabric.sim.sa_view import SaFail
from ibacm.fabric.sim.topo_file import generate
from ibacm.wire.mad import SaMad
from ibacm.wire.notice import (
    InformInfo,
    Notice,
    Trap,
    build_inform_info_set,
    build_report_resp,
    decode_report,
)


def setup() -> tuple[Subscriptions, Directory, list[PortRuntime]]:
    topology = generate(4)
    topology.host("node4").hcas[0].ports[0].pkeys = (0x8001,)  # a partition of its own
    directory = Directory(topology, Router(topology))
    ports = [directory.port(f"node{i}", "mlx5_0", 1) for i in range(1, 5)]
    return Subscriptions(directory), directory, ports


def inform(info: InformInfo, tid: int = 1) -> SaMad:
    return SaMad.decode(build_inform_info_set(tid, info))


def test_subscribe_unsubscribe_and_what_is_refused() -> None:
    subscriptions, _directory, (a, b, _c, _d) = setup()
    assert subscriptions.inform(a, inform(InformInfo(trap_num=64)))[1]
    assert [guid for guid, _key in subscriptions.subscriptions] == [a.guid]
    # Not subscribed: refused (and echoed); a GID of no known port: refused.
    assert not subscriptions.inform(b, inform(InformInfo(trap_num=64, subscribe=0)))[1]
    unknown = bytes(8) + (0xDEAD).to_bytes(8, "big")
    assert not subscriptions.inform(b, inform(InformInfo(trap_num=64, gid=unknown)))[1]
    with pytest.raises(SaFail):  # a security trap without an SM_Key
        subscriptions.inform(b, inform(InformInfo(trap_num=256)))
    assert subscriptions.inform(a, inform(InformInfo(trap_num=64, subscribe=0)))[1]
    assert not subscriptions.subscriptions


def test_reports_go_to_subscribers_of_a_shared_partition_until_acknowledged() -> None:
    subscriptions, directory, (a, b, c, d) = setup()
    for port in (a, c, d):
        subscriptions.inform(port, inform(InformInfo(trap_num=65)))
    issuer = directory.port("node1", "mlx5_0", 1)
    reports = subscriptions.reports(Trap.GID_OUT_OF_SERVICE, b.guid, issuer)
    # node4 shares no partition with node2: OpenSM does not tell it.
    assert [subscriber for subscriber, _mad in reports] == [a.guid, c.guid]
    for _subscriber, mad in reports:
        _report, notice = decode_report(mad)
        assert (notice.trap_num, notice.issuer_lid) == (65, issuer.lid)
        assert notice == Notice.gid_trap(
            Trap.GID_OUT_OF_SERVICE, b.gid0, issuer_lid=issuer.lid, issuer_gid=issuer.gid0
        )
    assert sorted(subscriptions.unacked.values()) == sorted((a.guid, c.guid))
    (_, to_a), _to_c = reports
    # Only the subscriber it went to can acknowledge a Report.
    subscriptions.acknowledged(c, SaMad.decode(build_report_resp(SaMad.decode(to_a))).mad)
    assert len(subscriptions.unacked) == 2
    subscriptions.acknowledged(a, SaMad.decode(build_report_resp(SaMad.decode(to_a))).mad)
    assert list(subscriptions.unacked.values()) == [c.guid]
    # A port that leaves takes its subscriptions and the Reports it owes with it.
    subscriptions.forget_port(c.guid)
    assert not subscriptions.unacked
    assert {guid for guid, _key in subscriptions.subscriptions} == {a.guid, d.guid}
    subscriptions.forget_all()
    assert not subscriptions.subscriptions

"""The simulated SM's event subscriptions: InformInfo SET, trap 64/65 Reports, their acks.

What a port sees is what OpenSM does (tests/peers/test_sm_traps.py shows it against OpenSM on
ibsim): the SA answers an InformInfo SET with GetResp echoing it, reports a port going down
(trap 65) or coming up (trap 64) to every subscriber, and sends a Report again until the
subscriber acknowledges it with a ReportResp.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from ibacm.fabric.sim.sa_transport import REPORT_RETRIES
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import SaMad, SaStatus, sa_status_word
from ibacm.wire.notice import (
    InformInfo,
    Notice,
    Trap,
    build_inform_info_set,
    build_report_resp,
    decode_inform_info_reply,
    decode_report,
)
from tests.fabric.helpers import NodePort, hub, open_node, running


async def subscribe(node: NodePort, trap: int, tid: int, *, subscribe: int = 1) -> SaMad:
    reply = await node.sa(
        build_inform_info_set(tid, InformInfo(trap_num=trap, subscribe=subscribe))
    )
    return SaMad.decode(reply)


async def next_report(node: NodePort, within: float = 2.0) -> tuple[SaMad, Notice]:
    with trio.fail_after(within):
        return decode_report(await node.port.sa_report())


@asynccontextmanager
async def three_nodes() -> AsyncIterator[tuple[SimWorld, NodePort, NodePort, NodePort]]:
    world = SimWorld(generate(3))
    async with running(world):
        nodes = [await open_node(world.fabric(f"node{i}")) for i in (1, 2, 3)]
        yield world, nodes[0], nodes[1], nodes[2]


@pytest.mark.trio
async def test_port_down_and_up_are_reported_to_subscribers(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with three_nodes() as (world, node1, node2, node3):
        for tid, trap in enumerate((Trap.GID_IN_SERVICE, Trap.GID_OUT_OF_SERVICE), 1):
            reply = await subscribe(node1, trap, tid)
            assert reply.mad.status == 0
            assert decode_inform_info_reply(reply) == InformInfo(trap_num=trap)
        world.set_port_state("node3", "mlx5_0", 1, False)
        report, notice = await next_report(node1)
        assert (notice.trap_num, notice.subject_gid) == (65, node3.gid)
        assert notice.issuer_lid == world.sm_lid
        await node1.port.sa_post(build_report_resp(report), node1.dest)
        world.set_port_state("node3", "mlx5_0", 1, True)
        report, notice = await next_report(node1)
        assert (notice.trap_num, notice.subject_gid) == (64, node3.gid)
        await node1.port.sa_post(build_report_resp(report), node1.dest)
        await trio.sleep(2)
        assert world.stats["report_resent"] == 0
        # node2 never subscribed: nothing was sent to it.
        with trio.move_on_after(1):
            await node2.port.sa_report()
            pytest.fail("a port that did not subscribe got a Report")


@pytest.mark.trio
async def test_an_unacknowledged_report_is_sent_again_then_given_up(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with three_nodes() as (world, node1, _node2, node3):
        await subscribe(node1, Trap.GID_OUT_OF_SERVICE, 1)
        world.set_port_state("node3", "mlx5_0", 1, False)
        first, _ = await next_report(node1)
        again, notice = await next_report(node1)
        assert again.mad.tid == first.mad.tid and notice.subject_gid == node3.gid
        for _ in range(REPORT_RETRIES - 1):
            await next_report(node1)
        with trio.move_on_after(2):
            await node1.port.sa_report()
            pytest.fail(f"more than {REPORT_RETRIES} resends")
        assert world.stats["report_unacked"] == 1


@pytest.mark.trio
async def test_unsubscribe_and_bad_subscriptions(autojump_clock: trio.abc.Clock) -> None:
    async with three_nodes() as (world, node1, _node2, _node3):
        await subscribe(node1, Trap.GID_OUT_OF_SERVICE, 1)
        assert (await subscribe(node1, Trap.GID_OUT_OF_SERVICE, 2, subscribe=0)).mad.status == 0
        refused = await subscribe(node1, Trap.GID_OUT_OF_SERVICE, 3, subscribe=0)
        assert refused.mad.status == sa_status_word(SaStatus.REQ_INVALID)
        assert decode_inform_info_reply(refused).subscribe == 0
        security = await subscribe(node1, 256, 4)
        assert security.mad.status == sa_status_word(SaStatus.REQ_INVALID)
        bad = await subscribe(node1, 65, 5, subscribe=2)
        assert bad.mad.status == sa_status_word(SaStatus.REQ_INVALID)
        garbled = bytearray(build_inform_info_set(6, InformInfo(trap_num=65)))
        garbled[56 + 22] = 7  # IsGeneric neither 0 nor 1
        reply = SaMad.decode(await node1.sa(bytes(garbled)))
        assert reply.mad.status == sa_status_word(SaStatus.REQ_INVALID)
        assert world.stats["sa_internal_error"] == 0
        world.set_port_state("node3", "mlx5_0", 1, False)
        with trio.move_on_after(1):
            await node1.port.sa_report()
            pytest.fail("an unsubscribed port got a Report")


@pytest.mark.trio
async def test_subscriptions_end_with_the_port_and_with_the_sm(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with three_nodes() as (world, node1, node2, _node3):
        await subscribe(node1, Trap.GID_OUT_OF_SERVICE, 1)
        await world.port_flap("node1", "mlx5_0", 1, 0.5)
        await subscribe(node2, Trap.GID_OUT_OF_SERVICE, 1)
        world.move_sm("node2")  # the new SM knows no subscriptions either
        world.set_port_state("node3", "mlx5_0", 1, False)
        for node in (node1, node2):
            with trio.move_on_after(1):
                await node.port.sa_report()
                pytest.fail("a subscription outlived its port or its SM")


@pytest.mark.trio
async def test_reports_reach_a_daemon_across_the_hub(tmp_path: Path) -> None:
    from ibacm.fabric.sim.hub import HubFabric

    world = SimWorld(generate(2))
    async with hub(world, tmp_path / "hub.sock") as path:
        fabric = HubFabric(path, "node1")
        node1 = await open_node(fabric)
        node2 = await open_node(world.fabric("node2"))
        assert (await subscribe(node1, Trap.GID_OUT_OF_SERVICE, 7)).mad.status == 0
        world.set_port_state("node2", "mlx5_0", 1, False)
        report, notice = await next_report(node1, within=10)
        assert notice.subject_gid == node2.gid
        await node1.port.sa_post(build_report_resp(report), node1.dest)
        with trio.fail_after(10):
            while world.sa.unacked:
                await trio.sleep(0.01)
        await fabric.aclose()


@pytest.mark.trio
async def test_a_subscription_for_one_gid_or_lid_range_hears_only_about_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with three_nodes() as (world, node1, node2, node3):
        one_gid = InformInfo(trap_num=65, gid=node3.gid)
        assert SaMad.decode(await node1.sa(build_inform_info_set(1, one_gid))).mad.status == 0
        lids = InformInfo(trap_num=65, lid_range_begin=node3.lid, lid_range_end=node3.lid)
        assert SaMad.decode(await node2.sa(build_inform_info_set(2, lids))).mad.status == 0
        unknown = InformInfo(trap_num=65, gid=node3.gid[:8] + bytes(7) + b"\x99")
        refused = SaMad.decode(await node1.sa(build_inform_info_set(3, unknown)))
        assert refused.mad.status == sa_status_word(SaStatus.REQ_INVALID)
        world.set_port_state("node2", "mlx5_0", 1, False)
        with trio.move_on_after(1):
            await node1.port.sa_report()
            pytest.fail("a subscription for node3's GID heard about node2")
        world.set_port_state("node2", "mlx5_0", 1, True)
        # node2 lost its subscription with its port: subscribe again, then node3 goes.
        assert SaMad.decode(await node2.sa(build_inform_info_set(4, lids))).mad.status == 0
        world.set_port_state("node3", "mlx5_0", 1, False)
        for node in (node1, node2):
            _report, notice = await next_report(node)
            assert notice.subject_gid == node3.gid

"""The UD QP's completion handling, on a fake HCA (the real calls need hardware).

What a user of the QP would notice: sends return at their completion and report errors;
received MADs come with the GRH source; every buffer is re-posted (also after an error,
C defect 46); closing wakes a blocked receiver; multicast attach reaches libibverbs.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio

from ibacm.fabric.api import ACM_QKEY, MULTICAST_QPN, AddressVector, FabricError
from ibacm.fabric.hw.ud_qp import SEND_DEPTH, SEND_WR_BASE, HwUdQp, QpResources
from ibacm.fabric.hw.verbs_handles import LibVerbs, VerbsHandles
from tests.fabric.hw.fake_verbs import ENUMS, FakeHandles, FakeHca, FakeLibVerbs

PEER_GID = bytes.fromhex("fe800000000000000002c90300010009")
MGID = bytes.fromhex("ff154001ffff00030400000000000000")
MAD = bytes([1, 0x2C, 1, 1]) + bytes(252)


def open_qp(hca: FakeHca, *, recv_depth: int = 4) -> HwUdQp:
    pv = hca.pyverbs()
    ctx = hca.context()
    handles = cast(VerbsHandles, FakeHandles(hca))
    resources = QpResources(
        pv=pv,
        lib=cast(LibVerbs, FakeLibVerbs(hca)),
        handles=handles,
        ctx=ctx,
        ctx_handle=handles.context(ctx),
        pd=pv.pd.PD(ctx),
        port_num=1,
    )
    return HwUdQp(resources, pkey_index=2, recv_depth=recv_depth)


async def wait_for(predicate: Any) -> None:
    with trio.fail_after(2):
        while not predicate():
            await trio.sleep(0.001)


@pytest.mark.trio
async def test_creation_posts_every_296_byte_buffer_and_uses_the_acm_qkey() -> None:
    hca = FakeHca()
    qp = open_qp(hca, recv_depth=4)
    assert hca.qp is not None and hca.cq is not None and hca.mr is not None
    assert qp.qpn == 0x48
    state = hca.qp.qp_attr
    assert (state.qkey, state.pkey_index, state.port_num, state.sq_psn) == (ACM_QKEY, 2, 1, 0)
    init = hca.qp.init_attr
    assert init.scq is hca.cq and init.rcq is hca.cq and init.sq_sig_all == 1
    assert (init.cap.max_recv_wr, init.cap.max_send_wr) == (4, SEND_DEPTH)
    assert hca.cq.cqe == 4 + SEND_DEPTH and hca.cq.armed
    posted = [(wr.wr_id, wr.sg[0].addr - hca.mr.buf, wr.sg[0].length) for wr in hca.qp.recvs]
    assert posted == [(0, 0, 296), (1, 296, 296), (2, 592, 296), (3, 888, 296)]
    await qp.aclose()


@pytest.mark.trio
async def test_send_carries_a_grh_and_returns_at_its_completion() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    av = AddressVector(dlid=0xC001, dgid=MGID, sl=1, hop_limit=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(qp.send, MAD, av, MULTICAST_QPN)
        await wait_for(lambda: hca.qp is not None and hca.qp.sends)
        assert hca.qp is not None and hca.mr is not None
        wr = hca.qp.sends[0]
        assert wr.ud is not None
        ah, remote_qpn, qkey = wr.ud
        assert (remote_qpn, qkey) == (MULTICAST_QPN, ACM_QKEY)
        assert ah.attr.is_global == 1 and ah.attr.dlid == 0xC001
        assert ah.attr.gr.dgid == "ff15:4001:ffff:0003:0400:0000:0000:0000"
        offset = wr.sg[0].addr - hca.mr.buf
        assert wr.sg[0].length == 256 and hca.mr.read(256, offset) == MAD
        hca.complete(wr.wr_id)
    # The same destination reuses its address handle.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(qp.send, MAD, av, MULTICAST_QPN)
        await wait_for(lambda: hca.qp is not None and len(hca.qp.sends) == 2)
        assert hca.qp is not None
        hca.complete(hca.qp.sends[1].wr_id)
    assert len(hca.ahs) == 1
    await qp.aclose()


@pytest.mark.trio
async def test_a_send_completion_error_is_reported() -> None:
    hca = FakeHca()
    qp = open_qp(hca)

    async def fail_it() -> None:
        await wait_for(lambda: hca.qp is not None and hca.qp.sends)
        assert hca.qp is not None
        hca.complete(hca.qp.sends[0].wr_id, status=ENUMS.IBV_WC_GENERAL_ERR)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fail_it)
        with pytest.raises(FabricError, match="send completion error: status 4"):
            await qp.send(MAD, AddressVector(dlid=5, dgid=PEER_GID), 0x60)
    with pytest.raises(FabricError, match="a MAD is 256 bytes"):
        await qp.send(MAD[:100], AddressVector(dlid=5), 0x60)
    await qp.aclose()


@pytest.mark.trio
async def test_receive_takes_the_source_from_the_grh_and_reposts_the_buffer() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    grh = bytes(8) + PEER_GID + MGID
    hca.deliver(2, grh, MAD, slid=9, src_qp=0x77, pkey_index=1)
    received = await qp.receive()
    assert received.mad == MAD
    assert (received.sgid, received.dgid) == (PEER_GID, MGID)
    assert (received.slid, received.src_qp, received.pkey_index) == (9, 0x77, 1)
    assert hca.qp is not None
    assert [wr.wr_id for wr in hca.qp.recvs[4:]] == [2]  # slot 2 went back to the HCA
    assert hca.cq is not None and hca.cq.acked == 1 and hca.cq.armed
    await qp.aclose()


@pytest.mark.trio
async def test_receive_many_takes_every_polled_mad_up_to_the_limit() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    for slot, slid in ((0, 4), (1, 5), (2, 6)):
        hca.deliver(slot, bytes(8) + PEER_GID + bytes(16), MAD, slid=slid, src_qp=1)
    assert [got.slid for got in await qp.receive_many(2)] == [4, 5]
    assert [got.slid for got in await qp.receive_many(8)] == [6]
    assert hca.qp is not None
    assert sorted(wr.wr_id for wr in hca.qp.recvs[4:]) == [0, 1, 2]
    await qp.aclose()


@pytest.mark.trio
async def test_error_completions_still_repost_their_buffer() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    hca.complete(1, status=ENUMS.IBV_WC_GENERAL_ERR)
    hca.deliver(3, bytes(8) + PEER_GID + bytes(16), MAD, slid=4, src_qp=1)
    received = await qp.receive()
    assert received.slid == 4
    assert hca.qp is not None
    assert [wr.wr_id for wr in hca.qp.recvs[4:]] == [1, 3]
    await qp.aclose()


@pytest.mark.trio
async def test_a_waiting_receiver_also_completes_sends() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    got: list[bytes] = []

    async def receiver() -> None:
        got.append((await qp.receive()).sgid)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        await trio.sleep(0.01)  # the receiver now polls the completion channel
        nursery.start_soon(qp.send, MAD, AddressVector(dlid=5, dgid=PEER_GID), 0x60)
        await wait_for(lambda: hca.qp is not None and hca.qp.sends)
        assert hca.qp is not None
        hca.complete(hca.qp.sends[0].wr_id)
        await trio.sleep(0.01)
        hca.deliver(0, bytes(8) + PEER_GID + bytes(16), MAD)
    assert got == [PEER_GID]
    await qp.aclose()


@pytest.mark.trio
async def test_a_cancelled_send_gets_its_slot_back_at_the_completion() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    with trio.move_on_after(0.02):
        await qp.send(MAD, AddressVector(dlid=5, dgid=PEER_GID), 0x60)
    assert qp._send_credits.value == SEND_DEPTH - 1
    assert hca.qp is not None
    hca.complete(hca.qp.sends[0].wr_id)
    hca.deliver(0, bytes(40), MAD)
    await qp.receive()  # drives the CQ
    assert qp._send_credits.value == SEND_DEPTH
    assert hca.qp.sends[0].wr_id == SEND_WR_BASE + SEND_DEPTH - 1
    await qp.aclose()


@pytest.mark.trio
async def test_multicast_attach_and_detach_go_to_libibverbs() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    await qp.attach_mcast(MGID, 0xC001)
    await qp.detach_mcast(MGID, 0xC001)
    assert hca.attached == [("attach", 0xABC, MGID, 0xC001), ("detach", 0xABC, MGID, 0xC001)]
    await qp.aclose()


@pytest.mark.trio
async def test_close_wakes_a_blocked_receiver_and_tears_down_in_order() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    async with trio.open_nursery() as nursery:

        async def blocked() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await qp.receive()

        nursery.start_soon(blocked)
        await trio.sleep(0.01)
        await qp.aclose()
    assert hca.closed == ["QP", "MR", "CQ", "CompChannel"]
    with pytest.raises(trio.ClosedResourceError):
        await qp.send(MAD, AddressVector(dlid=5), 0x60)
    await qp.aclose()  # idempotent


def test_a_failed_creation_releases_what_was_created() -> None:
    hca = FakeHca()
    hca.fail_qp = True
    with pytest.raises(FabricError, match="cannot create the UD QP on port 1: Failed to create QP"):
        open_qp(hca)
    assert hca.closed == ["MR", "CQ", "CompChannel"]

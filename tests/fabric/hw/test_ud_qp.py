"""The UD QP's completion handling, on a fake HCA (the real calls need hardware).

What a user of the QP would notice: sends return at their completion and report errors;
posts return at once and get their slot back at the completion (errors counted); ``serve``
hands received MADs to its handler from whichever task read them; received MADs come with the
GRH source; every buffer is re-posted (also after an error, C defect 46); closing wakes a
blocked receiver; multicast attach reaches libibverbs.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
import structlog
import trio

from ibacm.fabric.api import (
    ACM_QKEY,
    MULTICAST_QPN,
    AddressVector,
    FabricError,
    ReceivedMad,
    SendQueueFull,
)
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
    assert hca.qp.recvs[4] is hca.qp.recvs[2]  # the same work request, posted again
    assert hca.cq is not None and hca.cq.acked == 1 and hca.cq.armed
    await qp.aclose()


@pytest.mark.trio
async def test_every_cq_event_is_acknowledged_at_once_and_work_requests_are_reused() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    assert hca.cq is not None and hca.qp is not None
    for n in range(10):  # one event each: every MAD is read before the next arrives
        hca.deliver(n % 4, bytes(40), MAD, slid=n)
        assert (await qp.receive()).slid == n
        # A CQ destroyed with an event unacknowledged (its context closed first) would hang.
        assert hca.cq.acked == hca.cq.events == n + 1
    # Every work request was built once and posted again and again.
    assert len({id(wr) for wr in hca.qp.recvs}) == 4
    await qp.aclose()
    assert hca.cq.unacked_at_close == 0


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


# -- post and serve (issue 28) ----------------------------------------------------------------

PEER = AddressVector(dlid=5, dgid=PEER_GID)


def numbered(n: int) -> bytes:
    return MAD[:8] + n.to_bytes(8, "big") + MAD[16:]


@pytest.mark.trio
async def test_posts_fill_the_send_queue_and_get_their_slots_back_at_the_completions() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    assert hca.qp is not None and hca.mr is not None
    for n in range(SEND_DEPTH):
        qp.post(numbered(n), PEER, 0x60)  # no await: each is on the wire when post returns
    sends = list(hca.qp.sends)
    assert len(sends) == SEND_DEPTH
    assert [hca.mr.read(256, wr.sg[0].addr - hca.mr.buf) for wr in sends] == [
        numbered(n) for n in range(SEND_DEPTH)
    ]
    with pytest.raises(SendQueueFull, match=f"all {SEND_DEPTH} send slots are in flight"):
        qp.post(MAD, PEER, 0x60)
    assert len(hca.qp.sends) == SEND_DEPTH  # the refused one never reached the HCA
    async with trio.open_nursery() as nursery:
        nursery.start_soon(qp.serve, lambda batch: None)
        for wr in sends:
            hca.complete(wr.wr_id)
        await wait_for(lambda: qp._send_credits.value == SEND_DEPTH)
        assert sorted(qp._free_slots) == list(range(SEND_DEPTH))
        qp.post(MAD, PEER, 0x60)  # the queue has room again
        # A send waiting for a slot gets the next one a post gives back, not a later post.
        for _ in range(SEND_DEPTH - 1):
            qp.post(MAD, PEER, 0x60)
        waiter = trio.Event()

        async def send_when_a_slot_frees() -> None:
            await qp.send(numbered(99), PEER, 0x60)
            waiter.set()

        nursery.start_soon(send_when_a_slot_frees)
        await trio.sleep(0.01)
        assert len(hca.qp.sends) == 2 * SEND_DEPTH  # the send waits for a slot
        hca.complete(hca.qp.sends[SEND_DEPTH].wr_id)
        await wait_for(lambda: hca.qp is not None and len(hca.qp.sends) == 2 * SEND_DEPTH + 1)
        with pytest.raises(SendQueueFull):
            qp.post(MAD, PEER, 0x60)  # the freed slot went to the waiting send
        hca.complete(hca.qp.sends[-1].wr_id)
        with trio.fail_after(2):
            await waiter.wait()
        for wr in hca.qp.sends[SEND_DEPTH + 1 : 2 * SEND_DEPTH]:
            hca.complete(wr.wr_id)
        await wait_for(lambda: qp._send_credits.value == SEND_DEPTH)
        assert sorted(qp._free_slots) == list(range(SEND_DEPTH))
        assert qp.completion_errors == 0
        await qp.aclose()


@pytest.mark.trio
async def test_a_post_completion_error_is_counted_and_does_not_wedge_the_qp() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    gate = logging.getLogger("ibacm.fabric.hw.qp")
    level = gate.level
    gate.setLevel(logging.DEBUG)
    got: list[ReceivedMad] = []
    try:
        with structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(qp.serve, got.extend)
                qp.post(MAD, PEER, 0x60)
                assert hca.qp is not None
                hca.complete(hca.qp.sends[0].wr_id, status=ENUMS.IBV_WC_GENERAL_ERR)
                await wait_for(lambda: qp.completion_errors == 1)
                assert qp._send_credits.value == SEND_DEPTH
                # The QP goes on: the next post completes and a MAD still arrives.
                qp.post(MAD, PEER, 0x60)
                hca.complete(hca.qp.sends[1].wr_id)
                hca.deliver(0, bytes(8) + PEER_GID + bytes(16), MAD, slid=7, src_qp=1)
                await wait_for(lambda: got)
                assert qp._send_credits.value == SEND_DEPTH and qp.completion_errors == 1
                await qp.aclose()
    finally:
        gate.setLevel(level)
    assert [got_mad.slid for got_mad in got] == [7]
    errors = [e for e in logs if e["event"] == "send completion error"]
    assert [(e["log_level"], e["status"]) for e in errors] == [("debug", ENUMS.IBV_WC_GENERAL_ERR)]


@pytest.mark.trio
async def test_a_post_the_hca_refuses_is_a_fabric_error_and_frees_its_slot() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    hca.fail_send = True
    with pytest.raises(FabricError, match="cannot post a send on UD QP 0x48: Failed to post send"):
        qp.post(MAD, PEER, 0x60)
    with pytest.raises(FabricError, match="a MAD is 256 bytes"):
        qp.post(MAD[:100], PEER, 0x60)
    assert qp._send_credits.value == SEND_DEPTH and len(qp._free_slots) == SEND_DEPTH
    hca.fail_send = False
    for _ in range(SEND_DEPTH):
        qp.post(MAD, PEER, 0x60)  # every slot is still there
    with pytest.raises(SendQueueFull):
        qp.post(MAD, PEER, 0x60)
    await qp.aclose()


@pytest.mark.trio
async def test_posts_still_in_flight_at_close_neither_leak_nor_crash() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    for _ in range(3):
        qp.post(MAD, PEER, 0x60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(qp.serve, lambda batch: None)
        await trio.sleep(0.01)
        await qp.aclose()  # no completion ever came for them
    # The address handle the posts use goes after the QP that still holds them.
    assert hca.closed == ["QP", "MR", "CQ", "CompChannel", "AH"]
    assert qp._sends == {}
    with pytest.raises(FabricError, match="UD QP 0x48 is closed"):
        qp.post(MAD, PEER, 0x60)


@pytest.mark.trio
async def test_serve_hands_each_poll_to_the_handler_queued_mads_first() -> None:
    hca = FakeHca()
    qp = open_qp(hca, recv_depth=8)
    grh = bytes(8) + PEER_GID + bytes(16)
    hca.deliver(0, grh, MAD, slid=1, src_qp=1)
    assert (await qp.receive()).slid == 1
    hca.deliver(1, grh, MAD, slid=2, src_qp=1)
    hca.deliver(2, grh, MAD, slid=3, src_qp=1)
    assert [m.slid for m in await qp.receive_many(1)] == [2]  # slid 3 stays queued
    calls: list[list[int]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(qp.serve, lambda batch: calls.append([m.slid for m in batch]), 2)
        await wait_for(lambda: calls)
        assert calls == [[3]]  # what was queued before serve started comes first
        for slot, slid in ((3, 4), (4, 5), (5, 6)):  # one poll, cut to the limit of 2
            hca.deliver(slot, grh, MAD, slid=slid, src_qp=1)
        await wait_for(lambda: len(calls) == 3)
        with pytest.raises(trio.BusyResourceError):
            await qp.serve(lambda batch: None)  # one handler at a time
        await qp.aclose()  # serve returns: the nursery closes
    assert calls == [[3], [4, 5], [6]]
    assert qp._handler is None


@pytest.mark.trio
async def test_the_task_that_reads_a_mad_runs_the_handler_and_its_reply_is_posted_then() -> None:
    """Whichever task drives the CQ (here a send waiting for its completion) hands the MAD
    to the serve handler in the round that read it, and the handler's post goes out before
    that task yields: no wake-up of the serving task between the MAD in and the reply."""
    hca = FakeHca()
    qp = open_qp(hca)
    ran_in: list[Any] = []
    sender_task: list[Any] = []

    def answer(batch: list[ReceivedMad]) -> None:
        ran_in.append(trio.lowlevel.current_task())
        for got in batch:
            qp.post(numbered(got.slid), AddressVector(dlid=got.slid, dgid=got.sgid), got.src_qp)

    async def sender() -> None:
        sender_task.append(trio.lowlevel.current_task())
        await qp.send(MAD, PEER, 0x60)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.sleep(0.01)  # the sender now drives the CQ
        nursery.start_soon(qp.serve, answer)
        await trio.sleep(0.01)
        assert hca.qp is not None
        hca.deliver(0, bytes(8) + PEER_GID + bytes(16), MAD, slid=9, src_qp=0x77)
        hca.complete(hca.qp.sends[0].wr_id)  # the same poll completes the send
        await wait_for(lambda: hca.qp is not None and len(hca.qp.sends) == 2)
        assert ran_in == sender_task
        reply = hca.qp.sends[1]
        assert reply.ud is not None and reply.ud[1] == 0x77
        assert hca.mr is not None and hca.mr.read(256, reply.sg[0].addr - hca.mr.buf) == numbered(9)
        await qp.aclose()


@pytest.mark.trio
async def test_a_handler_that_raises_is_logged_and_the_next_mads_still_arrive() -> None:
    hca = FakeHca()
    qp = open_qp(hca)
    grh = bytes(8) + PEER_GID + bytes(16)
    seen: list[int] = []

    def handler(batch: list[ReceivedMad]) -> None:
        seen.extend(m.slid for m in batch)
        if batch[0].slid == 1:
            raise ValueError("a bad MAD")

    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(qp.serve, handler)
            hca.deliver(0, grh, MAD, slid=1, src_qp=1)
            await wait_for(lambda: seen == [1])
            hca.deliver(1, grh, MAD, slid=2, src_qp=1)
            await wait_for(lambda: seen == [1, 2])
            await qp.aclose()
    failures = [e for e in logs if e["event"] == "received MADs could not be handled; dropped"]
    assert [(e["log_level"], e["mads"]) for e in failures] == [("error", 1)]
    assert hca.qp is not None
    assert [wr.wr_id for wr in hca.qp.recvs[4:]] == [0, 1]  # both buffers went back

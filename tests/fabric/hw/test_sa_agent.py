"""The umad SA agent: TID matching, timeouts, send failures, RMPP, closing.

The fake umad behaves like the kernel where it matters (upper TID bits rewritten, ETIMEDOUT
returns), so these run on trio's real clock with short timeouts. Every test runs twice: with
a descriptor to poll (a kernel umad device, the emulated HCA) and without (ibsim's preload:
a blocking receive with a timeout in a worker thread).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import trio

from ibacm.fabric.api import ACM_QKEY, SaCall, SaDestination, SaSendError, SaTimeout
from ibacm.fabric.hw.sa_agent import SaAgent
from ibacm.fabric.hw.umad import UmadPacket
from ibacm.wire.mad import (
    Method,
    MgmtClass,
    RmppFlag,
    RmppType,
    SaAttr,
    SaHeader,
    SaMad,
    build_path_get,
    build_path_get_table,
    build_sa_response,
    split_rmpp,
)
from ibacm.wire.notice import Notice, Trap, build_report, build_report_resp, decode_report
from ibacm.wire.path_record import PathRecord
from tests.fabric.hw.fake_umad import FakeUmad, SentMad

DEST = SaDestination(sm_lid=1, sm_sl=2, pkey_index=3)

MakeUmad = Callable[..., FakeUmad]


@pytest.fixture(params=["polled", "threaded"])
def fake_umad(request: pytest.FixtureRequest) -> Iterator[MakeUmad]:
    made: list[FakeUmad] = []

    def make(**kwargs: Any) -> FakeUmad:
        umad = FakeUmad(pollable=request.param == "polled", **kwargs)
        made.append(umad)
        return umad

    yield make
    for umad in made:
        umad.release()


def answer_with_dlid(umad: FakeUmad, sent: SentMad) -> None:
    """An SA that answers a PathRecord GET with the requested DLID and SLID 9."""
    request = SaMad.decode(sent.mad)
    path = PathRecord.decode(request.data[:64])
    path.slid = 9
    umad.deliver(build_sa_response(request, 0, path.encode()))


async def open_agent(umad: FakeUmad, **kwargs: int) -> SaAgent:
    agent = SaAgent(umad, "mlx5_0", 1, poll_ms=10, **kwargs)
    agent.open()
    return agent


def path_get(tid: int, dlid: int) -> bytes:
    return build_path_get(tid, PathRecord(dlid=dlid))


@pytest.mark.trio
async def test_reply_matched_on_low_tid_bits_and_sent_like_c(fake_umad: MakeUmad) -> None:
    umad = fake_umad(responder=answer_with_dlid)
    agent = await open_agent(umad)
    reply = await agent.request(path_get(0x1234, 5), DEST, timeout_ms=500, retries=2)
    decoded = SaMad.decode(reply)
    assert decoded.mad.tid == 0x5A5A0007_00001234  # upper bits as rewritten by the "kernel"
    assert decoded.mad.method == Method.GET_RESP
    assert PathRecord.decode(decoded.data[:64]).dlid == 5
    sent = umad.sent[0]
    assert (sent.timeout_ms, sent.retries) == (500, 2)
    assert (sent.addr.dlid, sent.addr.dqpn, sent.addr.sl, sent.addr.qkey) == (1, 1, 2, ACM_QKEY)
    assert sent.addr.pkey_index == 3
    # Class 0x03, SA class version 2 (C registers version 1, defect 41), kernel RMPP.
    assert umad.registered == [(1024, MgmtClass.SUBN_ADM, 2, 1)]
    await agent.aclose()


@pytest.mark.trio
async def test_concurrent_requests_each_get_their_own_reply_in_any_order(
    fake_umad: MakeUmad,
) -> None:
    umad = fake_umad()
    agent = await open_agent(umad)
    results: dict[int, int] = {}

    async def ask(tid: int, dlid: int) -> None:
        reply = await agent.request(path_get(tid, dlid), DEST, timeout_ms=1000, retries=0)
        results[tid] = PathRecord.decode(SaMad.decode(reply).data[:64]).dlid

    async with trio.open_nursery() as nursery:
        for tid in range(1, 6):
            nursery.start_soon(ask, tid, 100 + tid)
        while len(umad.sent) < 5:
            await trio.sleep(0.005)
        for sent in reversed(umad.sent):  # answers arrive in reverse order
            answer_with_dlid(umad, sent)
    assert results == {tid: 100 + tid for tid in range(1, 6)}
    assert agent.outstanding == 0
    await agent.aclose()


@pytest.mark.trio
async def test_unmatched_and_late_replies_are_dropped_and_counted(fake_umad: MakeUmad) -> None:
    umad = fake_umad()
    agent = await open_agent(umad)
    stray = build_sa_response(SaMad.decode(path_get(0x77, 1)), 0, bytes(64))
    umad.deliver(stray)

    async def answer_later() -> None:
        while not umad.sent:
            await trio.sleep(0.005)
        answer_with_dlid(umad, umad.sent[0])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_later)
        reply = await agent.request(path_get(0x78, 4), DEST, timeout_ms=1000, retries=0)
    assert SaMad.decode(reply).mad.tid & 0xFFFFFFFF == 0x78
    assert agent.unmatched == 1
    await agent.aclose()


@pytest.mark.trio
async def test_kernel_timeout_status_raises_sa_timeout_at_once(fake_umad: MakeUmad) -> None:
    umad = fake_umad(responder=lambda fake, sent: fake.time_out(sent))
    agent = await open_agent(umad)
    start = trio.current_time()
    with pytest.raises(SaTimeout, match="ETIMEDOUT"):
        await agent.request(path_get(9, 1), DEST, timeout_ms=2000, retries=2)
    assert trio.current_time() - start < 1.0
    await agent.aclose()


@pytest.mark.trio
async def test_no_answer_at_all_times_out_after_all_attempts_plus_grace(
    fake_umad: MakeUmad,
) -> None:
    umad = fake_umad()
    agent = await open_agent(umad, grace_ms=20)
    start = trio.current_time()
    with pytest.raises(SaTimeout, match="no SA reply for TID 0x0000000a in 80 ms"):
        await agent.request(path_get(10, 1), DEST, timeout_ms=30, retries=1)
    elapsed = trio.current_time() - start
    assert 0.08 <= elapsed < 0.5
    assert agent.outstanding == 0
    await agent.aclose()


@pytest.mark.trio
async def test_other_umad_status_is_a_send_error(fake_umad: MakeUmad) -> None:
    umad = fake_umad(responder=lambda fake, sent: fake.deliver(sent.mad, status=errno.EIO))
    agent = await open_agent(umad)
    with pytest.raises(SaSendError, match="umad status EIO"):
        await agent.request(path_get(11, 1), DEST, timeout_ms=500, retries=0)
    await agent.aclose()


@pytest.mark.trio
async def test_send_failure_and_bad_requests_raise_send_error(fake_umad: MakeUmad) -> None:
    umad = fake_umad(fail_send=True)
    agent = await open_agent(umad)
    with pytest.raises(SaSendError, match="umad_send failed"):
        await agent.request(path_get(12, 1), DEST, timeout_ms=500, retries=0)
    assert agent.outstanding == 0
    with pytest.raises(SaSendError, match="256 bytes, got 10"):
        await agent.request(bytes(10), DEST, timeout_ms=500, retries=0)
    with pytest.raises(SaSendError, match="bad umad timing"):
        await agent.request(path_get(13, 1), DEST, timeout_ms=0, retries=0)
    await agent.aclose()


@pytest.mark.trio
async def test_a_tid_cannot_be_outstanding_twice(fake_umad: MakeUmad) -> None:
    umad = fake_umad()
    agent = await open_agent(umad)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(agent.request, path_get(14, 1), DEST, timeout_ms=1000, retries=0)
        )
        while not umad.sent:
            await trio.sleep(0.005)
        with pytest.raises(SaSendError, match="already outstanding"):
            await agent.request(path_get(14, 2), DEST, timeout_ms=1000, retries=0)
        answer_with_dlid(umad, umad.sent[0])
    await agent.aclose()


@pytest.mark.trio
async def test_short_replies_from_the_simulator_are_padded_to_a_full_mad(
    fake_umad: MakeUmad,
) -> None:
    def short(fake: FakeUmad, sent: SentMad) -> None:
        request = SaMad.decode(sent.mad)
        fake.deliver(build_sa_response(request, 0x0300, bytes(64))[:120])

    agent = await open_agent(fake_umad(responder=short))
    reply = await agent.request(path_get(15, 99), DEST, timeout_ms=500, retries=0)
    assert len(reply) == 256
    assert SaMad.decode(reply).sa_status == 3  # "no records"
    await agent.aclose()


def table_in_segments(paths: list[bytes]) -> Callable[[FakeUmad, SentMad], None]:
    """A responder answering a GetTable with ``paths`` in RMPP segments (ACKs unanswered)."""

    def table(fake: FakeUmad, sent: SentMad) -> None:
        if SaMad.decode(sent.mad).mad.method != Method.GET_TABLE:
            return  # an RMPP ACK
        whole = build_sa_response(SaMad.decode(sent.mad), 0, b"".join(paths))
        for segment in split_rmpp(whole):
            fake.deliver(segment)

    return table


@pytest.mark.trio
async def test_rmpp_segments_are_acknowledged_and_reassembled(fake_umad: MakeUmad) -> None:
    paths = [PathRecord(dlid=lid, slid=1, pkey=0xFFFF).encode() for lid in range(2, 12)]
    umad = fake_umad(responder=table_in_segments(paths))
    agent = await open_agent(umad)
    request = build_path_get_table(0x99, PathRecord(slid=1), comp_mask=0x20)
    reply = SaMad.decode(await agent.request(request, DEST, timeout_ms=500, retries=0))
    assert reply.mad.method == Method.GET_TABLE_RESP
    assert reply.mad.attr_id == SaAttr.PATH_RECORD
    assert [PathRecord.decode(r).dlid for r in reply.records(64)] == list(range(2, 12))
    acks = [SaHeader.decode(sent.mad) for sent in umad.sent[1:]]
    assert [ack.seg_num for ack in acks] == [1, 2, 3, 4]  # 640 bytes = 4 segments
    assert all(ack.rmpp_type == RmppType.ACK and ack.rmpp_flags & RmppFlag.ACTIVE for ack in acks)
    assert all(sent.timeout_ms == 0 and sent.addr.dlid == 1 for sent in umad.sent[1:])
    await agent.aclose()


@pytest.mark.trio
async def test_a_bad_rmpp_sequence_fails_the_request_clearly(fake_umad: MakeUmad) -> None:
    def out_of_order(fake: FakeUmad, sent: SentMad) -> None:
        if SaMad.decode(sent.mad).mad.method != Method.GET_TABLE:
            return
        whole = build_sa_response(SaMad.decode(sent.mad), 0, bytes(64 * 8))
        _first, second, *_ = split_rmpp(whole)
        fake.deliver(second)

    agent = await open_agent(fake_umad(responder=out_of_order))
    request = build_path_get_table(0x9A, PathRecord(slid=1), comp_mask=0x20)
    with pytest.raises(SaSendError, match=r"bad RMPP reply.*segment 2 arrived, expected 1"):
        await agent.request(request, DEST, timeout_ms=500, retries=0)
    await agent.aclose()


@pytest.mark.trio
async def test_cancelled_request_does_not_lose_another_requests_reply(fake_umad: MakeUmad) -> None:
    umad = fake_umad()
    agent = await open_agent(umad)
    got: list[int] = []

    async def patient() -> None:
        reply = await agent.request(path_get(21, 7), DEST, timeout_ms=2000, retries=0)
        got.append(PathRecord.decode(SaMad.decode(reply).data[:64]).dlid)

    async with trio.open_nursery() as nursery:
        with trio.move_on_after(0.05):
            await agent.request(path_get(20, 6), DEST, timeout_ms=2000, retries=0)
        nursery.start_soon(patient)
        while len(umad.sent) < 2:
            await trio.sleep(0.005)
        answer_with_dlid(umad, umad.sent[1])
    assert got == [7]
    await agent.aclose()


@pytest.mark.trio
async def test_close_fails_waiters_and_later_requests_and_releases_the_port(
    fake_umad: MakeUmad,
) -> None:
    umad = fake_umad()
    agent = await open_agent(umad)
    failures: list[str] = []

    async def waiting() -> None:
        try:
            await agent.request(path_get(30, 1), DEST, timeout_ms=5000, retries=0)
        except SaSendError as exc:
            failures.append(str(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting)
        while not umad.sent:
            await trio.sleep(0.005)
        await agent.aclose()
    assert failures == ["SA agent of mlx5_0 closed"]
    assert umad.closed == [1024] and umad.unregistered == [(1024, 7)]
    with pytest.raises(SaSendError, match="closed"):
        await agent.request(path_get(31, 1), DEST, timeout_ms=500, retries=0)


@pytest.mark.trio
async def test_a_polled_port_is_read_only_when_a_packet_is_queued() -> None:
    umad = FakeUmad(pollable=True)
    agent = await open_agent(umad)
    replies: list[bytes] = []

    async def ask() -> None:
        replies.append(await agent.request(path_get(1, 5), DEST, timeout_ms=2000, retries=0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await trio.sleep(0.2)
        assert umad.recv_calls == 0  # nothing queued: no read, and no worker thread blocked
        answer_with_dlid(umad, umad.sent[0])
    assert umad.recv_calls == 1
    assert PathRecord.decode(SaMad.decode(replies[0]).data[:64]).dlid == 5
    await agent.aclose()
    umad.release()


@pytest.mark.trio
async def test_reports_arrive_beside_replies_and_are_acked_as_they_are(
    fake_umad: MakeUmad,
) -> None:
    umad = fake_umad(responder=answer_with_dlid)
    agent = await open_agent(umad)
    assert umad.methods == (Method.REPORT,)  # the mask that makes the kernel hand us Reports
    gid = bytes.fromhex("fe800000000000000002c90300000007")
    notice = Notice.gid_trap(Trap.GID_OUT_OF_SERVICE, gid, issuer_lid=1, issuer_gid=gid)
    umad.deliver(build_report(0xABCD, notice))
    # A request waiting meanwhile still gets its reply; the Report waits for its reader.
    reply = await agent.request(path_get(5, 6), DEST, timeout_ms=500, retries=0)
    assert PathRecord.decode(SaMad.decode(reply).data[:64]).dlid == 6
    with trio.fail_after(2):
        report, decoded = decode_report(await agent.report())
    assert decoded.subject_gid == gid and report.mad.tid == 0xABCD
    agent.post(build_report_resp(report), DEST)
    ack = umad.sent[-1]
    assert (ack.timeout_ms, ack.retries, ack.addr.dlid) == (0, 0, DEST.sm_lid)
    assert SaMad.decode(ack.mad).mad.method == Method.REPORT_RESP
    assert ack.mad[12:16] == (0xABCD).to_bytes(4, "big")
    await agent.aclose()
    with pytest.raises(SaSendError):
        await agent.report()


# -- started calls (Port.sa_start): ended in the round that reads the reply ------------------


class StepCounter(trio.abc.Instrument):
    """Counts task steps: two things in the same step happened with no scheduler pass."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


@pytest.mark.trio
async def test_a_started_call_ends_in_the_round_that_reads_its_reply(
    fake_umad: MakeUmad,
) -> None:
    umad = fake_umad()
    agent = await open_agent(umad)
    counter = StepCounter()
    read_in_step: list[int] = []
    recv = umad.recv

    def counting_recv(portid: int, timeout_ms: int) -> UmadPacket | None:
        packet = recv(portid, timeout_ms)
        if packet is not None:
            read_in_step.append(counter.steps)
        return packet

    umad.recv = counting_recv  # type: ignore[method-assign]
    order: list[str] = []
    ended: list[tuple[int, trio.lowlevel.Task]] = []
    readers: list[trio.lowlevel.Task] = []
    lone = agent.start(path_get(40, 8), DEST, timeout_ms=2000, retries=0)  # nobody waits on it
    waited = agent.start(path_get(41, 9), DEST, timeout_ms=2000, retries=0)
    assert agent.outstanding == 2 and [_tid(s.mad) for s in umad.sent] == [40, 41]

    def on_end(call: SaCall) -> None:
        order.append(f"ended {_tid(call.result())}")
        ended.append((counter.steps, trio.lowlevel.current_task()))

    lone.when_ended(on_end)
    waited.when_ended(on_end)
    trio.lowlevel.add_instrument(counter)
    try:
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                readers.append(trio.lowlevel.current_task())
                reply = await waited.wait()
                order.append(f"resumed {_tid(reply)}")

            nursery.start_soon(waiter)
            await trio.sleep(0.05)
            assert not lone.ended and not waited.ended
            answer_with_dlid(umad, umad.sent[0])
            answer_with_dlid(umad, umad.sent[1])
    finally:
        trio.lowlevel.remove_instrument(counter)
    # The waiting task read both replies; the lone call ended as its reply was read.
    assert order == ["ended 40", "ended 41", "resumed 41"]
    assert [task for _, task in ended] == readers * 2
    if agent.polled:
        assert [step for step, _ in ended] == read_in_step  # no scheduler pass in between
    assert PathRecord.decode(SaMad.decode(lone.result()).data[:64]).dlid == 8
    assert agent.outstanding == 0
    await agent.aclose()


def _tid(mad: bytes) -> int:
    return int.from_bytes(mad[12:16], "big")


@pytest.mark.trio
async def test_a_kernel_timeout_ends_a_started_call_with_sa_timeout(fake_umad: MakeUmad) -> None:
    umad = fake_umad(responder=lambda fake, sent: fake.time_out(sent))
    agent = await open_agent(umad)
    call = agent.start(path_get(42, 1), DEST, timeout_ms=2000, retries=2)
    errors: list[BaseException | None] = []
    call.when_ended(lambda ended: errors.append(ended.error))
    start = trio.current_time()
    with pytest.raises(SaTimeout, match="ETIMEDOUT"):
        await call.wait()
    assert trio.current_time() - start < 1.0  # the kernel's word, not the 6 s deadline
    assert len(errors) == 1 and isinstance(errors[0], SaTimeout)
    assert agent.outstanding == 0
    await agent.aclose()


@pytest.mark.trio
async def test_the_grace_deadline_counts_from_the_send(fake_umad: MakeUmad) -> None:
    umad = fake_umad()
    agent = await open_agent(umad, grace_ms=50)
    call = agent.start(path_get(43, 1), DEST, timeout_ms=100, retries=1)
    await trio.sleep(0.3)  # past timeout x (retries + 1) + grace = 250 ms before anyone waits
    assert not call.ended  # nobody drives it: no reply came, nothing ended it
    waited_at = trio.current_time()
    with pytest.raises(SaTimeout, match="no SA reply for TID 0x0000002b in 250 ms"):
        await call.wait()
    assert trio.current_time() - waited_at < 0.25  # not a fresh 250 ms from the wait
    assert agent.outstanding == 0
    await agent.aclose()


@pytest.mark.trio
async def test_a_started_get_table_is_reassembled_before_it_ends(fake_umad: MakeUmad) -> None:
    paths = [PathRecord(dlid=lid, slid=1, pkey=0xFFFF).encode() for lid in range(2, 12)]
    umad = fake_umad(responder=table_in_segments(paths))
    agent = await open_agent(umad)
    request = build_path_get_table(0x9B, PathRecord(slid=1), comp_mask=0x20)
    call = agent.start(request, DEST, timeout_ms=500, retries=0)
    seen: list[bytes] = []
    call.when_ended(lambda ended: seen.append(ended.result()))
    reply = await call.wait()
    assert seen == [reply]
    assert [PathRecord.decode(r).dlid for r in SaMad.decode(reply).records(64)] == list(
        range(2, 12)
    )
    assert [SaHeader.decode(sent.mad).seg_num for sent in umad.sent[1:]] == [1, 2, 3, 4]
    await agent.aclose()


@pytest.mark.trio
async def test_a_cancelled_wait_leaves_no_transaction_behind(fake_umad: MakeUmad) -> None:
    umad = fake_umad()
    agent = await open_agent(umad)
    call = agent.start(path_get(44, 3), DEST, timeout_ms=2000, retries=0)
    with trio.move_on_after(0.05):
        await call.wait()
    assert isinstance(call.error, SaTimeout) and "abandoned" in str(call.error)
    assert agent.outstanding == 0
    # Its late reply, read by the next call's wait, is dropped as unmatched.
    answer_with_dlid(umad, umad.sent[0])
    other = agent.start(path_get(48, 4), DEST, timeout_ms=2000, retries=0)
    answer_with_dlid(umad, umad.sent[1])
    assert PathRecord.decode(SaMad.decode(await other.wait()).data[:64]).dlid == 4
    assert agent.unmatched == 1
    # Its TID can be used again.
    again = agent.start(path_get(44, 5), DEST, timeout_ms=2000, retries=0)
    answer_with_dlid(umad, umad.sent[2])
    assert PathRecord.decode(SaMad.decode(await again.wait()).data[:64]).dlid == 5
    assert agent.outstanding == 0
    await agent.aclose()


@pytest.mark.trio
async def test_start_refuses_what_request_refuses_and_close_ends_unwaited_calls(
    fake_umad: MakeUmad,
) -> None:
    agent = await open_agent(fake_umad(fail_send=True))
    with pytest.raises(SaSendError, match="umad_send failed"):
        agent.start(path_get(45, 1), DEST, timeout_ms=500, retries=0)
    assert agent.outstanding == 0
    with pytest.raises(SaSendError, match="bad umad timing"):
        agent.start(path_get(45, 1), DEST, timeout_ms=500, retries=-1)
    await agent.aclose()

    agent = await open_agent(fake_umad())
    call = agent.start(path_get(46, 1), DEST, timeout_ms=5000, retries=0)
    errors: list[str] = []
    call.when_ended(lambda ended: errors.append(str(ended.error)))
    await agent.aclose()
    assert errors == ["SA agent of mlx5_0 closed"]
    assert agent.outstanding == 0
    with pytest.raises(SaSendError, match="closed"):
        agent.start(path_get(47, 1), DEST, timeout_ms=500, retries=0)

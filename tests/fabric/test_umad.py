"""The simulated umad agent (ibacm.fabric.sim.umad): what the kernel MAD layer does for a
port's ``sa_start``: the TID's upper half is the agent's, a response matches on the lower half
and ends the call where it is delivered, retransmissions, timeouts, late transport errors,
Reports queued."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ibacm.fabric.api import MAD_SIZE, SaCall, SaSendError, SaTimeout
from ibacm.fabric.sim.umad import REPORT_QUEUE, UmadAgent
from ibacm.wire.mad import Method, SaAttr, SaMad, build_path_get, sa_mad
from ibacm.wire.path_record import PathRecord

AGENT = 0x00AB_CDEF


def request(tid: int) -> bytes:
    return build_path_get(tid, PathRecord(dlid=2, slid=1, numb_path=1))


def answer(to: bytes, method: int = Method.GET_RESP) -> bytes:
    decoded = SaMad.decode(to)
    return sa_mad(method, SaAttr.PATH_RECORD, decoded.mad.tid, 0, decoded.data)


@pytest.mark.trio
async def test_the_tid_carries_the_agent_and_the_answer_matches_its_low_half(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = UmadAgent(AGENT)
    sent: list[bytes] = []
    call = agent.start(request(0x1234_0000_0042), sent.append, timeout_ms=100, retries=2)
    # Sent before ``start`` returned; the call ends where its answer is delivered.
    assert len(sent) == 1 and not call.ended
    assert SaMad.decode(sent[0]).mad.tid == (AGENT << 32) | 0x42
    ended: list[bytes | None] = []
    call.when_ended(lambda c: ended.append(c.reply))
    agent.deliver(answer(sent[0]))
    assert call.ended and ended == [call.reply]
    assert call.reply is not None
    assert SaMad.decode(call.reply).mad.tid == (AGENT << 32) | 0x42  # as it came back
    assert await call.wait() == call.reply
    assert len(sent) == 1 and agent.outstanding == 0 and agent.unmatched == 0


@pytest.mark.trio
async def test_silence_is_retried_then_a_timeout(autojump_clock: trio.testing.MockClock) -> None:
    agent = UmadAgent(AGENT)
    sent: list[float] = []
    start = trio.current_time()
    call = agent.start(
        request(7), lambda mad: sent.append(trio.current_time()), timeout_ms=250, retries=2
    )
    with pytest.raises(SaTimeout, match=r"after 3 x 250 ms"):
        await call.wait()
    assert [round(at - start, 6) for at in sent] == [0.0, 0.25, 0.5]
    assert agent.outstanding == 0
    agent.deliver(answer(request(7)))  # too late: nobody waits for it
    assert agent.unmatched == 1


@pytest.mark.trio
async def test_a_late_transport_error_ends_its_own_call_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = UmadAgent(AGENT)
    sent: list[bytes] = []
    first = agent.start(request(1), sent.append, timeout_ms=250, retries=2)
    second = agent.start(request(2), sent.append, timeout_ms=250, retries=2)
    error = SaSendError("P_Key index 9 is not in the table")
    # Another agent's TID, or a low half nobody waits for, ends nothing.
    assert not agent.fail(((AGENT + 1) << 32) | 1, error)
    assert not agent.fail((AGENT << 32) | 3, error)
    assert agent.fail((AGENT << 32) | 1, error)
    assert first.error is error and not second.ended
    with pytest.raises(SaSendError, match="not in the table"):
        await first.wait()
    assert len(sent) == 2  # never sent again
    assert not agent.fail((AGENT << 32) | 1, error)  # ended already
    agent.deliver(answer(sent[1]))
    assert second.reply is not None and agent.outstanding == 0


@pytest.mark.trio
async def test_a_failed_retransmission_ends_the_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = UmadAgent(AGENT)
    sent: list[bytes] = []

    def transmit(mad: bytes) -> None:
        if sent:
            raise SaSendError("hub connection lost")
        sent.append(mad)

    call = agent.start(request(1), transmit, timeout_ms=100, retries=3)
    with pytest.raises(SaSendError, match="connection lost"):
        await call.wait()
    assert len(sent) == 1 and agent.outstanding == 0


@pytest.mark.trio
async def test_bad_requests_are_refused_before_anything_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = UmadAgent(AGENT)

    def transmit(mad: bytes) -> None:
        raise AssertionError("nothing may be sent")

    for mad, kwargs, message in [
        (bytes(MAD_SIZE - 1), {}, "must be 256 bytes"),
        (request(1), {"timeout_ms": 0}, "timeout_ms must be > 0"),
        (request(1), {"retries": -1}, "retries must be >= 0"),
    ]:
        args = {"timeout_ms": 100, "retries": 0, **kwargs}
        with pytest.raises(SaSendError, match=message):
            agent.start(mad, transmit, **args)
    call: SaCall = agent.start(request(1), lambda mad: None, timeout_ms=100, retries=0)
    with pytest.raises(SaSendError, match="already outstanding"):
        agent.start(request(1), transmit, timeout_ms=100, retries=0)
    # A transmit that fails at once leaves nothing outstanding.
    with pytest.raises(SaSendError, match="down"):
        agent.start(request(2), _refuse, timeout_ms=100, retries=0)
    assert agent.outstanding == 1
    with pytest.raises(SaTimeout):
        await call.wait()
    with pytest.raises(ValueError, match="32 bits"):
        UmadAgent(1 << 32)


def _refuse(mad: bytes) -> None:
    raise SaSendError("port down")


@pytest.mark.trio
async def test_reports_queue_and_the_oldest_go_first_when_full(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = UmadAgent(AGENT)
    reports = [
        sa_mad(Method.REPORT, SaAttr.NOTICE, n, 0, n.to_bytes(4, "big"))
        for n in range(REPORT_QUEUE + 3)
    ]
    for report in reports:
        agent.deliver(report)
    assert agent.reports_dropped == 3
    assert await agent.next_report() == reports[3]
    agent.deliver(b"short")  # a runt is counted, never queued nor matched
    assert agent.unmatched == 1

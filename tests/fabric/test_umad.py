"""The simulated umad agent (ibacm.fabric.sim.umad): what the kernel MAD layer does for a
port's ``sa_send``: the TID's upper half is the agent's, a response matches on the lower half,
retransmissions, timeouts, Reports queued."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ibacm.fabric.api import MAD_SIZE, SaSendError, SaTimeout
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

    async def transmit(mad: bytes) -> None:
        sent.append(mad)
        agent.deliver(answer(mad))

    reply = await agent.send(request(0x1234_0000_0042), transmit, timeout_ms=100, retries=2)
    assert len(sent) == 1
    assert SaMad.decode(sent[0]).mad.tid == (AGENT << 32) | 0x42
    assert SaMad.decode(reply).mad.tid == (AGENT << 32) | 0x42  # as it came back
    assert agent.outstanding == 0 and agent.unmatched == 0


@pytest.mark.trio
async def test_silence_is_retried_then_a_timeout(autojump_clock: trio.testing.MockClock) -> None:
    agent = UmadAgent(AGENT)
    sent: list[float] = []

    async def transmit(mad: bytes) -> None:
        sent.append(trio.current_time())

    start = trio.current_time()
    with pytest.raises(SaTimeout, match=r"after 3 x 250 ms"):
        await agent.send(request(7), transmit, timeout_ms=250, retries=2)
    assert [round(at - start, 6) for at in sent] == [0.0, 0.25, 0.5]
    assert agent.outstanding == 0
    agent.deliver(answer(request(7)))  # too late: nobody waits for it
    assert agent.unmatched == 1


@pytest.mark.trio
async def test_bad_requests_are_refused_before_anything_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = UmadAgent(AGENT)

    async def transmit(mad: bytes) -> None:
        raise AssertionError("nothing may be sent")

    for mad, kwargs, message in [
        (bytes(MAD_SIZE - 1), {}, "must be 256 bytes"),
        (request(1), {"timeout_ms": 0}, "timeout_ms must be > 0"),
        (request(1), {"retries": -1}, "retries must be >= 0"),
    ]:
        args = {"timeout_ms": 100, "retries": 0, **kwargs}
        with pytest.raises(SaSendError, match=message):
            await agent.send(mad, transmit, **args)
    with pytest.raises(ValueError, match="32 bits"):
        UmadAgent(1 << 32)


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

"""The daemon-time benchmark reads a daemon's own time from strace output: the client socket by
its name, MADs by a fabric peer's inode and their size, other sockets and short messages (acks,
wake-ups) ignored, and calls split by threads ("unfinished" / "resumed") joined up."""

from __future__ import annotations

import pytest

from tests.bench import daemon_time
from tests.bench.common import BenchError

CLIENT = 'UNIX-STREAM:[100->101,"/x/node3/ibacm-unix.sock"]'
HUB = "UNIX-STREAM:[200->201]"  # 201 is held by the hub
WAKE = "UNIX-STREAM:[300->301]"  # a socketpair inside the daemon
TRACE = f"""\
7 1000.000000 recvfrom(15<{CLIENT}>, "\\1\\1"..., 2368, MSG_DONTWAIT, NULL, NULL) = 160 <0.000010>
7 1000.000100 sendto(9<{WAKE}>, "\\0", 1, 0, NULL, 0) = 1 <0.000005>
8 1000.000400 sendto(10<{HUB}>, "\\0\\0\\1)"...,  <unfinished ...>
7 1000.000450 read(13<anon_inode:[eventfd]>, "\\1\\0", 8) = 8 <0.000004>
8 1000.000480 <... sendto resumed>, 301, 0, NULL, 0) = 301 <0.000080>
8 1000.000500 recvfrom(10<{HUB}>, "\\0\\0\\0\\5", 65536, 0, NULL, NULL) = 9 <0.000003>
8 1000.001000 recvfrom(10<{HUB}>,  <unfinished ...>
7 1000.001100 sendto(9<{WAKE}>, "\\0"..., 320, 0, NULL, 0) = 320 <0.000005>
8 1000.002000 <... recvfrom resumed>"\\0\\0\\1."..., 65536, 0, NULL, NULL) = 306 <0.001000>
8 1000.002300 sendto(10<{HUB}>, "\\0\\0\\1\\f"..., 272, 0, NULL, 0) = 272 <0.000400>
8 1000.004900 recvfrom(10<{HUB}>, "\\0\\0\\1\\3"..., 65536, 0, NULL, NULL) = 263 <0.000100>
8 1000.005200 recvfrom(10<{HUB}>, 0x5, 65536, 0, NULL, NULL) = -1 EAGAIN (busy) <0.000002>
7 1000.005900 sendto(15<{CLIENT}>, "\\1\\1"..., 88, MSG_DONTWAIT, NULL, 0) = 88 <0.000020>
"""


def test_events_are_the_request_the_mads_and_the_reply() -> None:
    events = daemon_time.parse_trace(TRACE, {201})
    assert [(event.when, event.kind) for event in events] == [
        (pytest.approx(1000.00001), "request"),  # a receive: when it returned
        (1000.0004, "mad_out"),  # a send: when it was issued, however long it waited
        (1000.002, "mad_in"),  # returned when the resumed line says so
        (1000.0023, "mad_out"),
        (pytest.approx(1000.005), "mad_in"),
        (1000.0059, "reply"),
    ]


def test_requester_time_is_read_to_posted_plus_in_to_written() -> None:
    found = daemon_time.requester_times(daemon_time.parse_trace(TRACE, {201}))
    assert found["to_fabric"] == pytest.approx(0.00039)
    assert found["from_fabric"] == pytest.approx(0.0009)
    # own: read -> first MAD out, ACM answer in -> SA query out, SA answer in -> reply.
    assert found["own"] == pytest.approx(0.00039 + 0.0003 + 0.0009)


def test_without_the_fabric_peer_no_mad_is_seen() -> None:
    events = daemon_time.parse_trace(TRACE, {999})
    assert {event.kind for event in events} == {"request", "reply"}
    with pytest.raises(BenchError):
        daemon_time.requester_times(events)


def test_responder_time_leaves_timer_sends_out() -> None:
    trace = (
        f'5 2000.000000 recvfrom(10<{HUB}>, ""..., 65536, 0, NULL, NULL) = 306\n'
        f'5 2000.000150 sendto(10<{HUB}>, ""..., 301, 0, NULL, 0) = 301\n'
        f'5 2000.004000 sendto(10<{HUB}>, ""..., 301, 0, NULL, 0) = 301\n'  # a retry
    )
    found = daemon_time.responder_times(daemon_time.parse_trace(trace, {201}), 1999.0, 2001.0)
    assert found["first"] == pytest.approx(0.00015)
    assert found["own"] == pytest.approx(0.00015)

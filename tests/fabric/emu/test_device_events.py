"""Completion events of the emulated device: never lost between a program's poll and arm."""

from __future__ import annotations

import socket
from typing import cast

import pytest
import trio
import trio.testing

from ibacm.fabric.emu import protocol as ep
from ibacm.fabric.emu.device import EmulatedDevice, _Cq, _Outbox
from ibacm.fabric.sim.hub_client import HubFabric


def pair() -> tuple[trio.socket.SocketType, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.setblocking(False)
    return trio.socket.from_stdlib_socket(ours), theirs


def pending(sock: socket.socket) -> list[bytes]:
    found = []
    while True:
        try:
            found.append(sock.recv(4096))
        except BlockingIOError:
            return found


@pytest.mark.trio
async def test_an_arm_raises_the_event_for_completions_the_program_has_not_polled() -> None:
    """The arm is posted with the count of completions the program polled (an HCA's consumer
    index): one written but not polled yet (even one still on its way to the program's
    socket) raises the event at once, after the record; with nothing unpolled the next
    completion raises it. No completion is ever left without its event."""
    async with trio.open_nursery() as nursery:
        device = EmulatedDevice(cast(HubFabric, None), nursery)
        cq_ours, cq_theirs = pair()
        ch_ours, ch_theirs = pair()
        cq = _Cq(7, channel=3, out=_Outbox(cq_ours))
        device.cqs[7], device.channels[3] = cq, _Outbox(ch_ours)
        completion = ep.encode_send_completion(1, 99, ep.WC_SUCCESS)
        device._complete(7, completion)  # not armed: no event of its own
        device._arm(cq, polled=0)  # queued, not even written yet: the program cannot have it
        assert pending(cq_theirs) == [] and pending(ch_theirs) == []
        channel_out = device.channels[3]
        assert channel_out is not None
        nursery.start_soon(cq.out.run)  # type: ignore[union-attr]
        nursery.start_soon(channel_out.run)
        await trio.testing.wait_all_tasks_blocked()
        assert pending(cq_theirs) == [completion]  # the record first, then its event
        assert pending(ch_theirs) == [ep.CQ_EVENT.pack(7)]
        assert not cq.armed  # the event used the arm up
        # Polled everything: the arm waits for the next completion, which raises it.
        device._arm(cq, polled=1)
        assert cq.armed
        await trio.testing.wait_all_tasks_blocked()
        assert pending(ch_theirs) == []
        device._complete(7, completion)
        await trio.testing.wait_all_tasks_blocked()
        assert pending(cq_theirs) == [completion]
        assert pending(ch_theirs) == [ep.CQ_EVENT.pack(7)]
        # Written and in the socket, but the arm was posted before the program polled it.
        device._complete(7, completion)
        await trio.testing.wait_all_tasks_blocked()
        assert pending(ch_theirs) == []  # not armed: no event yet
        device._arm(cq, polled=2)
        await trio.testing.wait_all_tasks_blocked()
        assert pending(ch_theirs) == [ep.CQ_EVENT.pack(7)] and not cq.armed
        assert pending(cq_theirs) == [completion]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_the_consumer_count_wraps_at_32_bits() -> None:
    async with trio.open_nursery() as nursery:
        device = EmulatedDevice(cast(HubFabric, None), nursery)
        cq_ours, _cq_theirs = pair()
        ch_ours, _ch_theirs = pair()
        cq = _Cq(7, channel=3, out=_Outbox(cq_ours), written=0xFFFFFFFF)
        device.cqs[7], device.channels[3] = cq, _Outbox(ch_ours)
        device._complete(7, ep.encode_send_completion(1, 99, ep.WC_SUCCESS))
        assert cq.written == 0
        device._arm(cq, polled=0x1_0000_0000)  # the library's uint32_t wrapped the same way
        assert cq.armed
        nursery.cancel_scope.cancel()

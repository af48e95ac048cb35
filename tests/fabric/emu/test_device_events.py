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
async def test_an_arm_with_completions_still_on_their_way_raises_the_event() -> None:
    """A completion queued before the arm but not yet in the program's socket cannot have
    been seen by the poll after the arm: it must raise the event once it is there."""
    async with trio.open_nursery() as nursery:
        device = EmulatedDevice(cast(HubFabric, None), nursery)
        cq_ours, cq_theirs = pair()
        ch_ours, ch_theirs = pair()
        cq = _Cq(7, channel=3, out=_Outbox(cq_ours))
        device.cqs[7], device.channels[3] = cq, _Outbox(ch_ours)
        completion = ep.encode_send_completion(1, 99, ep.WC_SUCCESS)
        device._complete(7, completion)  # not armed: no event of its own
        device._arm(cq)  # the record is queued, not written: it counts as after the arm
        assert pending(cq_theirs) == [] and pending(ch_theirs) == []
        channel_out = device.channels[3]
        assert channel_out is not None
        nursery.start_soon(cq.out.run)  # type: ignore[union-attr]
        nursery.start_soon(channel_out.run)
        await trio.testing.wait_all_tasks_blocked()
        assert pending(cq_theirs) == [completion]
        assert pending(ch_theirs) == [ep.CQ_EVENT.pack(7)]
        assert not cq.armed  # the event used the arm up
        # With nothing on its way an arm waits for the next completion, which raises it.
        device._arm(cq)
        assert cq.armed
        await trio.testing.wait_all_tasks_blocked()
        assert pending(ch_theirs) == []
        device._complete(7, completion)
        await trio.testing.wait_all_tasks_blocked()
        assert pending(cq_theirs) == [completion]
        assert pending(ch_theirs) == [ep.CQ_EVENT.pack(7)]
        nursery.cancel_scope.cancel()

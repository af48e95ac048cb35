"""The client half of umad for simulated ports: what the kernel MAD layer does for
``sa_start`` (and so ``sa_send``).

One ``UmadAgent`` per port (an agent registered for class 0x03). ``start`` rewrites the upper
32 bits of the TID with its agent number, as the kernel does, and transmits the MAD at once;
the call's ``wait`` transmits it again, ``retries`` times, each after ``timeout_ms`` without a
response whose TID matches on the low 32 bits. ``deliver`` reassembles RMPP responses
(GetTable) and ends the call with the whole MAD in the round that read it; ``fail`` ends it
with an error the transport reported late (the hub's SA_POST_ERROR), ``fail_all`` every
request when the transport is gone. Responses are returned
with the TID as it came back (upper bits = agent number), so callers that compare all 64 bits
are caught, like on real hardware.

The agent also takes the SA's unsolicited SubnAdmReports (as a kernel agent registered with
the Report method in its mask): they queue, at most ``REPORT_QUEUE`` of them, for
``next_report``; older ones are dropped first (the SA sends a Report again until acked).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from ibacm.fabric.api import MAD_SIZE, FabricError, SaCall, SaSendError, SaTimeout
from ibacm.wire.errors import WireError
from ibacm.wire.mad import Method, RmppFlag, RmppReassembler

_TID_OFFSET = 8
_METHOD_OFFSET = 3
REPORT_QUEUE = 64
_RMPP_FLAGS_OFFSET = 26
_SEG_NUM_OFFSET = 28


@dataclass(slots=True)
class _Waiter:
    """An outstanding request; it leaves the agent's table when its call ends."""

    call: SaCall
    """Ended in the round that reads its reply (``start``)."""
    done: trio.Event = field(default_factory=trio.Event)
    reassembler: RmppReassembler = field(default_factory=RmppReassembler)
    next_segment: int = 1

    def complete(self, result: bytes) -> None:
        self.done.set()
        self.call.end(result)

    def fail(self, error: FabricError) -> None:
        self.done.set()  # the drive wakes and finds the call ended
        self.call.end(None, error)


TransmitNow = Callable[[bytes], None]
"""Puts one MAD on the wire without waiting (or raises SaSendError)."""

WaitFor = Callable[[trio.Event], Awaitable[object]]
"""Waits until an event is set (a hub client must keep reading its socket meanwhile)."""


async def _wait(event: trio.Event) -> None:
    await event.wait()


class UmadAgent:
    """See the module docstring."""

    def __init__(self, agent_id: int, *, wait_for: WaitFor = _wait) -> None:
        if not 0 <= agent_id <= 0xFFFFFFFF:
            raise ValueError(f"agent id {agent_id} does not fit 32 bits")
        self.agent_id = agent_id
        self._wait_for = wait_for
        self._waiters: dict[int, _Waiter] = {}
        self.unmatched = 0
        """Responses that matched no outstanding request (late, duplicate, foreign)."""
        self._reports: deque[bytes] = deque(maxlen=REPORT_QUEUE)
        self._report_ready = trio.Event()
        self.reports_dropped = 0

    @property
    def outstanding(self) -> int:
        return len(self._waiters)

    def start(self, mad: bytes, transmit: TransmitNow, *, timeout_ms: int, retries: int) -> SaCall:
        """Send ``mad`` with ``transmit`` now; the call ends in the round ``deliver`` gets its
        response. Its ``wait`` sends it again, ``retries`` times, each after ``timeout_ms``
        without a response, then ends it with SaTimeout (SaSendError when ``transmit``
        fails). Raises SaSendError for a malformed request, or what ``transmit`` raises."""
        low, wire = self._check(mad, timeout_ms, retries)
        waiters = self._waiters

        async def drive(call: SaCall) -> None:
            for attempt in range(retries + 1):
                if attempt:
                    try:
                        transmit(wire)
                    except FabricError as exc:
                        call.end(None, exc)
                        return
                with trio.move_on_after(timeout_ms / 1000):
                    await self._wait_for(waiter.done)
                if call.ended:
                    return
            call.end(None, self._timeout(low, timeout_ms, retries))

        def forget(_: SaCall) -> None:
            if waiters.get(low) is waiter:
                del waiters[low]

        call = SaCall(drive)
        waiter = waiters[low] = _Waiter(call)
        call.when_ended(forget)
        try:
            transmit(wire)
        except BaseException:
            forget(call)
            raise
        return call

    def fail(self, tid: int, error: FabricError) -> bool:
        """End the outstanding request the MAD with ``tid`` (all 64 bits, as transmitted)
        belongs to with ``error``; false when it is none of ours (nothing ended)."""
        if tid >> 32 != self.agent_id:
            return False
        waiter = self._waiters.get(tid & 0xFFFFFFFF)
        if waiter is None:
            return False
        waiter.fail(error)
        return True

    def fail_all(self, error: FabricError) -> None:
        """End every outstanding request with ``error`` (the transport is gone)."""
        for waiter in list(self._waiters.values()):
            waiter.fail(error)

    def _check(self, mad: bytes, timeout_ms: int, retries: int) -> tuple[int, bytes]:
        """The TID's low bits and the MAD as it goes out (our agent number above them)."""
        if len(mad) != MAD_SIZE:
            raise SaSendError(f"an SA MAD must be {MAD_SIZE} bytes, got {len(mad)}")
        if timeout_ms <= 0:
            raise SaSendError(f"timeout_ms must be > 0, got {timeout_ms}")
        if retries < 0:
            raise SaSendError(f"retries must be >= 0, got {retries}")
        low = int.from_bytes(mad[_TID_OFFSET + 4 : _TID_OFFSET + 8], "big")
        if low in self._waiters:
            raise SaSendError(f"TID low bits {low:#010x} already outstanding on this port")
        wire = bytearray(mad)
        wire[_TID_OFFSET : _TID_OFFSET + 4] = self.agent_id.to_bytes(4, "big")
        return low, bytes(wire)

    @staticmethod
    def _timeout(low: int, timeout_ms: int, retries: int) -> SaTimeout:
        return SaTimeout(f"no SA response to TID {low:#x} after {retries + 1} x {timeout_ms} ms")

    async def next_report(self) -> bytes:
        """Wait for the next SubnAdmReport the SA sent to this port."""
        while not self._reports:
            if self._report_ready.is_set():
                self._report_ready = trio.Event()
            await self._wait_for(self._report_ready)
        return self._reports.popleft()

    def deliver(self, mad: bytes) -> None:
        """A MAD arrived for this agent: complete (or advance) the matching request, or
        queue a Report."""
        if len(mad) < 36:
            self.unmatched += 1
            return
        if mad[_METHOD_OFFSET] == Method.REPORT:
            if len(self._reports) == self._reports.maxlen:
                self.reports_dropped += 1
            self._reports.append(bytes(mad))
            self._report_ready.set()
            return
        waiter = self._waiters.get(int.from_bytes(mad[_TID_OFFSET + 4 : _TID_OFFSET + 8], "big"))
        if waiter is None:
            self.unmatched += 1
            return
        if not mad[_RMPP_FLAGS_OFFSET] & RmppFlag.ACTIVE:
            waiter.complete(bytes(mad))
            return
        self._segment(waiter, mad)

    def _segment(self, waiter: _Waiter, mad: bytes) -> None:
        seg = int.from_bytes(mad[_SEG_NUM_OFFSET : _SEG_NUM_OFFSET + 4], "big")
        if seg < waiter.next_segment:
            return  # a duplicate of a segment we already have
        if seg > waiter.next_segment:
            # A segment was lost: this transfer cannot complete; wait for the retransmission.
            waiter.reassembler.reset()
            waiter.next_segment = 1
            return
        try:
            whole = waiter.reassembler.feed(bytes(mad))
        except WireError:
            waiter.next_segment = 1
            return
        waiter.next_segment = seg + 1
        if whole is not None:
            waiter.complete(whole)

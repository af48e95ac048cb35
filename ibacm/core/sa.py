"""SA MAD transport of the core: TIDs, per-port FIFO credits and the SM destination.

The C core counts transactions in a signed 32-bit int (defect 40: after 2**31 the TIDs stop
matching the kernel-masked replies and all SA traffic stops). Here the counter is unsigned and
wraps from 0xFFFFFFFF back to 1. Each port allows ``sa_depth`` SA MADs in flight; further
requests wait in FIFO order (``trio.CapacityLimiter`` wakes waiters first-come first-served
and never lets a newcomer overtake them). The SM LID/SL come from the port attributes and are
refreshed on SM_CHANGE (defect 23). The SA's Reports (events the provider subscribed to)
arrive through ``report`` and are acknowledged with ``post``, outside the credits: an ack
must not wait behind queued requests, or the SA sends the Report again.
"""

from __future__ import annotations

import trio

from ibacm.fabric.api import Port, PortAttributes, SaCall, SaDestination

TID_MAX = 0xFFFFFFFF


class TidCounter:
    """Daemon-wide 32-bit transaction counter: 1, 2, ..., 0xFFFFFFFF, 1, ..."""

    def __init__(self, first: int = 1) -> None:
        if not 1 <= first <= TID_MAX:
            raise ValueError(f"first TID must be in 1..{TID_MAX:#x}, got {first}")
        self._next = first

    def next(self) -> int:
        tid = self._next
        self._next = 1 if tid == TID_MAX else tid + 1
        return tid


def sa_destination(attrs: PortAttributes) -> SaDestination:
    return SaDestination(attrs.sm_lid, attrs.sm_sl, attrs.sa_pkey_index())


class SaChannel:
    """The SA path of one port: credits plus where the SM is."""

    def __init__(self, port: Port, attrs: PortAttributes, depth: int) -> None:
        self.port = port
        self.dest = sa_destination(attrs)
        self.limiter = trio.CapacityLimiter(max(1, depth))
        self.sent = 0
        self.failed = 0

    @property
    def depth(self) -> int:
        return int(self.limiter.total_tokens)

    @depth.setter
    def depth(self, value: int) -> None:
        # Raising it wakes waiters at once; lowering it lets in-flight MADs finish.
        self.limiter.total_tokens = max(1, value)

    @property
    def in_flight(self) -> int:
        return int(self.limiter.borrowed_tokens)

    @property
    def waiting(self) -> int:
        return int(self.limiter.statistics().tasks_waiting)

    def update(self, attrs: PortAttributes) -> None:
        """Take the SM LID/SL (and P_Key index) from freshly queried attributes."""
        self.dest = sa_destination(attrs)

    async def request(self, mad: bytes, *, timeout_ms: int, retries: int) -> bytes:
        token = object()
        try:
            # A free credit is taken without a trip through the scheduler (``acquire`` yields
            # even then): the query goes out in the round that asks it.
            self.limiter.acquire_on_behalf_of_nowait(token)
        except trio.WouldBlock:
            await self.limiter.acquire_on_behalf_of(token)
        try:
            # Read the destination after the wait: an SM change while queued must count.
            self.sent += 1
            try:
                return await self.port.sa_send(
                    mad, self.dest, timeout_ms=timeout_ms, retries=retries
                )
            except BaseException:
                self.failed += 1
                raise
        finally:
            self.limiter.release_on_behalf_of(token)

    def start(self, mad: bytes, *, timeout_ms: int, retries: int) -> SaCall | None:
        """``request`` without waiting: the MAD sent now, when a credit is free now and the
        port can (``Port.sa_start``); None otherwise (``request`` then waits its turn). The
        credit is held until the call ends."""
        token = object()
        try:
            self.limiter.acquire_on_behalf_of_nowait(token)
        except trio.WouldBlock:
            return None
        try:
            call = self.port.sa_start(mad, self.dest, timeout_ms=timeout_ms, retries=retries)
        except BaseException:
            self.limiter.release_on_behalf_of(token)
            self.failed += 1
            raise
        if call is None:
            self.limiter.release_on_behalf_of(token)
            return None
        self.sent += 1

        def ended(call: SaCall) -> None:
            self.limiter.release_on_behalf_of(token)
            if call.error is not None:
                self.failed += 1

        call.when_ended(ended)
        return call

    async def report(self) -> bytes:
        """The next SubnAdmReport the SA sent to this port."""
        return await self.port.sa_report()

    async def post(self, mad: bytes) -> None:
        """Send one SA MAD that gets no answer (a ReportResp) to the current SM."""
        await self.port.sa_post(mad, self.dest)

"""The traffic of an endpoint's QP: the MADs it receives, the responses and requests it sends.

The receive loop serves the QP (``UdQp.serve``): each batch of MADs (``RECEIVE_BATCH``) goes
to the endpoint's ``PeerProtocol.receive`` in the round the fabric backend read it, and the
actions it returns are applied (``apply``) in that round: a response to a peer is posted at
once (``UdQp.post``; only while every send slot is in flight does it wait in the send
queue, drained by ``send_depth`` senders; a full queue drops it, counted); news of a peer
ends the address phase waiting for it; a learned peer's route goes to the ``Resolver``. ACM
requests are multicast on group 0 (``post_request``), paced by the ``resolve_depth``
credits (``ResolveCredits``) the resolver holds while one is out; they wait in the send
queue too, behind the responses, when every send slot is in flight.

The endpoint opens and closes the QP (``qp``) and runs these loops in its nursery; the calls
here are native ones between compiled classes (the protocol, the resolver, the statistics).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ibacm.fabric.api import (
    MULTICAST_QPN,
    RECEIVE_BATCH,
    AddressVector,
    FabricError,
    SendQueueFull,
    UdQp,
)
from ibacm.log import get_logger
from ibacm.provider.acmp.counters import EndpointStats
from ibacm.provider.acmp.entry import DestEntry
from ibacm.provider.acmp.groups import McGroup
from ibacm.provider.acmp.keys import KeyText
from ibacm.provider.acmp.protocol import (
    REQUEST_RECEIVED,
    RESPONSE_RECEIVED,
    Action,
    Complete,
    Count,
    PeerMoved,
    PeerProtocol,
    RouteWanted,
    SendResponse,
)
from ibacm.provider.acmp.resolution import Resolver

if TYPE_CHECKING:
    from ibacm.fabric.api import ReceivedMad

log = get_logger("ibacm.provider.acmp")


class ResolveCredits:
    """The ``resolve_depth`` credits of an endpoint (behavior.md §13), with a bounded wait.

    As in C, a credit is held from the first transmission of an ACM request until its answer
    or its last timeout, and waiters are served first come, first served. Unlike C (defect
    42), a resolution waits for a credit at most ``max_wait()`` seconds and then sends without
    one: the address phase is bounded by ``timeout x (retries + 1)`` credit wait included, so
    a queue behind one unanswered request (a lost MAD, a dead peer) would otherwise spend the
    waiters' budgets before they transmit at all, and they would end ETIMEDOUT having tried
    once or never. While answers come back within that wait (microseconds on a healthy
    fabric), nobody gives up waiting and the limit paces requests exactly as C's does.
    """

    def __init__(self, total: int, max_wait: Callable[[], float], stats: EndpointStats) -> None:
        self._credits = trio.Semaphore(total)
        self._holders: set[object] = set()
        """Tasks, or the requests in flight without one, that hold a credit."""
        self._max_wait = max_wait
        self._stats = stats

    async def __aenter__(self) -> None:
        task = trio.lowlevel.current_task()
        # A free credit is taken without a trip through the scheduler (``acquire`` yields
        # even then): the first resolution's MAD goes out a round sooner.
        if self.try_take(task):
            return
        with trio.move_on_after(self._max_wait()):
            await self._credits.acquire()
            self._holders.add(task)
            return
        self._stats.credit_overdrafts += 1

    async def __aexit__(self, *exc_info: object) -> None:
        self.give_back(trio.lowlevel.current_task())

    def try_take(self, holder: object) -> bool:
        """A credit for ``holder`` if one is free now and nobody waits for one (a request
        sent without a task: ``resolution.AddressFlight``)."""
        try:
            self._credits.acquire_nowait()
        except trio.WouldBlock:
            return False
        self._holders.add(holder)
        return True

    def give_back(self, holder: object) -> None:
        """Return ``holder``'s credit, if it holds one."""
        if holder in self._holders:
            self._holders.discard(holder)
            self._credits.release()


OutItem = tuple[bytes, AddressVector, int, bool]
"""A MAD waiting for a send slot: the MAD, where it goes, and whether it is a response."""


class EndpointTraffic:
    """What goes in and out of one endpoint's QP (see the module docstring)."""

    def __init__(
        self,
        protocol: PeerProtocol,
        resolver: Resolver,
        stats: EndpointStats,
        group0: McGroup,
        queue_depth: int,
    ) -> None:
        self.protocol = protocol
        self.resolver = resolver
        self.stats = stats
        self.group0 = group0
        self.qp: UdQp | None = None
        """The endpoint's QP while it is open (the endpoint opens and closes it)."""
        self._send_queue_in, self._send_queue_out = trio.open_memory_channel[OutItem](queue_depth)
        self._queued = 0
        """MADs in the send queue: while any wait, later ones queue behind them (in order)."""

    # -- in -------------------------------------------------------------------------------

    async def receive_loop(self) -> None:
        """Serve the QP until it closes: its MADs are handled in the round that reads them
        (``UdQp.serve``), their responses posted from there."""
        qp = self.qp
        assert qp is not None
        await qp.serve(self.receive_batch, RECEIVE_BATCH)

    def receive_batch(self, batch: list[ReceivedMad]) -> None:
        # One clock reading per batch: its MADs share the lifetimes' deadline floats.
        now = trio.current_time()
        for received in batch:
            self.receive_mad(received, now)

    def receive_mad(self, received: ReceivedMad, now: float) -> None:
        """One MAD as the receive loop takes it."""
        for action in self.protocol.receive(received, now):
            self.apply(action, now)

    def apply(self, action: Action, now: float) -> None:
        """Do what the peer protocol decided (``protocol.Action``), in the round it did."""
        if isinstance(action, Count):
            # The per-MAD ones as field writes (compiled: no look-up by name).
            if action is REQUEST_RECEIVED:
                self.stats.requests_received += 1
            elif action is RESPONSE_RECEIVED:
                self.stats.responses_received += 1
            else:
                self.stats.add(action.tally)
        elif isinstance(action, SendResponse):
            self.queue_response(action.mad, action.av, action.qpn)
        elif isinstance(action, Complete):
            action.query.complete(action.status, action.reason)
        elif isinstance(action, RouteWanted):
            self.resolver.peer_asked(action.entry, action.tid, now)
        else:
            self._peer_moved(action)

    def _peer_moved(self, moved: PeerMoved) -> None:
        self.stats.peer_moves += 1
        log.info(
            "peer LID changed; its other cached routes dropped",
            peer=KeyText(moved.entry.key),
            lid=moved.lid,
            dropped=moved.dropped,
        )

    # -- out ------------------------------------------------------------------------------

    def respond(self, entry: DestEntry, tid: int, status: int) -> None:
        """Answer a peer's request ``tid`` for our address (``PeerProtocol.response``)."""
        self.apply(self.protocol.response(entry, tid, status), math.nan)

    def post_request(self, mad: bytes) -> bool:
        """Multicast an ACM request on group 0, posted now (queued behind the responses
        while every send slot is in flight); a failed post is counted (the retries go on);
        False once the QP is closed."""
        qp, av = self.qp, self.group0.av
        if qp is None:
            return False
        if av is None:
            # Group 0 is being joined again: this transmission is lost, as on a fabric.
            self.stats.send_errors += 1
            return True
        self._post(qp, (mad, av, MULTICAST_QPN, False))
        return True

    def queue_response(self, mad: bytes, av: AddressVector, qpn: int) -> None:
        """Post a response now (queued while every send slot is in flight)."""
        self._post(self.qp, (mad, av, qpn, True))

    def _post(self, qp: UdQp | None, item: OutItem) -> None:
        """Post now; while every send slot is in flight (or MADs wait already, in order) the
        MAD waits in the send queue for a sender: a full queue drops it, counted."""
        if qp is not None and not self._queued:
            mad, av, qpn, response = item
            try:
                qp.post(mad, av, qpn)
            except SendQueueFull:
                pass
            except FabricError as exc:
                self.stats.send_errors += 1
                log.debug("send failed", response=response, error=str(exc))
                return
            else:
                if response:
                    self.stats.responses_sent += 1
                return
        try:
            self._send_queue_in.send_nowait(item)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            if item[3]:
                self.stats.responses_dropped += 1
            else:
                self.stats.send_errors += 1  # a transmission lost; the retries go on
        else:
            self._queued += 1

    async def queued_sender(self) -> None:
        """One of ``send_depth`` senders of the send queue (MADs that found every send slot
        in flight), each waiting for its send's completion."""
        async for mad, av, qpn, response in self._send_queue_out:
            self._queued -= 1
            qp = self.qp
            if qp is None:
                return
            try:
                await qp.send(mad, av, qpn)
                if response:
                    self.stats.responses_sent += 1
            except FabricError as exc:
                self.stats.send_errors += 1
                log.debug("send failed", response=response, error=str(exc))

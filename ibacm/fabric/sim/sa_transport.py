"""The way to and from the simulated SA: umad agents, the SA's request queue, its answers and
the SM's Reports.

A port's SA MADs go to ``dest.sm_lid`` (QP1); there they queue in front of a single SA server
with a service time (``faults.sa_service_time``); a queue longer than ``faults.sa_queue_limit``
is answered BUSY. Answers go back to the agent named by the TID's high 32 bits. When the SM
reports a trap (a port going down or up), each subscriber's Report is sent again every
``REPORT_TIMEOUT`` until it is acknowledged, at most ``REPORT_RETRIES`` more times (OpenSM's
transaction timeout and retries). Everything travels through ``Delivery``: counted, delayed
and subject to the same faults as any other MAD.
"""

from __future__ import annotations

import itertools
import sys
import traceback
from collections import deque
from collections.abc import Callable
from functools import partial

import trio

from ibacm.fabric.api import MAD_SIZE, SaDestination, SaSendError
from ibacm.fabric.sim.delivery import Delivery
from ibacm.fabric.sim.runtime import Endpoint, PortRuntime
from ibacm.fabric.sim.sa import SubnetAdministrator
from ibacm.wire.notice import Trap

REPORT_TIMEOUT = 0.2
REPORT_RETRIES = 3


class SaTransport:
    """See the module docstring."""

    def __init__(self, delivery: Delivery, sa: SubnetAdministrator) -> None:
        self.delivery = delivery
        self.sa = sa
        # The world's, as delivery holds them: one directory, one set of faults and stats.
        self.directory = delivery.directory
        self.faults = delivery.faults
        self.inject = delivery.inject
        self.stats = delivery.stats
        self._agent_ids = itertools.count(1)
        self._queue: deque[tuple[Endpoint, bytes]] = deque()
        self._wakeup = trio.Event()

    # -- agents ---------------------------------------------------------------------------

    def register_agent(self, port: PortRuntime, deliver: Callable[[bytes], None]) -> int:
        agent_id = next(self._agent_ids) & 0xFFFFFFFF
        port.agents[agent_id] = deliver
        return agent_id

    def unregister_agent(self, port: PortRuntime, agent_id: int) -> None:
        port.agents.pop(agent_id, None)

    # -- requests -------------------------------------------------------------------------

    def transmit(self, port: PortRuntime, mad: bytes, dest: SaDestination) -> None:
        """Put one SA MAD on the wire from ``port`` to ``dest.sm_lid`` (QP1)."""
        self.delivery.require_running()
        if not port.active:
            raise SaSendError(f"{port.name} is {port.state.name}: cannot send SA MADs")
        if len(mad) != MAD_SIZE:
            raise SaSendError(f"an SA MAD must be {MAD_SIZE} bytes, got {len(mad)}")
        if not 0 <= dest.pkey_index < len(port.pkeys):
            raise SaSendError(f"{port.name}: P_Key index {dest.pkey_index} is not in the table")
        mad = bytes(mad)
        self.delivery.count_sent(mad)
        target = self.directory.lid_owner(dest.sm_lid)
        path = self.directory.router.path(port.guid, target.guid) if target is not None else None
        if target is None or path is None:
            self.stats["sa_unreachable"] += 1
            return
        delivery = self.delivery
        delivery.send_copies(mad, delivery.latency(path.hops), partial(self._arrives, port, target))

    def _arrives(self, port: PortRuntime, target: Endpoint, mad: bytes) -> None:
        if target.guid != self.directory.sm_guid or not target.active:
            self.stats["sa_not_sm"] += 1  # no SA behind that LID: the MAD is dropped
            return
        if self.faults.sa_down:
            self.stats["sa_down"] += 1
            return
        if len(self._queue) >= self.faults.sa_queue_limit:
            self.stats["sa_overload"] += 1
            self._reply(port, self.sa.busy(mad))
            return
        self._queue.append((port, mad))
        self._wakeup.set()

    async def serve(self) -> None:
        """The SA server: one request at a time, each taking ``faults.sa_service_time``."""
        while True:
            if not self._queue:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            # The request being served still counts as queued (for the overload bound).
            await trio.sleep(self.faults.sa_service_time)
            requester, mad = self._queue.popleft()
            self.stats["sa_served"] += 1
            if self.inject.busy():
                self.stats["sa_busy"] += 1
                self._reply(requester, self.sa.busy(mad))
                continue
            try:
                answers = self.sa.handle(requester, mad)
            except Exception:  # an SA bug must cost one answer, not the whole fabric
                self.stats["sa_internal_error"] += 1
                traceback.print_exc(file=sys.stderr)
                continue
            self._reply(requester, answers)

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    # -- answers --------------------------------------------------------------------------

    def _reply(self, requester: Endpoint, responses: list[bytes]) -> None:
        if not isinstance(requester, PortRuntime):
            return
        path = self.directory.router.path(self.directory.sm_guid, requester.guid)
        if path is None:
            return
        delivery = self.delivery
        delay = delivery.latency(path.hops)
        for response in responses:
            delivery.count_sent(response)
        if self.faults.alters_transmissions:
            arrive = partial(self._response_arrives, requester)
            for response in responses:
                delivery.send_copies(response, delay, arrive)
        else:
            # Every copy arrives: the segments of one answer travel as one batch, which is
            # the same order and time as one delivery each (hundreds per GetTable at scale).
            delivery.call_later(delay, self._responses_arrive, requester, responses)

    def _responses_arrive(self, port: PortRuntime, mads: list[bytes]) -> None:
        for mad in mads:
            self._response_arrives(port, mad)

    def _response_arrives(self, port: PortRuntime, mad: bytes) -> None:
        if not port.active:
            self.stats["port_down_drop"] += 1
            return
        deliver = port.agents.get(int.from_bytes(mad[8:12], "big"))
        if deliver is None:
            self.stats["sa_no_agent"] += 1
            return
        deliver(mad)

    # -- SM reports -----------------------------------------------------------------------

    def report(self, trap: Trap, subject: PortRuntime) -> None:
        """Trap ``trap`` about ``subject`` to every subscriber (computed while ``subject``
        still counts as in the subnet, so partitions and LID ranges apply to it)."""
        issuer = self.directory.guid_owner(self.directory.sm_guid)
        if issuer is None:
            return
        for subscriber, mad in self.sa.reports(trap, subject.guid, issuer):
            self.stats[f"report_trap_{int(trap)}"] += 1
            self._send_report(subscriber, mad, 0)

    def _send_report(self, subscriber: int, mad: bytes, resent: int) -> None:
        tid = int.from_bytes(mad[12:16], "big")
        pending = self.sa.unacked.get(tid)
        if pending is None:
            return  # acknowledged (or the subscriber left the subnet)
        if resent > REPORT_RETRIES:
            del self.sa.unacked[tid]
            self.stats["report_unacked"] += 1
            return
        if resent:
            self.stats["report_resent"] += 1
        delivery = self.delivery
        delivery.call_later(REPORT_TIMEOUT, self._send_report, subscriber, mad, resent + 1)
        port = self.directory.guid_owner(subscriber)
        if not isinstance(port, PortRuntime) or not port.active:
            return
        path = self.directory.router.path(self.directory.sm_guid, port.guid)
        if path is None:
            return
        delivery.count_sent(mad)
        delivery.send_copies(mad, delivery.latency(path.hops), partial(self._report_arrives, port))

    def _report_arrives(self, port: PortRuntime, mad: bytes) -> None:
        # As the kernel does with an agent registered for the Report method: every client
        # of the port that registered for SA class MADs gets it.
        if not port.active:
            self.stats["port_down_drop"] += 1
            return
        if not port.agents:
            self.stats["sa_no_agent"] += 1
            return
        for deliver in list(port.agents.values()):
            deliver(mad)

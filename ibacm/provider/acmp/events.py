"""Fabric events from the SM: each port subscribes to traps 64/65 and acts on the Reports.

A port subscribes through the SA (InformInfo SET, Subscribe 1, for trap 64 "GID in service"
and trap 65 "GID out of service") when it comes up, and again after an SM change or a client
reregister (the new SM, or an SM that lost its state, knows no subscriptions; a port that went
down lost its own). A refused or unanswered subscription is retried with a doubling backoff.

Every Report is acknowledged with a ReportResp at once (else the SA sends it again). On trap
65 for GID g, every endpoint of the port drops what leads to g: an entry whose address came
from ACM (or the route file) is removed, so the next request resolves afresh and fails
clearly if g is gone; an entry that knows its SA query (an address from the hosts preload, a
path request) keeps it and loses its route, so the next request asks the SA, which answers
with a fresh path or no path. Bulk routes to g go as well. Entries with a resolution in
progress are left to it. Trap 64 needs nothing: a GID that comes back is found when asked.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import TYPE_CHECKING

import trio

from ibacm.fabric.api import FabricError
from ibacm.log import get_logger
from ibacm.wire.errors import WireError
from ibacm.wire.mad import SaMad
from ibacm.wire.notice import (
    InformInfo,
    Trap,
    build_inform_info_set,
    build_report_resp,
    decode_inform_info_reply,
    decode_report,
)
from ibacm.wire.path_record import gid_to_text

if TYPE_CHECKING:
    from ibacm.provider.acmp.endpoint import AcmpPort

log = get_logger("ibacm.provider.acmp.events")

TRAPS = (Trap.GID_IN_SERVICE, Trap.GID_OUT_OF_SERVICE)
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
"""Seconds between subscription attempts: doubling from the first to the last."""
RESP_TIME_VALUE = 19
"""InformInfo RespTimeValue: the longest we take to ack a Report, 4.096 us x 2^19 = 2.1 s
(we ack on receipt; the margin is for a loaded host)."""
RECENT_REPORTS = 64
"""TIDs of the last Reports handled: a Report sent again (our ack was lost) is acked only."""


class SubscriptionRefused(FabricError):
    """The SA answered an InformInfo SET with an error status."""


class SmEvents:
    """The trap subscription of one port and the Reports it brings (one per AcmpPort)."""

    def __init__(self, port: AcmpPort) -> None:
        self.port = port
        self.counts: Counter[str] = Counter()
        """subscriptions, refused, reports, acked, repeated, bad_reports, gid_out, gid_in,
        dropped."""
        self.subscribed = False
        self._recent: deque[int] = deque(maxlen=RECENT_REPORTS)
        self._again = trio.Event()

    def resubscribe(self) -> None:
        """Subscribe again now (SM change, client reregister)."""
        self.subscribed = False
        self._again.set()

    def snapshot(self) -> dict[str, int | bool]:
        return {"subscribed": self.subscribed, **self.counts}

    async def run(self) -> None:
        """Until the port's nursery is cancelled: keep subscribed and handle Reports."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._subscriber)
            await self._receive(nursery.cancel_scope)

    # -- subscribing ----------------------------------------------------------------------

    async def _subscriber(self) -> None:
        await self.port.serving.wait()  # the joins first: they are what clients wait for
        backoff = BACKOFF_FIRST
        while True:
            self._again = trio.Event()
            try:
                for trap in TRAPS:
                    await self._subscribe(trap)
            except (FabricError, WireError) as exc:
                self.counts["refused"] += 1
                # Said once per outage; an SM without event support must not fill the log.
                report = log.warning if backoff == BACKOFF_FIRST else log.debug
                report("SM event subscription failed", port=self._name, error=str(exc),
                       retry_in=backoff)  # fmt: skip
                with trio.move_on_after(backoff):
                    await self._again.wait()
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            backoff = BACKOFF_FIRST
            self.subscribed = True
            self.counts["subscriptions"] += 1
            log.info("subscribed to SM events", port=self._name, traps="64,65")
            await self._again.wait()

    async def _subscribe(self, trap: Trap) -> None:
        core, core_port = self.port.core, self.port.core_port
        wanted = InformInfo(trap_num=trap, resp_time_value=RESP_TIME_VALUE)
        reply = SaMad.decode(
            await core.sa_request(core_port, build_inform_info_set(core.next_tid(), wanted))
        )
        if reply.mad.status:
            raise SubscriptionRefused(f"trap {int(trap)}: SA status {reply.mad.status:#06x}")
        echoed = decode_inform_info_reply(reply)
        if not echoed.subscribe or echoed.trap_num != trap:
            raise SubscriptionRefused(f"trap {int(trap)}: the SA echoed {echoed}")

    # -- Reports --------------------------------------------------------------------------

    async def _receive(self, subscriber: trio.CancelScope) -> None:
        core, core_port = self.port.core, self.port.core_port
        while True:
            try:
                mad = await core.sa_report(core_port)
            except FabricError as exc:
                # This backend cannot receive Reports: a subscription would be wasted.
                log.warning("no SM events on this port", port=self._name, error=str(exc))
                subscriber.cancel()
                return
            self.counts["reports"] += 1
            try:
                report, notice = decode_report(mad)
            except WireError as exc:
                self.counts["bad_reports"] += 1
                log.warning("bad SM report dropped", port=self._name, error=str(exc))
                continue
            try:
                await core.sa_post(core_port, build_report_resp(report))
                self.counts["acked"] += 1
            except FabricError as exc:  # the SA sends it again
                log.warning("SM report not acknowledged", port=self._name, error=str(exc))
            gid = notice.subject_gid
            if report.mad.tid in self._recent:
                self.counts["repeated"] += 1
                continue
            self._recent.append(report.mad.tid)
            if gid is None:
                continue
            text = gid_to_text(gid)
            if notice.trap_num == Trap.GID_OUT_OF_SERVICE:
                self.counts["gid_out"] += 1
                dropped = self.gid_out_of_service(gid)
                self.counts["dropped"] += dropped
                log.info("GID out of service: its entries dropped", port=self._name,
                         gid=text, entries=dropped)  # fmt: skip
                core.publish("acmp.sm_event", {"trap": 65, "gid": text, "dropped": dropped})
            elif notice.trap_num == Trap.GID_IN_SERVICE:
                self.counts["gid_in"] += 1
                log.info("GID in service", port=self._name, gid=text)
                core.publish("acmp.sm_event", {"trap": 64, "gid": text, "dropped": 0})

    def gid_out_of_service(self, gid: bytes) -> int:
        """Drop what leads to ``gid`` in every endpoint of the port; how many entries."""
        return sum(endpoint.forget_gid(gid) for endpoint in list(self.port.endpoints.values()))

    @property
    def _name(self) -> str:
        core_port = self.port.core_port
        return f"{core_port.device.name}/{core_port.port_num}"

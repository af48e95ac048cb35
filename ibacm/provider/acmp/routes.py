"""Routes: SA PathRecord queries, and path records built without the SA.

SA queries (mad-protocol.md §9.2-§9.5, behavior.md §12.2) differ from C where C is defective:

* the reply is checked: method GetResp/GetTableResp, attribute PathRecord, TID; the generic
  MAD status byte counts (defect 39). BUSY is retried after an exponential backoff; any other
  generic status (redirect, unsupported method/attribute, invalid field) fails the query;
* a whole query, including waiting for an SA credit and BUSY backoffs, is bounded by
  ``sa_timeout x (sa_retries + 1)``, so a parked client never waits longer than that for the
  route phase.

Statuses are ACM statuses: the SA class status byte passed through as C does (so "no records"
is ENODATA), ETIMEDOUT when the SA did not answer in time, ENODATA when the MAD could not be
sent or the answer was unusable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from ibacm.fabric.api import AddressVector, FabricError, SaCall, SaTimeout
from ibacm.log import get_logger
from ibacm.wire.client import AcmStatus
from ibacm.wire.errors import WireError
from ibacm.wire.mad import (
    MadStatus,
    Method,
    SaAttr,
    SaMad,
    build_path_get,
    build_path_get_table,
)
from ibacm.wire.path_record import PATH_RECORD_LEN, PathComp, PathRecord

if TYPE_CHECKING:
    from ibacm.config.options import Options
    from ibacm.provider.api import CorePort, CoreServices

log = get_logger("ibacm.provider.acmp")

BUSY_BACKOFF_INITIAL = 0.05
"""Seconds before the first retry of a query the SA answered BUSY; doubles each time."""
BUSY_BACKOFF_MAX = 1.0
BULK_COMP_MASK = int(PathComp.SGID | PathComp.PKEY)
"""route_bulk_preload: every path from our port GID in our partition."""


def sa_phase_budget(options: Options) -> float:
    """Seconds a route phase may take at most: per-attempt timeout x attempts."""
    return options.effective_sa_timeout * (options.effective_sa_retries + 1) / 1000.0


@dataclass(frozen=True, slots=True)
class SaOutcome:
    """Result of one SA PathRecord query."""

    status: int
    """ACM status (see the module docstring)."""
    record: PathRecord | None = None
    """The first record when the SA answered with a usable reply (even with a status)."""
    reason: str = ""


class SaPaths:
    """SA PathRecord queries on one port, through the core's SA transport."""

    def __init__(self, core: CoreServices, port: CorePort) -> None:
        self.core = core
        self.port = port
        self.busy_retries = 0
        self.failures = 0

    async def get(self, query: PathRecord, comp_mask: int | None = None) -> SaOutcome:
        """PathRecord GET with ``query`` (mask derived from its non-zero fields by default)."""
        budget = sa_phase_budget(self.core.options)
        with trio.move_on_after(budget):
            outcome = await self._until_not_busy(query, comp_mask, table=False)
            if outcome.status != AcmStatus.SUCCESS:
                self.failures += 1
            return outcome
        self.failures += 1
        return over_budget(budget)

    async def get_table(
        self, query: PathRecord, comp_mask: int = BULK_COMP_MASK
    ) -> tuple[SaOutcome, list[PathRecord]]:
        """PathRecord GetTable: every record matching ``comp_mask`` (reassembled by the port)."""
        budget = sa_phase_budget(self.core.options)
        with trio.move_on_after(budget):
            reply = await self._exchange_until_not_busy(query, comp_mask, table=True)
            if isinstance(reply, SaOutcome):
                return reply, []
            try:
                stride, count = reply.record_layout(PATH_RECORD_LEN)
                records = PathRecord.decode_table(reply.data, stride, count)
            except WireError as exc:
                return SaOutcome(AcmStatus.ENODATA, reason=f"bad GetTable reply: {exc}"), []
            return SaOutcome(reply.sa_status), records
        return SaOutcome(AcmStatus.ETIMEDOUT, reason="GetTable timed out"), []

    def begin(self, query: PathRecord, on_outcome: Callable[[SaOutcome], None]) -> SaQuery | None:
        """``get`` without waiting when the query can go out now (``CoreServices.sa_start``):
        ``on_outcome`` gets its outcome (in the round that reads a usable answer:
        ``SaQuery``); its ``run`` (the caller's task) drives the rest. None: use ``get``."""
        tid = self.core.next_tid()
        mad = build_path_get(tid, query)
        try:
            call = self.core.sa_start(self.port, mad)
        except FabricError as exc:
            log.debug("SA query not started", error=str(exc))
            return None
        if call is None:
            return None
        return SaQuery(self, query, tid, call, on_outcome)

    async def _until_not_busy(
        self, query: PathRecord, comp_mask: int | None, *, table: bool, delay: float = 0.0
    ) -> SaOutcome:
        reply = await self._exchange_until_not_busy(query, comp_mask, table=table, delay=delay)
        if isinstance(reply, SaOutcome):
            return reply
        return record_outcome(reply)

    async def _exchange_until_not_busy(
        self, query: PathRecord, comp_mask: int | None, *, table: bool, delay: float = 0.0
    ) -> SaMad | SaOutcome:
        """The usable reply, or what ended the query; first after ``delay`` seconds (a
        back-off already owed), and again after a growing pause while the SA is BUSY."""
        while True:
            if delay:
                await trio.sleep(delay)
            delay = min(max(delay * 2, BUSY_BACKOFF_INITIAL), BUSY_BACKOFF_MAX)
            tid = self.core.next_tid()
            build = build_path_get_table if table else build_path_get
            mad = build(tid, query, comp_mask)
            try:
                raw = await self.core.sa_request(self.port, mad)
            except FabricError as exc:
                return unanswered(exc)
            judged = self.judge(raw, tid, table=table)
            if judged is not None:
                return judged

    def judge(self, raw: bytes, tid: int, *, table: bool) -> SaMad | SaOutcome | None:
        """The usable reply to query ``tid``; an outcome when the reply ends the query;
        None when the SA is BUSY (asked again, with a fresh TID, after a pause)."""
        reply = check_path_reply(raw, tid, table=table)
        if isinstance(reply, str):
            return SaOutcome(AcmStatus.ENODATA, reason=reply)
        generic = reply.generic_status
        if generic & MadStatus.BUSY:
            self.busy_retries += 1
            log.debug("sa busy, backing off", tid=tid)
            return None
        if generic:
            return SaOutcome(
                AcmStatus.ENODATA, reason=f"SA answered with MAD status 0x{generic:02x}"
            )
        return reply


def unanswered(exc: FabricError) -> SaOutcome:
    """The outcome of a query the SA did not answer (SaTimeout) or that was not sent."""
    if isinstance(exc, SaTimeout):
        return SaOutcome(AcmStatus.ETIMEDOUT, reason="SA did not answer")
    return SaOutcome(AcmStatus.ENODATA, reason=f"SA MAD not sent: {exc}")


def over_budget(budget: float) -> SaOutcome:
    """The outcome of a query that had no usable answer within the route phase's budget."""
    return SaOutcome(AcmStatus.ETIMEDOUT, reason=f"no usable SA answer within {budget:g}s")


def record_outcome(reply: SaMad) -> SaOutcome:
    """A usable PathRecord reply's outcome: its SA status and first record."""
    try:
        record = PathRecord.decode(reply.records(PATH_RECORD_LEN)[0])
    except WireError as exc:
        return SaOutcome(AcmStatus.ENODATA, reason=f"bad PathRecord in SA reply: {exc}")
    return SaOutcome(reply.sa_status, record)


class SaQuery:
    """A PathRecord GET started without waiting (``SaPaths.begin``).

    A usable answer (or a definite failure) is handed to ``on_outcome`` in the round that
    reads it: the route phase ends there, and so does the client's wait. ``run``, in the
    caller's task, drives the rest within the phase's budget, as ``SaPaths.get``: the
    umad retransmissions, a time-out, a BUSY answer asked again after a back-off. The
    outcome is given once."""

    __slots__ = ("busy", "call", "given", "on_outcome", "paths", "query", "tid")

    def __init__(
        self,
        paths: SaPaths,
        query: PathRecord,
        tid: int,
        call: SaCall,
        on_outcome: Callable[[SaOutcome], None],
    ) -> None:
        self.paths = paths
        self.query = query
        self.tid = tid
        self.call = call
        self.on_outcome = on_outcome
        self.given = False
        self.busy = False
        """The answer said BUSY: ``run`` asks again after a back-off."""
        call.when_ended(self._ended)  # last: it may have ended already

    def _ended(self, call: SaCall) -> None:
        # The round that read the reply; a failure or BUSY is ``run``'s to handle.
        if call.reply is None:
            return
        judged = self.paths.judge(call.reply, self.tid, table=False)
        if judged is None:
            self.busy = True
        else:
            self._give(judged if isinstance(judged, SaOutcome) else record_outcome(judged))

    def _give(self, outcome: SaOutcome) -> None:
        if self.given:
            return
        self.given = True
        if outcome.status != AcmStatus.SUCCESS:
            self.paths.failures += 1
        self.on_outcome(outcome)

    def abandon(self) -> None:
        """Nobody will run it (the endpoint closed): the call ends, its credit returns."""
        self.call.end(None, SaTimeout("the SA query was abandoned"))

    async def run(self) -> None:
        budget = sa_phase_budget(self.paths.core.options)
        with trio.move_on_after(budget):
            self._give(await self._rest())
            return
        self._give(over_budget(budget))

    async def _rest(self) -> SaOutcome:
        try:
            await self.call.wait()
        except FabricError as exc:
            return unanswered(exc)
        if self.busy:  # judged in the round of the answer; the rest as ``get`` does it
            return await self.paths._until_not_busy(
                self.query, None, table=False, delay=BUSY_BACKOFF_INITIAL
            )
        # Given in the round of the answer (``_ended`` judged ``raw``): nothing is left.
        return SaOutcome(AcmStatus.SUCCESS)


def check_path_reply(raw: bytes, tid: int, *, table: bool) -> SaMad | str:
    """The decoded SA reply, or why it cannot be the answer to PathRecord query ``tid``."""
    try:
        reply = SaMad.decode(raw)
    except WireError as exc:
        return f"malformed SA reply: {exc}"
    expected = Method.GET_TABLE_RESP if table else Method.GET_RESP
    if reply.mad.method != expected:
        return f"SA reply method 0x{reply.mad.method:02x}, expected 0x{int(expected):02x}"
    if reply.mad.attr_id != SaAttr.PATH_RECORD:
        return f"SA reply attribute 0x{reply.mad.attr_id:04x} is not PathRecord"
    # The kernel rewrites the upper 32 bits of SA TIDs, so only the low half identifies it.
    if (reply.mad.tid ^ tid) & 0xFFFFFFFF:
        return f"SA reply TID 0x{reply.mad.tid:x} does not match 0x{tid:x}"
    return reply


# -- path records built locally -----------------------------------------------------------------


def address_query(sgid: bytes, dgid: bytes, tclass: int, pkey: int) -> PathRecord:
    """The SA query for a peer learned through ACM: sgid, dgid, tclass, pkey only (§9.5).

    Always a fresh record, so nothing from an earlier life of the entry leaks in (defect 33).
    """
    return PathRecord(sgid=sgid, dgid=dgid, tclass=tclass, pkey=pkey)


def path_query(request: PathRecord, pkey: int, port_lid: int, port_gid: bytes) -> PathRecord:
    """The SA query for a path-form request (behavior.md §10.3): pkey, dgid, dlid, and our
    slid/sgid unless the client gave them. Other client fields are not forwarded, as C."""
    return PathRecord(
        pkey=pkey,
        dgid=request.dgid,
        dlid=request.dlid,
        slid=request.slid or port_lid,
        sgid=request.sgid if any(request.sgid) else port_gid,
    )


def path_from_group(group_path: PathRecord, peer_gid: bytes, peer_lid: int) -> PathRecord:
    """route_prot acm: the group's record aimed at the peer (behavior.md §12.1)."""
    return group_path.aimed_at(peer_gid, peer_lid)


def loopback_path(gid: bytes, lid: int, pkey: int, mtu: int, rate: int) -> PathRecord:
    """A local address (behavior.md §9.4): to ourselves, reversible, port MTU and rate."""
    path = PathRecord(sgid=gid, dgid=gid, slid=lid, dlid=lid, reversible=True, pkey=pkey)
    path.mtu_byte = mtu & 0xFF
    path.rate_byte = rate & 0xFF
    return path


def av_from_path(path: PathRecord, sgid_index: int, lid_mask: int) -> AddressVector:
    """Unicast address vector for ``path`` (behavior.md §12.2), GRH always present."""
    return AddressVector(
        dlid=path.dlid,
        dgid=path.dgid,
        sl=path.sl,
        src_path_bits=path.slid & ~lid_mask & 0x7F,
        static_rate=path.rate,
        sgid_index=sgid_index,
        flow_label=path.flow_label,
        hop_limit=path.hop_limit,
        traffic_class=path.tclass,
    )


def av_to_peer(group_av: AddressVector, lid: int, gid: bytes, path_bits: int) -> AddressVector:
    """Unicast address vector to a peer learned through a group: the group's SL, rate and
    GRH fields, to the LID and GID the peer's MAD came from (mad-protocol.md §6.4)."""
    return AddressVector(
        lid,
        gid,
        group_av.sl,
        path_bits,
        group_av.static_rate,
        group_av.sgid_index,
        group_av.flow_label,
        group_av.hop_limit,
        group_av.traffic_class,
    )

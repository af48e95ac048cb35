"""The ACM peer protocol of one endpoint: requests and responses received on its QP.

mad-protocol.md §6. Every receiver caches the requester (ARP-like); the target answers with
the group it chose. Hardening beyond C, invisible to C peers:

* a MAD the codec rejects (bad class/version/control, more MGIDs than fit: defects 38) is
  counted in the endpoint stats and dropped;
* a response is accepted only for a TID outstanding on this endpoint whose entry is still in
  QUERY_ADDR, and for GID/LID questions only from the GID/LID asked about;
* GID and LID requests for our port are answered (C never answered them, defect 45);
* an entry in ADDR_RESOLVED learns the peer's current QPN/LID from its requests (defect 36:
  hosts-file entries kept QPN 1 and their answers were lost);
* a request claiming one of our own addresses as its source is not learned from (it is our
  own multicast coming back, or a spoof).

Everything here is synchronous: the receive loop never waits on a handler. Work that needs to
wait (an SA route query before answering) runs as a resolution in the endpoint's nursery.
"""

from __future__ import annotations

from logging import DEBUG
from typing import TYPE_CHECKING

import trio

from ibacm.acmp.cache import (
    GID,
    LID,
    CacheKeyError,
    DestEntry,
    EntryState,
    KeyText,
    cache_key,
    key_address,
    key_type,
)
from ibacm.acmp.groups import McGroup, select_group
from ibacm.log import get_logger
from ibacm.wire.acm_mad import ACM_METHOD_RESOLVE, AcmMad, acm_response
from ibacm.wire.client import AcmStatus
from ibacm.wire.errors import WireError

if TYPE_CHECKING:
    from ibacm.acmp.endpoint import AcmpEndpoint
    from ibacm.fabric.api import ReceivedMad

log = get_logger("ibacm.acmp")

MAX_ADDRESS_TYPE = 5


class PeerProtocol:
    """Handles what arrives on an endpoint's QP (see the module docstring)."""

    def __init__(self, endpoint: AcmpEndpoint) -> None:
        self.ep = endpoint

    def handle(self, received: ReceivedMad, now: float | None = None) -> None:
        """One received MAD; ``now`` (trio clock) is when its batch was taken from the QP,
        read once for the batch: it stamps the lifetimes of what the MAD teaches."""
        try:
            mad = AcmMad.decode(received.mad)
        except WireError as exc:
            self.ep.stats.bad_mads += 1
            log.debug("dropped a bad MAD", reason=str(exc), slid=received.slid)
            return
        if mad.is_response:
            self._on_response(received, mad, now)
        else:
            self._on_request(received, mad, now)

    # -- responder side -------------------------------------------------------------------

    def _on_request(self, received: ReceivedMad, mad: AcmMad, now: float | None) -> None:
        # Every daemon of a job start receives every other daemon's request: this runs N-1
        # times per daemon, so it keeps to plain attribute reads and reads no clock (the
        # receive loop passes the time its batch was taken).
        ep = self.ep
        if mad.method != ACM_METHOD_RESOLVE or not 1 <= mad.src_type <= MAX_ADDRESS_TYPE:
            ep.stats.bad_mads += 1
            log.debug("dropped a request", method=mad.method, src_type=mad.src_type)
            return
        if not ep.ready:
            return  # no groups to choose from yet; the requester retries
        ep.stats.requests_received += 1
        try:
            key = cache_key(mad.src_type, mad.src)
        except CacheKeyError:
            ep.stats.bad_mads += 1
            return
        targets_us = ep.local_match(mad.dest_type, mad.dest)
        entry = ep.cache.acquire(key)
        if entry.loopback:
            return
        if log.enabled(DEBUG):
            log.debug(
                "acm request received",
                tid=mad.tid,
                src=KeyText(key),
                for_us=targets_us,
                state=entry.state,
            )
        state = entry.state
        if state is EntryState.QUERY_ROUTE:
            # The route is being looked up already: answer when it is known.
            if targets_us:
                entry.reply_tid = mad.tid
            return
        if now is None:
            now = trio.current_time()
        if (
            state is EntryState.INIT
            or state is EntryState.QUERY_ADDR
            or entry.remote_qpn != received.src_qp
            or entry.peer_lid != received.slid
        ):
            # The request tells us something new about its sender.
            group = select_group(mad.gids, ep.joined)
            if group is None:
                self._no_common_group(entry)
                return
            moved = entry.peer_lid not in (0, received.slid) and entry.peer_gid == received.sgid
            self.record_address(entry, received, group, now)
            if moved:
                self._peer_moved(entry, received)
        self._after_request(entry, mad.tid, targets_us, now)

    def _peer_moved(self, updated: DestEntry, received: ReceivedMad) -> None:
        """A peer's LID changed (its request came from a new SLID): the routes cached for its
        other addresses still lead to the old LID. They are forgotten, so the next request
        for them learns the peer again. Rare (a LID change), so a scan is affordable."""
        ep = self.ep
        stale = [
            other
            for other in ep.cache.learned()
            if other is not updated
            and other.peer_gid == received.sgid
            and other.peer_lid != received.slid
        ]
        for other in stale:
            if other.busy:
                ep.cache.forget(other)  # its resolution in progress starts again from INIT
            else:
                ep.cache.remove(other.key)
        ep.stats.peer_moves += 1
        log.info(
            "peer LID changed; its other cached routes dropped",
            peer=KeyText(updated.key),
            lid=received.slid,
            dropped=len(stale),
        )

    def _after_request(self, entry: DestEntry, tid: int, targets_us: bool, now: float) -> None:
        ep = self.ep
        if entry.state is EntryState.ADDR_RESOLVED:
            if ep.resolver.route_now(entry, now):
                pass  # READY now: the route came from the bulk table or the shared group
            elif targets_us or entry.op is not None:
                if targets_us:
                    entry.reply_tid = tid
                if entry.op is None:
                    ep.resolver.start_route(entry)
                else:
                    entry.poke()  # the resolution in progress goes on to the route
                return
            else:
                return  # nobody needs the route yet
        if entry.state is EntryState.READY:
            entry.poke()
            if targets_us:
                self.send_response(entry, tid, AcmStatus.SUCCESS)

    def _no_common_group(self, entry: DestEntry) -> None:
        log.debug("no common multicast group", peer=KeyText(entry.key), state=entry.state)
        if entry.wake is not None:
            entry.wake.complete(
                AcmStatus.ENODATA, "the peer's request names no multicast group we joined"
            )
        elif not entry.busy:
            # Nothing usable was learned: do not keep an empty entry around.
            self.ep.cache.remove(entry.key)

    def record_address(
        self, entry: DestEntry, received: ReceivedMad, group: McGroup, now: float
    ) -> None:
        """What a request or response tells about its sender (mad-protocol.md §6.4)."""
        ep = self.ep
        assert group.av is not None and group.path is not None  # joined groups have both
        # The address vector is built when a response needs it (AcmpEndpoint.peer_av).
        entry.av = None
        entry.route_av = False
        entry.peer_path_bits = received.dlid_path_bits
        entry.mgid = group.mgid
        # The SA query is made of these two when it is needed (DestEntry.route_query).
        entry.query = None
        entry.learned_from = group.path
        entry.peer_gid = received.sgid
        entry.remote_qpn = received.src_qp
        entry.peer_lid = received.slid
        entry.preloaded = False
        ep.cache.address_resolved(entry)
        ep.cache.set_addr_timeout(entry, now, ep.addr_lifetime)
        entry.poke()

    def send_response(self, entry: DestEntry, tid: int, status: int) -> None:
        """Answer a peer's request for our address (mad-protocol.md §6.3)."""
        ep = self.ep
        av = ep.peer_av(entry)
        if av is None or not entry.remote_qpn:
            ep.stats.responses_dropped += 1
            return
        mad = acm_response(tid, entry.mgid, status).encode()
        ep.queue_response(mad, av, entry.remote_qpn)

    # -- requester side -------------------------------------------------------------------

    def _on_response(self, received: ReceivedMad, mad: AcmMad, now: float | None) -> None:
        ep = self.ep
        ep.stats.responses_received += 1
        pending = ep.outstanding.get(mad.tid)
        if pending is None or pending.entry.state is not EntryState.QUERY_ADDR:
            ep.stats.unmatched_responses += 1
            log.debug("unexpected response", tid=mad.tid, slid=received.slid)
            return
        entry = pending.entry
        if not self._from_address_asked(entry, received):
            ep.stats.unmatched_responses += 1
            log.debug("response from the wrong peer", tid=mad.tid, slid=received.slid)
            return
        status = mad.acm_status
        if status != AcmStatus.SUCCESS:
            pending.complete(status, f"the peer (LID {received.slid}) answered status {status}")
            return
        group = select_group(mad.gids, ep.joined)
        if group is None:
            pending.complete(
                AcmStatus.ENODATA, "the peer's answer names no multicast group we joined"
            )
            return
        self.record_address(entry, received, group, trio.current_time() if now is None else now)
        pending.complete(AcmStatus.SUCCESS)

    @staticmethod
    def _from_address_asked(entry: DestEntry, received: ReceivedMad) -> bool:
        """For a GID or LID question, the answer must come from that GID or LID."""
        addr_type, address = key_type(entry.key), key_address(entry.key)
        if addr_type == GID:
            return received.sgid == address[:16]
        if addr_type == LID:
            # The answer comes from the peer's base LID; the LID asked may be one of its
            # 2^LMC LIDs (LMC is at most 7).
            offset = int.from_bytes(address[:2], "big") - received.slid
            return 0 <= offset < 128
        return True

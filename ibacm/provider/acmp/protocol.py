"""The ACM peer protocol of one endpoint, sans I/O: a received MAD in, actions out.

mad-protocol.md §6. ``PeerProtocol.receive`` takes a received MAD (its bytes and where it came
from) and the time, reads what it needs to decide through ``PeerView`` (the cache, our
addresses, the joined groups, the requests we have outstanding) and returns what is to be
done, as h11's ``Connection`` returns events: answer a peer (``SendResponse``), wake the
resolution waiting for news of a peer (``Complete``), see to a learned peer's route
(``RouteWanted``), a peer moved (``PeerMoved``), count something (``Count``). The endpoint's
traffic applies them in order, in the receive loop's round (``EndpointTraffic.apply``). What
a MAD teaches about its sender is written into the cache here (the cache is the protocol's
state); nothing here sends, spawns, sleeps or reads a clock.

Every receiver caches the requester (ARP-like); the target answers with the group it chose.
Hardening beyond C, invisible to C peers:

* a MAD the codec rejects (bad class/version/control, more MGIDs than fit: defects 38) is
  counted (``bad_mads``) and dropped;
* a response is accepted only for a TID outstanding on this endpoint whose entry is still in
  QUERY_ADDR, and for GID/LID questions only from the GID/LID asked about;
* GID and LID requests for our port are answered (C never answered them, defect 45);
* an entry in ADDR_RESOLVED learns the peer's current QPN/LID from its requests (defect 36:
  hosts-file entries kept QPN 1 and their answers were lost);
* a request claiming one of our own addresses as its source is not learned from (it is our
  own multicast coming back, or a spoof).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import DEBUG
from typing import TYPE_CHECKING, Protocol

from ibacm.fabric.api import AddressVector  # at run time: a compiled dataclass's field type
from ibacm.log import get_logger
from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.entry import DestEntry, EntryState, PendingQuery
from ibacm.provider.acmp.groups import McGroup, select_group
from ibacm.provider.acmp.keys import (
    GID,
    LID,
    CacheKeyError,
    KeyText,
    cache_key,
    key_address,
    key_type,
)
from ibacm.provider.acmp.routes import av_from_path, av_to_peer
from ibacm.wire.acm_mad import ACM_METHOD_RESOLVE, AcmMad, acm_response
from ibacm.wire.client import AcmStatus
from ibacm.wire.errors import WireError

if TYPE_CHECKING:
    from ibacm.config.options import Options
    from ibacm.fabric.api import ReceivedMad

log = get_logger("ibacm.provider.acmp")

MAX_ADDRESS_TYPE = 5


class PeerView(Protocol):
    """What the peer protocol reads of its endpoint to decide (the endpoint provides it)."""

    @property
    def ready(self) -> bool:
        """Group 0 is joined: requests are answered and learned from."""

    @property
    def cache(self) -> DestCache:
        """The same object for the view's lifetime (the protocol reads it once)."""

    @property
    def joined(self) -> dict[bytes, McGroup]:
        """Joined groups by MGID: the only groups we advertise and accept. The same object
        for the view's lifetime (the protocol reads it once)."""

    @property
    def outstanding(self) -> Mapping[int, PendingQuery]:
        """Our ACM requests awaiting a response, by TID."""

    @property
    def options(self) -> Options:
        """Read once; a reload hands the new ones to ``PeerProtocol.reload``."""

    def local_match(self, addr_type: int, address: bytes) -> bool:
        """Whether (type, address) is one of ours."""

    def peer_av(self, entry: DestEntry) -> AddressVector | None:
        """The unicast address vector to an entry's peer (``peer_av`` with our port's)."""


# -- actions ---------------------------------------------------------------------------------
# Values, never changed once made (not ``frozen``: a frozen dataclass's ``__init__`` costs a
# call of ``object.__setattr__`` per field, and most MADs make one of these).


@dataclass(slots=True)
class SendResponse:
    """Send ``mad`` (an encoded response) to ``av``, QPN ``qpn``."""

    mad: bytes
    av: AddressVector
    qpn: int


@dataclass(slots=True)
class Complete:
    """News for a resolution waiting on ``query``: its answer (a response to TID ``tid``), or
    the peer's address learned from its own request (``tid`` None). Status 0 is success."""

    query: PendingQuery
    status: int = AcmStatus.SUCCESS
    reason: str = ""
    tid: int | None = None


@dataclass(slots=True)
class RouteWanted:
    """The peer's address is known (ADDR_RESOLVED or QUERY_ROUTE): get its route when it is at
    hand or someone needs it, and answer the peer's request ``tid`` for our address once READY
    (None: the peer did not ask for us)."""

    entry: DestEntry
    tid: int | None


@dataclass(slots=True)
class PeerMoved:
    """A peer came from a new LID: ``dropped`` cached routes to its old LID were forgotten."""

    entry: DestEntry
    lid: int
    dropped: int


@dataclass(slots=True)
class Count:
    """Add one to the endpoint statistic ``tally`` (an ``EndpointStats`` field)."""

    tally: str


BAD_MAD = Count("bad_mads")
REQUEST_RECEIVED = Count("requests_received")
RESPONSE_RECEIVED = Count("responses_received")
UNMATCHED_RESPONSE = Count("unmatched_responses")
RESPONSE_DROPPED = Count("responses_dropped")

Action = SendResponse | Complete | RouteWanted | PeerMoved | Count
Actions = tuple[Action, ...]

_NONE: Actions = ()


def peer_av(
    entry: DestEntry,
    joined: dict[bytes, McGroup],
    sgid_index: Callable[[bytes], int],
    lid_mask: int,
) -> AddressVector | None:
    """The unicast address vector to an entry's peer, built on first use and kept.

    From the route when the route came from the SA or the bulk table; else from the group
    the peer was learned through, to the LID and GID its MAD came from. None when neither is
    known (or that group is no longer joined). ``sgid_index`` and ``lid_mask`` are our port's.
    """
    av = entry.av
    if av is not None:
        return av
    if entry.route_av:
        path = entry.path
        if path is None:
            return None
        av = av_from_path(path, sgid_index(path.sgid), lid_mask)
    else:
        group = joined.get(entry.mgid)
        if entry.learned_from is None or group is None or group.av is None:
            return None
        av = av_to_peer(group.av, entry.peer_lid, entry.peer_gid, entry.peer_path_bits)
    entry.av = av
    return av


class PeerProtocol:
    """What arrives on an endpoint's QP, turned into actions (see the module docstring)."""

    def __init__(self, view: PeerView) -> None:
        self.view = view
        # Read once: typed attributes of our own cost less per MAD than the view's.
        self.cache = view.cache
        self.joined = view.joined
        self.addr_lifetime = view.options.addr_lifetime

    def reload(self, options: Options) -> None:
        """A reload: addresses learned from now on get the new lifetime."""
        self.addr_lifetime = options.addr_lifetime

    def receive(self, received: ReceivedMad, now: float) -> Actions:
        """One received MAD; ``now`` (trio clock) stamps the lifetimes of what it teaches
        (the receive loop reads it once per batch)."""
        try:
            mad = AcmMad.decode(received.mad)
        except WireError as exc:
            log.debug("dropped a bad MAD", reason=str(exc), slid=received.slid)
            return (BAD_MAD,)
        if mad.is_response:
            return self._on_response(received, mad, now)
        return self._on_request(received, mad, now)

    def response(self, entry: DestEntry, tid: int, status: int) -> SendResponse | Count:
        """The answer to a peer's request ``tid`` for our address (mad-protocol.md §6.3)."""
        av = self.view.peer_av(entry)
        if av is None or not entry.remote_qpn:
            return RESPONSE_DROPPED
        return SendResponse(acm_response(tid, entry.mgid, status).encode(), av, entry.remote_qpn)

    # -- responder side -------------------------------------------------------------------

    def _on_request(self, received: ReceivedMad, mad: AcmMad, now: float) -> Actions:
        # Every daemon of a job start receives every other daemon's request: this runs N-1
        # times per daemon, so it keeps to plain attribute reads.
        view = self.view
        if mad.method != ACM_METHOD_RESOLVE or not 1 <= mad.src_type <= MAX_ADDRESS_TYPE:
            log.debug("dropped a request", method=mad.method, src_type=mad.src_type)
            return (BAD_MAD,)
        if not view.ready:
            return _NONE  # no groups to choose from yet; the requester retries
        try:
            key = cache_key(mad.src_type, mad.src)
        except CacheKeyError:
            return (REQUEST_RECEIVED, BAD_MAD)
        targets_us = view.local_match(mad.dest_type, mad.dest)
        entry = self.cache.acquire(key)
        if entry.loopback:
            return (REQUEST_RECEIVED,)
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
                return (REQUEST_RECEIVED, RouteWanted(entry, mad.tid))
            return (REQUEST_RECEIVED,)
        moved: PeerMoved | None = None
        woken: Complete | None = None
        if (
            state is EntryState.INIT
            or state is EntryState.QUERY_ADDR
            or entry.remote_qpn != received.src_qp
            or entry.peer_lid != received.slid
        ):
            # The request tells us something new about its sender.
            group = select_group(mad.gids, self.joined)
            if group is None:
                return self._no_common_group(entry)
            peer_moved = (
                entry.peer_lid not in (0, received.slid) and entry.peer_gid == received.sgid
            )
            self._record_address(entry, received, group, now)
            if peer_moved:
                moved = self._peer_moved(entry, received)
        if entry.wake is not None:
            woken = Complete(entry.wake)
        last: Action | None = None
        state = entry.state
        if state is EntryState.ADDR_RESOLVED:
            last = RouteWanted(entry, mad.tid if targets_us else None)
        elif state is EntryState.READY and targets_us:
            last = self.response(entry, mad.tid, AcmStatus.SUCCESS)
        if moved is None and woken is None:
            # The common case (a job start's requests): one tuple, no list.
            return (REQUEST_RECEIVED,) if last is None else (REQUEST_RECEIVED, last)
        return tuple(
            action for action in (REQUEST_RECEIVED, moved, woken, last) if action is not None
        )

    def _peer_moved(self, updated: DestEntry, received: ReceivedMad) -> PeerMoved:
        """A peer's LID changed (its request came from a new SLID): the routes cached for its
        other addresses still lead to the old LID. They are forgotten, so the next request
        for them learns the peer again. Rare (a LID change), so a scan is affordable."""
        cache = self.cache
        stale = [
            other
            for other in cache.learned()
            if other is not updated
            and other.peer_gid == received.sgid
            and other.peer_lid != received.slid
        ]
        for other in stale:
            if other.busy:
                cache.forget(other)  # its resolution in progress starts again from INIT
            else:
                cache.remove(other.key)
        return PeerMoved(updated, received.slid, len(stale))

    def _no_common_group(self, entry: DestEntry) -> Actions:
        log.debug("no common multicast group", peer=KeyText(entry.key), state=entry.state)
        if entry.wake is not None:
            reason = "the peer's request names no multicast group we joined"
            return (REQUEST_RECEIVED, Complete(entry.wake, AcmStatus.ENODATA, reason))
        if not entry.busy:
            # Nothing usable was learned: do not keep an empty entry around.
            self.cache.remove(entry.key)
        return (REQUEST_RECEIVED,)

    def _record_address(
        self,
        entry: DestEntry,
        received: ReceivedMad,
        group: McGroup,
        now: float,
    ) -> None:
        """What a request or response tells about its sender (mad-protocol.md §6.4)."""
        assert group.av is not None and group.path is not None  # joined groups have both
        # The address vector is built when a response needs it (``PeerView.peer_av``).
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
        cache = self.cache
        cache.address_resolved(entry)
        cache.set_addr_timeout(entry, now, self.addr_lifetime)

    # -- requester side -------------------------------------------------------------------

    def _on_response(self, received: ReceivedMad, mad: AcmMad, now: float) -> Actions:
        view = self.view
        pending = view.outstanding.get(mad.tid)
        if pending is None or pending.entry.state is not EntryState.QUERY_ADDR:
            log.debug("unexpected response", tid=mad.tid, slid=received.slid)
            return (RESPONSE_RECEIVED, UNMATCHED_RESPONSE)
        entry = pending.entry
        if not self._from_address_asked(entry, received):
            log.debug("response from the wrong peer", tid=mad.tid, slid=received.slid)
            return (RESPONSE_RECEIVED, UNMATCHED_RESPONSE)
        status = mad.acm_status
        if status != AcmStatus.SUCCESS:
            reason = f"the peer (LID {received.slid}) answered status {status}"
            return (RESPONSE_RECEIVED, Complete(pending, status, reason, mad.tid))
        group = select_group(mad.gids, self.joined)
        if group is None:
            reason = "the peer's answer names no multicast group we joined"
            return (RESPONSE_RECEIVED, Complete(pending, AcmStatus.ENODATA, reason, mad.tid))
        self._record_address(entry, received, group, now)
        done = Complete(pending, AcmStatus.SUCCESS, "", mad.tid)
        route = RouteWanted(entry, None)
        wake = entry.wake
        if wake is not None and wake is not pending:
            return (RESPONSE_RECEIVED, done, Complete(wake), route)
        return (RESPONSE_RECEIVED, done, route)

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

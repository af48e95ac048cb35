"""An endpoint's side of the peer protocol and the resolver without a fabric or a daemon.

``Side`` provides what an ``AcmpEndpoint`` provides to ``PeerProtocol`` (``PeerView``) and to
``Resolver`` (``ResolverHost``) from real pieces (a ``DestCache``, ``EndpointCounters``,
``Options``, a group 0 joined from an SA grant), and keeps what would leave the endpoint:
the ACM requests it multicasts, the responses it sends, the SA queries it makes (answered
from ``sa_answers``). Received MADs are encoded bytes (``ibacm.wire.acm_mad``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ibacm.config.options import Options
from ibacm.fabric.api import AddressVector, ReceivedMad
from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.counters import EndpointCounters, EndpointStats
from ibacm.provider.acmp.entry import DestEntry, PendingQuery
from ibacm.provider.acmp.groups import GroupSpec, McGroup
from ibacm.provider.acmp.keys import IP, CacheKey, CacheKeyError, cache_key
from ibacm.provider.acmp.protocol import (
    Action,
    Complete,
    Count,
    PeerMoved,
    PeerProtocol,
    RouteWanted,
    SendResponse,
    peer_av,
)
from ibacm.provider.acmp.resolution import Resolver
from ibacm.provider.acmp.routes import SaOutcome, SaQuery, loopback_path, sa_phase_budget
from ibacm.provider.acmp.timers import Timers
from ibacm.provider.acmp.traffic import ResolveCredits
from ibacm.provider.api import Counters
from ibacm.wire.client import AcmStatus
from ibacm.wire.mad import McMemberRecord
from ibacm.wire.path_record import PathRecord

PKEY = 0xFFFF
OUR_GID = bytes.fromhex("fe800000000000000002c90300000001")
OUR_LID = 1
OUR_IP = bytes([10, 0, 0, 1])
PEER_GID = bytes.fromhex("fe800000000000000002c90300000002")
PEER_LID = 2
PEER_QPN = 0x48
PEER_IP = bytes([10, 0, 0, 2])
MLID = 0xC001


class Side:
    """One endpoint's state and outside world (see the module docstring)."""

    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()
        self.subnet_timeout_ms = 0
        self.pkey = PKEY
        self.lid = OUR_LID
        self.gid = OUR_GID
        self.cache = DestCache()
        self.counters = EndpointCounters(Counters())
        self.outstanding: dict[int, PendingQuery] = {}
        self.groups = [McGroup(0, GroupSpec(self.options.min_rate, self.options.min_mtu), PKEY)]
        self.joined: dict[bytes, McGroup] = {}
        self.ready = False
        self.addresses: set[CacheKey] = {cache_key(IP, OUR_IP)}
        self.loopback_local = False
        self.resolve_credits = ResolveCredits(
            1, lambda: self.resolver.attempt_wait / 2, EndpointStats()
        )
        self.timers = Timers()
        """Not running unless a test runs it: then requests go out without a task."""
        self.tid = 0x1000
        self.stats: dict[str, int] = {}
        self.requests: list[bytes] = []
        """ACM requests multicast on group 0."""
        self.responses: list[SendResponse] = []
        self.sa_queries: list[PathRecord] = []
        self.sa_answers: dict[bytes, SaOutcome] = {}
        """By DGID; a DGID not in it is a query the SA does not answer in time."""
        self.failures: list[tuple[str, int, str]] = []
        self.nursery: trio.Nursery | None = None
        self.protocol = PeerProtocol(self)
        self.resolver = Resolver(self)

    @property
    def group0(self) -> McGroup:
        return self.groups[0]

    def join(self) -> None:
        """Group 0 granted by the SA: the endpoint is ready."""
        group = self.group0
        granted = McMemberRecord(
            mgid=group.mgid, port_gid=OUR_GID, qkey=0x80010000, mlid=MLID, pkey=PKEY, sl=0
        )
        group.apply(granted, 0, OUR_LID)
        self.joined[group.mgid] = group
        self.ready = True

    # -- PeerView / ResolverHost ----------------------------------------------------------

    def local_match(self, addr_type: int, address: bytes) -> bool:
        try:
            return cache_key(addr_type, address) in self.addresses
        except CacheKeyError:
            return False

    def peer_av(self, entry: DestEntry) -> AddressVector | None:
        return peer_av(entry, self.joined, lambda gid: 0, 0)

    @property
    def can_ask(self) -> bool:
        return self.group0.joined

    def next_tid(self) -> int:
        self.tid += 1
        return self.tid

    def loopback_route(self) -> PathRecord:
        return loopback_path(OUR_GID, OUR_LID, PKEY, 4, 3)

    def bulk_route(self, dgid: bytes, dlid: int, now: float) -> PathRecord | None:
        return None

    def post_request(self, mad: bytes) -> bool:
        self.requests.append(mad)
        return True

    async def sa_get(self, query: PathRecord) -> SaOutcome:
        self.sa_queries.append(query)
        answer = self.sa_answers.get(query.dgid)
        if answer is not None:
            return answer
        budget = sa_phase_budget(self.options)
        await trio.sleep(budget)  # as ``SaPaths.get``: the phase's budget ends the query
        return SaOutcome(AcmStatus.ETIMEDOUT, reason=f"no SA answer within {budget:g}s")

    def sa_begin(
        self, query: PathRecord, on_outcome: Callable[[SaOutcome], None]
    ) -> SaQuery | None:
        return None  # queries go through ``sa_get`` here (the harness starts them for real)

    def respond(self, entry: DestEntry, tid: int, status: int) -> None:
        self.apply(self.protocol.response(entry, tid, status), math.nan)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        if self.nursery is None:
            return False
        self.nursery.start_soon(fn, *args)
        return True

    def note_failure(self, dest: object, status: int, reason: str) -> None:
        self.failures.append((str(dest), status, reason))

    def publish_entry(self, entry: DestEntry) -> None:
        pass  # nobody subscribes here

    # -- what the endpoint does with received MADs ----------------------------------------

    def receive(self, received: ReceivedMad, now: float | None = None) -> tuple[Action, ...]:
        """The protocol's actions for ``received``, applied as the endpoint applies them
        (``now``: the trio clock by default)."""
        if now is None:
            now = trio.current_time()
        actions = self.protocol.receive(received, now)
        for action in actions:
            self.apply(action, now)
        return actions

    def apply(self, action: Action, now: float) -> None:
        if isinstance(action, Count):
            self.stats[action.tally] = self.stats.get(action.tally, 0) + 1
        elif isinstance(action, SendResponse):
            self.responses.append(action)
        elif isinstance(action, Complete):
            action.query.complete(action.status, action.reason)
        elif isinstance(action, RouteWanted):
            self.resolver.peer_asked(action.entry, action.tid, now)
        else:
            assert isinstance(action, PeerMoved)
            self.stats["peer_moves"] = self.stats.get("peer_moves", 0) + 1


def from_peer(
    mad: bytes,
    gid: bytes = PEER_GID,
    lid: int = PEER_LID,
    qpn: int = PEER_QPN,
    mgid: bytes = bytes(16),
) -> ReceivedMad:
    """``mad`` as our QP receives it from (gid, lid, qpn)."""
    return ReceivedMad(mad=mad, sgid=gid, dgid=mgid, slid=lid, src_qp=qpn)

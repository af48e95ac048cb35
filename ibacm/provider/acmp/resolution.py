"""Client resolutions on one endpoint: the cache state machine of behavior.md §9.3 and §10.

A cache entry has at most one resolution (``Operation``) in progress, run by one task in the
endpoint's nursery that walks the entry from where it is to READY:

* address phase (INIT/QUERY_ADDR): an ACM request multicast on group 0, sent up to
  ``retries + 1`` times, each followed by ``timeout + subnet timeout`` of waiting; a
  ``resolve_depth`` credit is held meanwhile;
* route phase (ADDR_RESOLVED/QUERY_ROUTE): a route from the bulk table, from the shared group
  (route_prot acm), else an SA PathRecord query.

When a peer's MAD (its answer, or its own request) makes the entry READY in the receive
loop's round, the route coming from the bulk table or the shared group, the operation ends in
that round: its clients are answered without waiting for the task to wake up (which then
finds its work done).

Each phase, credit waits included, is bounded by its budget (``timeout x (retries + 1)``), so a
parked request ends at the latest after one budget per phase. Clients park by awaiting the
operation; NODELAY answers ENODATA at once while the resolution goes on. Whatever ends an
operation (success, failure, the endpoint closing) ends it for all its waiters at once, with
one status. A peer that asked for our address while the route was unknown is answered when
the route phase ends: with success, or, when the SA gave a definite failure (e.g. no
records), with that status, which C requesters accept and pass on to their clients at once
(C stayed silent and its requesters waited for their full timeout, defect 43). When the SA
did not answer in time we stay silent like C: the requester retransmits with the same TID,
and that retransmission starts a new route query here.

The resolver does not know the endpoint: it works through ``ResolverHost``, what an endpoint
provides (its cache, counters, options, groups, a multicast send, the SA, its responses to
peers). The peer protocol's ``RouteWanted`` actions come here (``peer_asked``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ibacm.config.option_values import RouteProt
from ibacm.log import get_logger
from ibacm.provider.acmp.entry import DestEntry, EntryState, Operation, PendingQuery
from ibacm.provider.acmp.groups import McGroup, joined_mgids
from ibacm.provider.acmp.keys import (
    GID,
    LID,
    CacheKey,
    CacheKeyError,
    KeyText,
    cache_key,
    gid_key,
    key_address,
    key_type,
    lid_key,
)
from ibacm.provider.acmp.routes import (
    SaOutcome,
    SaQuery,
    path_from_group,
    path_query,
    sa_phase_budget,
)
from ibacm.provider.acmp.timers import Timer, Timers
from ibacm.provider.api import Counter
from ibacm.wire.acm_mad import acm_request
from ibacm.wire.client import AcmStatus, EpAddr
from ibacm.wire.path_record import AimablePath, PathRecord

if TYPE_CHECKING:
    from ibacm.config.options import Options
    from ibacm.provider.acmp.cache import DestCache
    from ibacm.provider.acmp.counters import EndpointCounters

log = get_logger("ibacm.provider.acmp")

WAIT_GRACE = 1.0
"""Seconds a parked request allows beyond the phase budgets before it gives up by itself
(the phases end themselves well before; this only guards against a lost wake-up)."""

MAX_STEPS = 6

Outcome = tuple[int, str]
Answer = tuple[int, "PathRecord | None"]
"""A client request's answer: (status, the route on success)."""


class _Waiting:
    """A request's resolution goes on: the entry and the operation to wait for."""

    __slots__ = ("entry", "op")

    def __init__(self, entry: DestEntry, op: Operation) -> None:
        self.entry = entry
        self.op = op


"""An ACM status and, for a failure, why (in words)."""
NOT_READY = "the endpoint has not joined its multicast group 0 yet (or rejoins)"
CLOSED = "the endpoint closed"
NO_ROUTE_QUERY = "no route query: the peer's address is not known"


def _path_key(request: PathRecord) -> CacheKey:
    return lid_key(request.dlid) if request.dlid else gid_key(request.dgid)


class Credits(AbstractAsyncContextManager[None], Protocol):
    """The ``resolve_depth`` credits (``traffic.ResolveCredits``): held by a task through
    ``async with``, or by a request sent without one through ``try_take``/``give_back``."""

    def try_take(self, holder: object) -> bool: ...

    def give_back(self, holder: object) -> None: ...


class ResolverHost(Protocol):
    """What a resolver uses of its endpoint (the endpoint provides it)."""

    @property
    def ready(self) -> bool:
        """Group 0 is joined: resolutions may start."""

    @property
    def options(self) -> Options:
        """Read once; a reload hands the new ones to ``Resolver.reload``."""

    @property
    def subnet_timeout_ms(self) -> int:
        """Added to each wait for an answer (behavior.md §8)."""

    @property
    def cache(self) -> DestCache:
        """The same object for the host's lifetime (read once), as ``counters``, ``joined``."""

    @property
    def counters(self) -> EndpointCounters: ...

    @property
    def outstanding(self) -> dict[int, PendingQuery]:
        """Our ACM requests awaiting a response, by TID (the peer protocol matches them)."""

    @property
    def groups(self) -> list[McGroup]: ...

    @property
    def joined(self) -> dict[bytes, McGroup]: ...

    @property
    def pkey(self) -> int: ...

    @property
    def lid(self) -> int:
        """Our port's LID (the source of path-form queries)."""

    @property
    def gid(self) -> bytes:
        """Our port's GID."""

    @property
    def loopback_local(self) -> bool: ...

    @property
    def can_ask(self) -> bool:
        """An ACM request can go out now (group 0 joined, the QP open)."""

    @property
    def resolve_credits(self) -> Credits:
        """Held while an ACM request is out (``resolve_depth``); replaced whole by a reload."""

    @property
    def timers(self) -> Timers:
        """The endpoint's timer task: retransmissions of requests sent without a task."""

    def next_tid(self) -> int: ...

    def local_match(self, addr_type: int, address: bytes) -> bool: ...

    def loopback_route(self) -> PathRecord: ...

    def bulk_route(self, dgid: bytes, dlid: int, now: float) -> PathRecord | None: ...

    def post_request(self, mad: bytes) -> bool:
        """Multicast an ACM request on group 0, posted now; False once the QP is closed."""

    def sa_get(self, query: PathRecord) -> Awaitable[SaOutcome]:
        """An SA PathRecord query within the route phase's budget."""

    def sa_begin(
        self, query: PathRecord, on_outcome: Callable[[SaOutcome], None]
    ) -> SaQuery | None:
        """``sa_get`` sent now, its outcome given to ``on_outcome`` (once; in the round that
        reads a usable answer). None: it cannot go out now; ``sa_get`` waits its turn."""

    def respond(self, entry: DestEntry, tid: int, status: int) -> None:
        """Answer the peer's request ``tid`` for our address."""

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """Run a task in the endpoint's nursery; False once it stopped."""

    def note_failure(self, dest: object, status: int, reason: str) -> None: ...

    def publish_entry(self, entry: DestEntry) -> None: ...


class Resolver:
    """Client-driven and peer-driven resolutions of one endpoint."""

    def __init__(self, host: ResolverHost) -> None:
        self.ep = host
        # Read once: typed attributes of our own cost less per use than the host's.
        self.cache = host.cache
        self.counters = host.counters
        self.joined = host.joined
        self.reload(host.options)

    def reload(self, options: Options) -> None:
        """A reload: later reads of the options (timeouts, retries, route_prot) see
        ``options``; entries made READY from now on get the new lifetimes."""
        self.options = options
        self.addr_lifetime = options.addr_lifetime
        self.route_lifetime = options.route_lifetime

    # -- budgets --------------------------------------------------------------------------

    @property
    def attempt_wait(self) -> float:
        """Seconds to wait for a response after each transmission (mad-protocol.md §7)."""
        return (self.options.timeout + self.ep.subnet_timeout_ms) / 1000.0

    @property
    def address_budget(self) -> float:
        return self.attempt_wait * (self.options.retries + 1)

    @property
    def route_budget(self) -> float:
        return sa_phase_budget(self.options)

    # -- client requests ------------------------------------------------------------------

    async def resolve_address(
        self, source: EpAddr, dest: EpAddr, nodelay: bool
    ) -> tuple[int, PathRecord | None]:
        """Address form (behavior.md §10.2)."""
        started = self._begin_address(source, dest, nodelay)
        if not isinstance(started, _Waiting):
            return started
        return await self._park(started.entry, started.op, nodelay)

    def begin_address(
        self, source: EpAddr, dest: EpAddr, nodelay: bool, done: Callable[[Answer], None]
    ) -> None:
        """``resolve_address`` without a task: ``done`` gets its answer, at once when it is
        at hand, else from the round that ends the resolution (``Operation.finish``)."""
        started = self._begin_address(source, dest, nodelay)
        if not isinstance(started, _Waiting):
            done(started)
            return
        if nodelay:
            done(self._nodelay())
            return
        entry, op = started.entry, started.op
        if op.finished:  # ended already (the endpoint closed before the task could start)
            done(self._parked(entry, op))
            return
        # The operation always finishes: ``_drive`` ends it in a ``finally`` (budgets, close),
        # and so does ``_end`` itself should anything before its ``finish`` fail.
        op.callbacks.append(lambda ended: done(self._parked(entry, ended)))

    def _begin_address(self, source: EpAddr, dest: EpAddr, nodelay: bool) -> Answer | _Waiting:
        """What ``resolve_address`` does before it waits: the answer, when it is at hand;
        else the entry and the operation to wait for (started now, when none was)."""
        ep = self.ep
        counters = self.counters
        if not ep.ready:
            counters.endpoint_only(Counter.NODATA)
            ep.note_failure(dest.address_text(), AcmStatus.ENODATA, NOT_READY)
            return AcmStatus.ENODATA, None
        counters.endpoint_only(Counter.RESOLVE)
        try:
            key = cache_key(dest.type, dest.info)
        except CacheKeyError as exc:
            counters.endpoint_only(Counter.ERROR)
            log.debug("cannot resolve", reason=str(exc))
            return AcmStatus.EDESTTYPE, None
        if key[0] in (GID, LID) and ep.local_match(key[0], key[1:]) and ep.loopback_local:
            # Our own port by GID or LID: as local as our addresses (C asked the fabric,
            # where nobody answered).
            counters.both(Counter.ROUTE_CACHE)
            return AcmStatus.SUCCESS, ep.loopback_route()
        entry = self.cache.acquire(key)
        self.cache.check_lifetimes(entry, trio.current_time())
        if entry.state is EntryState.READY:
            # No log line here (a filtered debug call costs more than the hit). The client
            # loop answers most hits from the route table before they come here.
            counters.both(Counter.ROUTE_CACHE)
            entry.hits += 1
            return AcmStatus.SUCCESS, entry.path
        log.debug("resolve", dest=KeyText(key), state=entry.state, nodelay=nodelay)
        op = entry.op
        if op is None:
            if entry.state is EntryState.ADDR_RESOLVED:
                counters.both(Counter.ADDR_CACHE)
                if self.route_now(entry, trio.current_time()):
                    return AcmStatus.SUCCESS, entry.path
            op = self._start(entry, source)
        return _Waiting(entry, op)

    async def resolve_path(
        self, request: PathRecord, nodelay: bool
    ) -> tuple[int, PathRecord | None]:
        """Path form (behavior.md §10.3): keyed by DLID, else DGID; the route from the SA."""
        ep = self.ep
        counters = self.counters
        if not ep.ready:
            counters.endpoint_only(Counter.NODATA)
            ep.note_failure(KeyText(_path_key(request)), AcmStatus.ENODATA, NOT_READY)
            return AcmStatus.ENODATA, None
        counters.endpoint_only(Counter.RESOLVE)
        key = _path_key(request)
        entry = self.cache.acquire(key)
        self.cache.check_lifetimes(entry, trio.current_time())
        log.debug("resolve path", dest=KeyText(key), state=entry.state, nodelay=nodelay)
        if entry.state is EntryState.READY:
            counters.both(Counter.ROUTE_CACHE)
            entry.hits += 1
            return AcmStatus.SUCCESS, entry.path
        op = entry.op
        if op is None:
            if entry.state is EntryState.INIT or entry.route_dest() is None:
                entry.query = path_query(request, ep.pkey, ep.lid, ep.gid)
                self.cache.set_state(entry, EntryState.ADDR_RESOLVED)
            op = self._start(entry, None)
        return await self._park(entry, op, nodelay)

    async def _park(self, entry: DestEntry, op: Operation, nodelay: bool) -> Answer:
        if nodelay:
            return self._nodelay()
        op.waiters += 1
        try:
            with trio.move_on_after(self.address_budget + self.route_budget + WAIT_GRACE):
                await op.done.wait()
        finally:
            op.waiters -= 1
        return self._parked(entry, op)

    def _nodelay(self) -> Answer:
        """NODELAY on a miss: ENODATA at once; the resolution goes on."""
        self.counters.endpoint_only(Counter.NODATA)
        return AcmStatus.ENODATA, None

    def _parked(self, entry: DestEntry, op: Operation) -> Answer:
        """The answer of a request that waited for ``op`` (ended, or past its budgets)."""
        status = op.status if op.finished else AcmStatus.ETIMEDOUT
        if status == AcmStatus.SUCCESS and op.path is not None:
            return AcmStatus.SUCCESS, op.path
        if not op.finished:
            reason = "the resolution did not end within its budgets"
            self.ep.note_failure(KeyText(entry.key), status, reason)
        if status == AcmStatus.SUCCESS:
            status = AcmStatus.ENODATA
        counters = self.counters
        counters.endpoint_only(Counter.NODATA if status == AcmStatus.ENODATA else Counter.ERROR)
        return status, None

    # -- operations -----------------------------------------------------------------------

    def peer_asked(self, entry: DestEntry, tid: int | None, now: float) -> None:
        """The peer protocol's ``RouteWanted``: a peer's request taught or confirmed the
        entry's address. Its route is taken at once when known here; else looked up when
        someone needs it: a client's resolution in progress, or the peer itself, which
        asked for our address (request ``tid``) and is answered once the route is known."""
        state = entry.state
        if state is EntryState.QUERY_ROUTE:
            if tid is not None:
                entry.reply_tid = tid  # answered when the route phase ends
            return
        if state is EntryState.READY:
            # Made READY in this round, by the same MAD ending a resolution's address phase
            # (``address_answered``): the peer that asked for our address gets its answer.
            if tid is not None:
                self.ep.respond(entry, tid, AcmStatus.SUCCESS)
            return
        if state is not EntryState.ADDR_RESOLVED:
            return
        if self.route_now(entry, now):
            # READY now: the route came from the bulk table or the shared group.
            if tid is not None:
                self.ep.respond(entry, tid, AcmStatus.SUCCESS)
            op = entry.op
            if op is not None:
                # The clients waiting for it are answered in this round (the receive loop's),
                # not after their resolution's task has woken up to find the entry READY.
                self._end(entry, op, AcmStatus.SUCCESS)
            return
        if tid is None and entry.op is None:
            return  # nobody needs the route yet
        if tid is not None:
            entry.reply_tid = tid
        if entry.op is None:
            self._start(entry, None)
        else:
            entry.poke()  # the resolution in progress goes on to the route

    def _start(self, entry: DestEntry, source: EpAddr | None) -> Operation:
        op = Operation()
        entry.op = op
        cache = self.cache
        if entry.state is EntryState.INIT:
            cache.set_state(entry, EntryState.QUERY_ADDR)
        if entry.state is EntryState.QUERY_ADDR:
            # From now on a peer's request or response can complete the address phase.
            wake = entry.wake = PendingQuery(entry)
            if source is not None and self._ask_now(entry, op, source, wake):
                return op
        elif entry.state is EntryState.ADDR_RESOLVED:
            self._begin_route(entry, op)
            return op
        if not self.ep.spawn(self._drive, entry, op, source):
            self._end(entry, op, AcmStatus.ENODATA, CLOSED)
        return op

    def _ask_now(
        self, entry: DestEntry, op: Operation, source: EpAddr, pending: PendingQuery
    ) -> bool:
        """The address phase without a task (``AddressFlight``): the ACM request posted in
        this round. False when it cannot go out at once (no free credit, the endpoint not
        able to ask): the resolution's task does that phase, waiting as it must."""
        ep = self.ep
        if not ep.timers.running or not ep.can_ask:
            return False
        flight = AddressFlight(self, entry, op, source, pending, ep.resolve_credits)
        if not flight.credits.try_take(flight):
            return False
        flight.launch(trio.current_time())
        return True

    def address_answered(self, flight: AddressFlight) -> None:
        """News of the peer ended a flight's address phase (in the round that brought it):
        the route now when it is known here, else the route phase in a task."""
        entry, op, pending = flight.entry, flight.op, flight.pending
        flight.land()
        if op.finished:
            return  # ended meanwhile: whatever became of the entry is another's business
        if pending.status != AcmStatus.SUCCESS:
            self._end(entry, op, pending.status, pending.reason)
            return
        state = entry.state
        if state is EntryState.READY:
            self._end(entry, op, AcmStatus.SUCCESS)
        elif state in (EntryState.ADDR_RESOLVED, EntryState.QUERY_ROUTE):
            self._begin_route(entry, op)
        elif not self.ep.spawn(self._drive, entry, op, flight.source):
            self._end(entry, op, AcmStatus.ENODATA, CLOSED)

    def _begin_route(self, entry: DestEntry, op: Operation) -> None:
        """The route phase from the round that needs it: the route at once when it is known
        here (``route_now``), else the SA query sent now (``SaQuery``), its answer ending
        the resolution in the round that reads it; else the phase in the resolution's task."""
        if self.route_now(entry, trio.current_time()):
            self._end(entry, op, AcmStatus.SUCCESS)
            return
        # At once: a peer's request in this round waits for the route (``peer_asked``).
        self.cache.set_state(entry, EntryState.QUERY_ROUTE)
        query = self._sa_query(entry)
        if query is None:
            self._end(entry, op, AcmStatus.ENODATA, NO_ROUTE_QUERY)
            return

        def answered(outcome: SaOutcome) -> None:
            self._route_answered(entry, op, outcome)

        started = self.ep.sa_begin(query, answered)
        if started is None:
            if not self.ep.spawn(self._drive, entry, op, None):
                self._end(entry, op, AcmStatus.ENODATA, CLOSED)
            return
        self.counters.both(Counter.ROUTE_QUERY)
        if not self.ep.spawn(started.run):
            started.abandon()
            self._end(entry, op, AcmStatus.ENODATA, CLOSED)

    def _route_answered(self, entry: DestEntry, op: Operation, outcome: SaOutcome) -> None:
        if not op.finished:
            self._end(entry, op, *self._routed(entry, outcome))

    def _sa_query(self, entry: DestEntry) -> PathRecord | None:
        """The SA PathRecord query of the entry's route phase (None: no address known)."""
        query = entry.route_query()
        if query is not None and not any(query.sgid):
            # Hosts-file entries: our port is the source (C looked it up by the client's IP).
            query.sgid = self.ep.gid
        return query

    def _routed(self, entry: DestEntry, outcome: SaOutcome) -> Outcome:
        """The route phase's end with the SA's answer: the entry READY with its record."""
        if outcome.status != AcmStatus.SUCCESS or outcome.record is None:
            reason = outcome.reason or f"the SA answered the PathRecord query {outcome.status}"
            return outcome.status or AcmStatus.ENODATA, reason
        if entry.state is not EntryState.QUERY_ROUTE:
            # The entry was dropped meanwhile (address removed).
            return AcmStatus.ENODATA, "the entry was dropped during the SA query"
        self._make_ready(entry, outcome.record, trio.current_time(), keep_av=False)
        return AcmStatus.SUCCESS, ""

    def address_timed_out(self, flight: AddressFlight) -> None:
        flight.land()
        log.debug("acm request timed out", dest=KeyText(flight.entry.key))
        self._end(flight.entry, flight.op, AcmStatus.ETIMEDOUT, self._no_answer())

    def _no_answer(self) -> str:
        return (
            f"no answer to the ACM request within {self.address_budget:g} s "
            f"({self.options.retries + 1} transmissions)"
        )

    async def _drive(self, entry: DestEntry, op: Operation, source: EpAddr | None) -> None:
        # What is left if we are cancelled: the endpoint closed.
        outcome: Outcome = (AcmStatus.ENODATA, CLOSED)
        try:
            outcome = await self._advance(entry, op, source)
        finally:
            self._end(entry, op, *outcome)

    def _end(self, entry: DestEntry, op: Operation, status: int, reason: str = "") -> None:
        if op.finished and op.status == AcmStatus.SUCCESS:
            return  # ended in the round that made its entry READY (``peer_asked``)
        try:
            self._close_out(entry, op, status, reason)
        finally:
            # Whatever failed above, whoever waits (a task, a client's callback) is answered.
            op.finish(AcmStatus.ENODATA, reason or "the resolution's end failed")

    def _close_out(self, entry: DestEntry, op: Operation, status: int, reason: str) -> None:
        ready = status == AcmStatus.SUCCESS and entry.state is EntryState.READY
        if not ready and status == AcmStatus.SUCCESS:
            status = AcmStatus.ENODATA
            reason = reason or f"the entry ended in {entry.state.name}, not READY"
        if entry.reply_tid is not None:
            tid, entry.reply_tid = entry.reply_tid, None
            # A definite answer goes back to the peer at once. After a timeout we stay
            # silent, as C: the peer's retransmission (same TID) makes us try again.
            if status != AcmStatus.ETIMEDOUT:
                self.ep.respond(entry, tid, status)
        if not ready and entry.state is not EntryState.READY:
            self.cache.forget(entry)
            self.ep.publish_entry(entry)
        entry.wake = None
        if entry.op is op:
            entry.op = None
        op.path = entry.path if ready else None
        op.finish(status, reason)
        if ready:
            log.debug("resolution ended", dest=KeyText(entry.key), status=status)
        else:
            self.ep.note_failure(KeyText(entry.key), status, reason)

    async def _advance(self, entry: DestEntry, op: Operation, source: EpAddr | None) -> Outcome:
        for _ in range(MAX_STEPS):
            if op.finished:
                # Ended meanwhile (``peer_asked``, the endpoint closing): whatever became of
                # the entry since is another resolution's business.
                return op.status, op.reason or "the resolution was ended meanwhile"
            state = entry.state
            if state is EntryState.READY:
                return AcmStatus.SUCCESS, ""
            if state in (EntryState.INIT, EntryState.QUERY_ADDR):
                if source is None:
                    # Only a client's request can start an ACM query.
                    return AcmStatus.ENODATA, "the peer's address was forgotten meanwhile"
                outcome = await self._address_phase(entry, source)
            else:
                outcome = await self._route_phase(entry)
            if outcome[0] != AcmStatus.SUCCESS:
                return outcome
        return AcmStatus.ENODATA, f"the entry was not READY after {MAX_STEPS} phases"

    # -- address phase --------------------------------------------------------------------

    async def _address_phase(self, entry: DestEntry, source: EpAddr) -> Outcome:
        ep = self.ep
        if entry.state is EntryState.INIT:
            self.cache.set_state(entry, EntryState.QUERY_ADDR)
        pending = entry.wake
        if pending is None:
            pending = entry.wake = PendingQuery(entry)
        with trio.move_on_after(self.address_budget):
            async with ep.resolve_credits:
                if not pending.done.is_set():
                    await self._ask(entry, source, pending)
        if entry.wake is pending:
            entry.wake = None
        if not pending.done.is_set():
            log.debug("acm request timed out", dest=KeyText(entry.key))
            return AcmStatus.ETIMEDOUT, self._no_answer()
        return pending.status, pending.reason

    async def _ask(self, entry: DestEntry, source: EpAddr, pending: PendingQuery) -> None:
        """Send the request up to retries + 1 times until answered (mad-protocol.md §7)."""
        ep = self.ep
        if not ep.can_ask:
            pending.complete(AcmStatus.ENODATA, NOT_READY)
            return
        tid, mad = self.open_request(entry, source, pending)
        try:
            for attempt in range(self.options.retries + 1):
                log.debug("acm request", tid=tid, attempt=attempt)
                if not ep.post_request(mad):
                    return  # the endpoint closed
                with trio.move_on_after(self.attempt_wait):
                    await pending.done.wait()
                if pending.done.is_set():
                    return
        finally:
            ep.outstanding.pop(tid, None)

    def open_request(
        self, entry: DestEntry, source: EpAddr, pending: PendingQuery
    ) -> tuple[int, bytes]:
        """A new ACM request for ``entry``'s address, counted and outstanding (its answer
        completes ``pending``): its TID and bytes."""
        ep = self.ep
        tid = ep.next_tid()
        addr_type, address = key_type(entry.key), key_address(entry.key)
        mad = acm_request(
            tid, addr_type, address, source.type, source.info, joined_mgids(ep.groups)
        ).encode()
        self.counters.both(Counter.ADDR_QUERY)
        ep.outstanding[tid] = pending
        return tid, mad

    # -- route phase ----------------------------------------------------------------------

    def route_from_group(self, entry: DestEntry, now: float) -> bool:
        """route_prot acm: make the entry READY from the group both sides share (§12.1)."""
        group = self.joined.get(entry.mgid)
        dest = entry.route_dest()
        if group is None or group.path is None or group.route is None or dest is None:
            return False
        if entry.learned_from is None and entry.av is None:
            return False  # no address vector to the peer either (a hosts-file entry)
        if dest[0] != entry.route_gid():
            # Not the GID the entry's route is aimed at on demand: keep a route of its own.
            self._make_ready(entry, path_from_group(group.path, dest[0], entry.peer_lid), now)
        else:
            self._make_ready(entry, None, now, group_route=group.route)
        return True

    def route_now(self, entry: DestEntry, now: float) -> bool:
        """Make an ADDR_RESOLVED entry READY at once when its route is known here: from the
        bulk table, or (route_prot acm) from the group both sides share. Saves a task and a
        wake-up per resolution in an all-to-all job start."""
        if entry.state is not EntryState.ADDR_RESOLVED:
            return False
        if self.options.route_bulk_preload:  # a table only then (its change reopens us)
            dest = entry.route_dest()
            if dest is None:
                return False
            table_path = self.ep.bulk_route(dest[0], dest[1], now)
            if table_path is not None:
                self._make_ready(entry, table_path, now, keep_av=False)
                return True
        return self.options.route_prot is RouteProt.ACM and self.route_from_group(entry, now)

    async def _route_phase(self, entry: DestEntry) -> Outcome:
        ep = self.ep
        self.cache.set_state(entry, EntryState.QUERY_ROUTE)
        query = self._sa_query(entry)
        if query is None:
            return AcmStatus.ENODATA, NO_ROUTE_QUERY
        now = trio.current_time()
        table_path = ep.bulk_route(query.dgid, query.dlid, now)
        if table_path is not None:
            self._make_ready(entry, table_path, now, keep_av=False)
            return AcmStatus.SUCCESS, ""
        if self.options.route_prot is RouteProt.ACM and self.route_from_group(entry, now):
            return AcmStatus.SUCCESS, ""
        self.counters.both(Counter.ROUTE_QUERY)
        return self._routed(entry, await ep.sa_get(query))

    def _make_ready(
        self,
        entry: DestEntry,
        path: PathRecord | None,
        now: float,
        *,
        keep_av: bool = True,
        group_route: AimablePath | None = None,
    ) -> None:
        """READY with ``path``, or (route_prot acm) with the group record ``group_route``
        aimed at the peer when asked for (``DestEntry.path``)."""
        ep = self.ep
        if not keep_av:
            entry.av = None  # built from the path when a response needs it
            entry.route_av = True
        if not entry.peer_lid and path is not None:
            entry.peer_lid = path.dlid
        self.cache.make_ready(
            entry, now, self.addr_lifetime, self.route_lifetime, path, group_route=group_route
        )
        ep.publish_entry(entry)
        entry.poke()


class AddressFlight:
    """An address phase without a task (``Resolver._ask_now``): the ACM request posted in the
    round that started the resolution, holding a ``resolve_depth`` credit; sent again by the
    endpoint's timer task (``Timers``) up to ``retries`` times, each after ``attempt_wait``
    seconds; ended in the round that brings the peer's news (``PendingQuery.on_done``), by
    the last time-out, or by the operation ending first (its ``callbacks``)."""

    __slots__ = (
        "credits",
        "entry",
        "landed",
        "mad",
        "op",
        "pending",
        "resolver",
        "sent",
        "source",
        "tid",
        "timer",
    )

    def __init__(
        self,
        resolver: Resolver,
        entry: DestEntry,
        op: Operation,
        source: EpAddr,
        pending: PendingQuery,
        credits: Credits,
    ) -> None:
        self.resolver = resolver
        self.entry = entry
        self.op = op
        self.source = source
        self.pending = pending
        self.credits = credits
        """The credits the credit came from (a reload may replace the endpoint's)."""
        self.tid = 0
        self.mad = b""
        self.sent = 0
        self.timer: Timer | None = None
        self.landed = False

    def launch(self, now: float) -> None:
        self.tid, self.mad = self.resolver.open_request(self.entry, self.source, self.pending)
        self.pending.on_done = self.answered
        # However the operation ends (a peer, a removed address, the endpoint closing).
        self.op.callbacks.append(self.landed_with)
        self.transmit(now)

    def landed_with(self, _: Operation) -> None:
        self.land()

    def transmit(self, now: float) -> None:
        resolver = self.resolver
        log.debug("acm request", tid=self.tid, attempt=self.sent)
        self.sent += 1
        if not resolver.ep.post_request(self.mad):
            self.close()  # the QP is closed: the endpoint is closing
            return
        self.timer = resolver.ep.timers.at(now + resolver.attempt_wait, self)

    def answered(self) -> None:
        if not self.landed:
            self.resolver.address_answered(self)

    def fire(self, now: float) -> None:
        """The timer: send again, or give up after ``retries + 1`` transmissions."""
        if self.landed:
            return
        resolver = self.resolver
        if self.sent <= resolver.options.retries:
            self.transmit(now)
        else:
            resolver.address_timed_out(self)

    def close(self) -> None:
        """The endpoint closed (its timer task ended) with the request still out."""
        if not self.landed:
            self.land()
            self.resolver._end(self.entry, self.op, AcmStatus.ENODATA, CLOSED)

    def land(self) -> None:
        """Over: the timer, the TID and the credit are given up (once)."""
        if self.landed:
            return
        self.landed = True
        if self.timer is not None:
            self.resolver.ep.timers.cancel(self.timer)
        outstanding = self.resolver.ep.outstanding
        if outstanding.get(self.tid) is self.pending:
            del outstanding[self.tid]
        self.credits.give_back(self)
        pending = self.pending
        pending.on_done = None
        if self.entry.wake is pending:
            self.entry.wake = None

"""The resolver on its own: client resolutions and peers' requests through ``ResolverHost``.

``Side`` (sans_io.py) is the endpoint: real cache, counters, options and group 0; the ACM
requests it multicasts are kept as bytes, peers' MADs come in as bytes through the real peer
protocol, and the SA answers from a table. The clock is trio's mock clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from ibacm.config.option_values import RouteProt
from ibacm.config.options import Options
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.keys import IP, cache_key
from ibacm.provider.acmp.resolution import CLOSED, NOT_READY, Answer
from ibacm.provider.acmp.routes import SaOutcome
from ibacm.provider.api import Counter
from ibacm.wire.acm_mad import ACM_METHOD_RESOLVE, AcmMad, acm_request, acm_response
from ibacm.wire.client import AcmStatus, AddrType, EpAddr, EpFlag, pad_address
from ibacm.wire.path_record import PathRecord
from tests.provider.acmp.sans_io import (
    OUR_GID,
    OUR_IP,
    PEER_GID,
    PEER_IP,
    PEER_LID,
    Side,
    from_peer,
)

SOURCE = EpAddr(0, AddrType.IP, pad_address(AddrType.IP, OUR_IP))
DEST = EpAddr(0, AddrType.IP, pad_address(AddrType.IP, PEER_IP))
ROUTE = PathRecord(sgid=OUR_GID, dgid=PEER_GID, slid=1, dlid=PEER_LID, pkey=0xFFFF, mtu=4)
PEER_KEY = cache_key(IP, PEER_IP)

pytestmark = pytest.mark.trio


def counted(side: Side, counter: Counter) -> int:
    return side.counters.local.snapshot()[int(counter)]


def answered_by_the_sa() -> Side:
    """A ready side whose SA knows the route to the peer."""
    side = Side()
    side.join()
    side.sa_answers[PEER_GID] = SaOutcome(AcmStatus.SUCCESS, ROUTE)
    return side


@asynccontextmanager
async def resolving(side: Side) -> AsyncIterator[list[Answer]]:
    """A client resolving the peer in a task of its own, parked by the time this yields;
    its answer is in the list once the block ends."""
    answers: list[Answer] = []

    async def resolve() -> None:
        answers.append(await side.resolver.resolve_address(SOURCE, DEST, False))

    async with trio.open_nursery() as nursery:
        side.nursery = nursery
        nursery.start_soon(resolve)
        await trio.testing.wait_all_tasks_blocked()
        yield answers


async def test_an_address_resolution_asks_the_peers_then_the_sa(
    autojump_clock: trio.testing.MockClock,
) -> None:
    side = answered_by_the_sa()
    async with resolving(side) as answers:
        (sent,) = side.requests
        asked = AcmMad.decode(sent)
        assert asked.method == ACM_METHOD_RESOLVE and asked.gids == [side.group0.mgid]
        assert (asked.dest_type, asked.dest[:4], asked.src[:4]) == (IP, PEER_IP, OUR_IP)
        assert list(side.outstanding) == [asked.tid]
        side.receive(from_peer(acm_response(asked.tid, side.group0.mgid).encode()))
    assert answers == [(AcmStatus.SUCCESS, ROUTE)]
    (query,) = side.sa_queries
    assert query.dgid == PEER_GID and query.sgid == OUR_GID
    entry = side.cache.get(PEER_KEY)
    assert entry is not None and entry.state is EntryState.READY and entry.peer_lid == PEER_LID
    assert counted(side, Counter.ADDR_QUERY) == 1 and counted(side, Counter.ROUTE_QUERY) == 1
    assert side.outstanding == {}


async def test_an_unanswered_request_is_sent_retries_plus_one_times_then_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    side = Side()
    side.join()
    async with trio.open_nursery() as nursery:
        side.nursery = nursery
        started = trio.current_time()
        status, path = await side.resolver.resolve_address(SOURCE, DEST, False)
        took = trio.current_time() - started
    assert (status, path) == (AcmStatus.ETIMEDOUT, None)
    assert took == side.resolver.address_budget
    assert len(side.requests) == side.options.retries + 1
    assert len({AcmMad.decode(mad).tid for mad in side.requests}) == 1  # the same TID each time
    entry = side.cache.get(PEER_KEY)
    assert entry is None or entry.state is EntryState.INIT
    assert side.failures and side.failures[-1][1] == AcmStatus.ETIMEDOUT
    assert side.outstanding == {}


async def test_the_peers_own_request_completes_a_waiting_resolution(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No answer to our request is needed when the peer asks us first (ARP-like)."""
    side = answered_by_the_sa()
    async with resolving(side) as answers:
        theirs = acm_request(99, IP, bytes(4), IP, PEER_IP, [side.group0.mgid]).encode()
        side.receive(from_peer(theirs))
    assert answers == [(AcmStatus.SUCCESS, ROUTE)] and len(side.requests) == 1
    assert side.responses == []  # it did not ask for us


async def test_a_peer_asking_for_us_is_answered_when_the_sa_gives_the_route(
    autojump_clock: trio.testing.MockClock,
) -> None:
    side = answered_by_the_sa()
    theirs = acm_request(0xABC, IP, OUR_IP, IP, PEER_IP, [side.group0.mgid]).encode()
    async with trio.open_nursery() as nursery:
        side.nursery = nursery
        side.receive(from_peer(theirs))
        assert side.responses == []  # not before the route is known
    (response,) = side.responses
    answer = AcmMad.decode(response.mad)
    assert answer.tid == 0xABC and answer.acm_status == AcmStatus.SUCCESS
    assert response.av.dlid == PEER_LID  # learned from the request: the SA route's DLID
    entry = side.cache.get(PEER_KEY)
    assert entry is not None and entry.state is EntryState.READY and entry.reply_tid is None


async def test_a_definite_sa_failure_is_passed_to_the_asking_peer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """C stayed silent and its requesters waited their whole timeout (defect 43)."""
    side = Side()
    side.join()
    side.sa_answers[PEER_GID] = SaOutcome(AcmStatus.ENODATA, None, "no records")
    theirs = acm_request(5, IP, OUR_IP, IP, PEER_IP, [side.group0.mgid]).encode()
    async with trio.open_nursery() as nursery:
        side.nursery = nursery
        side.receive(from_peer(theirs))
    (response,) = side.responses
    assert AcmMad.decode(response.mad).acm_status == AcmStatus.ENODATA
    entry = side.cache.get(PEER_KEY)
    assert entry is None or entry.state is EntryState.INIT


async def test_an_sa_that_never_answers_leaves_the_asking_peer_to_retransmit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    side = Side()
    side.join()
    theirs = acm_request(5, IP, OUR_IP, IP, PEER_IP, [side.group0.mgid]).encode()
    async with trio.open_nursery() as nursery:
        side.nursery = nursery
        side.receive(from_peer(theirs))
    assert side.responses == [] and len(side.sa_queries) == 1
    assert side.failures[-1][1] == AcmStatus.ETIMEDOUT


async def test_route_prot_acm_answers_a_peer_in_the_round_its_request_arrived() -> None:
    """The route comes from the group both sides share: no task, no SA, no wait (there is
    no nursery here, so a resolution started would end at once with ENODATA)."""
    side = Side(Options(route_prot=RouteProt.ACM))
    side.join()
    theirs = acm_request(6, IP, OUR_IP, IP, PEER_IP, [side.group0.mgid]).encode()
    side.receive(from_peer(theirs))  # no checkpoint from here on
    (response,) = side.responses
    assert AcmMad.decode(response.mad).acm_status == AcmStatus.SUCCESS
    entry = side.cache.get(PEER_KEY)
    assert entry is not None and entry.state is EntryState.READY and side.sa_queries == []
    path = entry.path
    assert path is not None and (path.dgid, path.dlid) == (PEER_GID, PEER_LID)


async def test_a_client_is_refused_before_group_0_is_joined_and_nodelay_does_not_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    side = Side()
    assert await side.resolver.resolve_address(SOURCE, DEST, False) == (AcmStatus.ENODATA, None)
    assert side.failures[-1][2] == NOT_READY and side.requests == []
    side.join()
    nodelay = EpAddr(EpFlag.NODELAY, DEST.type, DEST.info)
    async with trio.open_nursery() as nursery:
        side.nursery = nursery
        assert await side.resolver.resolve_address(SOURCE, nodelay, True) == (
            AcmStatus.ENODATA,
            None,
        )
        await trio.testing.wait_all_tasks_blocked()
        assert len(side.requests) == 1  # the resolution goes on for the next request
        nursery.cancel_scope.cancel()


async def test_begin_address_answers_at_once_when_the_endpoint_cannot_run_a_resolution() -> None:
    """Without a nursery (the endpoint closed) the answer comes in the same call."""
    side = Side()
    side.join()
    answers: list[Answer] = []
    side.resolver.begin_address(SOURCE, DEST, False, answers.append)
    assert answers == [(AcmStatus.ENODATA, None)]
    assert side.failures[-1][2] == CLOSED


async def test_with_route_prot_acm_the_answer_reaches_the_client_in_the_round_it_arrived(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The receive loop's round that takes the peer's answer (or its own request) makes the
    entry READY from the shared group and answers the waiting client: no scheduler pass
    between the MAD and the client's answer (issue 28's uncached path)."""
    for theirs in ("answer", "request"):
        side = Side(Options(route_prot=RouteProt.ACM))
        side.join()
        answers: list[Answer] = []
        async with trio.open_nursery() as nursery:
            side.nursery = nursery
            side.resolver.begin_address(SOURCE, DEST, False, answers.append)
            await trio.testing.wait_all_tasks_blocked()
            (sent,) = side.requests
            tid = AcmMad.decode(sent).tid
            if theirs == "answer":
                mad = acm_response(tid, side.group0.mgid).encode()
            else:
                mad = acm_request(1, IP, bytes(4), IP, PEER_IP, [side.group0.mgid]).encode()
            side.receive(from_peer(mad))
            assert len(answers) == 1, theirs  # before any checkpoint
        (status, path) = answers[0]
        assert status == AcmStatus.SUCCESS and path is not None
        assert (path.dgid, path.dlid) == (PEER_GID, PEER_LID)
        entry = side.cache.get(PEER_KEY)
        assert entry is not None and entry.state is EntryState.READY and entry.op is None
        assert len(side.requests) == 1 and side.failures == [] and side.outstanding == {}


async def test_a_reload_changes_where_routes_come_from_and_their_lifetime() -> None:
    side = Side()
    side.join()
    side.resolver.reload(Options(route_prot=RouteProt.ACM, route_timeout=7))
    theirs = acm_request(6, IP, OUR_IP, IP, PEER_IP, [side.group0.mgid]).encode()
    now = trio.current_time()
    side.receive(from_peer(theirs), now)
    entry = side.cache.get(PEER_KEY)
    assert entry is not None and entry.state is EntryState.READY and side.sa_queries == []
    assert entry.route_expiry == now + 420.0


# -- the address phase without a task (``AddressFlight``, the endpoint's timer task running) --


async def test_with_the_timer_task_running_the_request_goes_out_in_the_round_that_asked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The ACM request is posted before ``begin_address`` returns, no task is started for
    it, and the answer reaches the client in the receive round (issue 28's first
    resolution: request read -> MAD posted, MAD in -> reply, without a scheduler pass)."""
    for theirs in ("answer", "request for us"):
        side = Side(Options(route_prot=RouteProt.ACM))
        side.join()
        answers: list[Answer] = []
        async with trio.open_nursery() as nursery:
            side.nursery = nursery
            nursery.start_soon(side.timers.run)
            await trio.testing.wait_all_tasks_blocked()
            tasks = len(nursery.child_tasks)
            side.resolver.begin_address(SOURCE, DEST, False, answers.append)
            (sent,) = side.requests  # posted in this round
            assert len(nursery.child_tasks) == tasks and len(side.timers) == 1
            tid = AcmMad.decode(sent).tid
            if theirs == "answer":
                mad = acm_response(tid, side.group0.mgid).encode()
            else:  # the peer asks for our address before it answers: both done at once
                mad = acm_request(1, IP, OUR_IP, IP, PEER_IP, [side.group0.mgid]).encode()
            side.receive(from_peer(mad))
            assert len(answers) == 1, theirs  # before any checkpoint
            assert len(side.timers) == 0 and side.outstanding == {}
            assert side.resolver.ep.resolve_credits.try_take("next")  # the credit came back
            nursery.cancel_scope.cancel()
        (status, path) = answers[0]
        assert status == AcmStatus.SUCCESS and path is not None and path.dlid == PEER_LID
        # The peer that asked for our address got its answer in the same round.
        assert len(side.responses) == (1 if theirs == "request for us" else 0)


async def test_an_unanswered_flight_is_sent_again_by_the_timer_task_then_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    side = Side()
    side.join()
    answers: list[Answer] = []
    ended = trio.Event()
    async with trio.open_nursery() as nursery:
        side.nursery = nursery
        nursery.start_soon(side.timers.run)
        await trio.testing.wait_all_tasks_blocked()
        started = trio.current_time()

        def done(answer: Answer) -> None:
            answers.append(answer)
            ended.set()

        side.resolver.begin_address(SOURCE, DEST, False, done)
        await ended.wait()
        took = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert answers == [(AcmStatus.ETIMEDOUT, None)]
    assert took == side.resolver.address_budget
    assert len(side.requests) == side.options.retries + 1
    assert len({AcmMad.decode(mad).tid for mad in side.requests}) == 1  # the same TID each time
    assert side.failures[-1][1] == AcmStatus.ETIMEDOUT and side.outstanding == {}
    assert counted(side, Counter.ADDR_QUERY) == 1


async def test_a_flight_ends_closed_when_the_timer_task_ends_and_a_busy_credit_takes_a_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    side = Side()
    side.join()
    answers: list[Answer] = []
    async with trio.open_nursery() as nursery:
        side.nursery = nursery
        timers = trio.CancelScope()

        async def run_timers() -> None:
            with timers:
                await side.timers.run()

        nursery.start_soon(run_timers)
        await trio.testing.wait_all_tasks_blocked()
        tasks = len(nursery.child_tasks)
        side.resolver.begin_address(SOURCE, DEST, False, answers.append)
        assert len(side.requests) == 1 and len(nursery.child_tasks) == tasks
        # The only credit is out: the next destination's resolution waits for it in a task.
        other = EpAddr(0, AddrType.IP, pad_address(AddrType.IP, bytes((10, 0, 0, 9))))
        side.resolver.begin_address(SOURCE, other, False, answers.append)
        assert len(side.requests) == 1 and len(nursery.child_tasks) == tasks + 1
        timers.cancel()  # the endpoint closes
        await trio.testing.wait_all_tasks_blocked()
        assert answers[0] == (AcmStatus.ENODATA, None) and side.failures[0][2] == CLOSED
        # Its credit came back: the waiting resolution sent its request.
        assert len(side.requests) == 2
        nursery.cancel_scope.cancel()

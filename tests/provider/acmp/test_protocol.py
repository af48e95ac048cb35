"""The peer protocol on bytes alone: encoded ACM MADs in, ``PeerProtocol`` actions out.

Malformed and hostile MADs through a live cluster are in test_fabric_dynamics.py (counted and
dropped, foreign responses ignored) and tests/reliability (fuzzing); here each case is one
MAD and the exact actions it gives, with nothing between them and the codec.
"""

from __future__ import annotations

import pytest

from ibacm.config.options import Options
from ibacm.fabric.api import ReceivedMad
from ibacm.provider.acmp.counters import EndpointStats
from ibacm.provider.acmp.entry import DestEntry, EntryState, PendingQuery
from ibacm.provider.acmp.keys import GID, IP, LID, NAME, cache_key
from ibacm.provider.acmp.protocol import (
    BAD_MAD,
    REQUEST_RECEIVED,
    RESPONSE_DROPPED,
    RESPONSE_RECEIVED,
    UNMATCHED_RESPONSE,
    Complete,
    PeerMoved,
    PeerProtocol,
    RouteWanted,
    SendResponse,
)
from ibacm.wire.acm_mad import ACM_METHOD_RESP, AcmMad, acm_request, acm_response
from ibacm.wire.client import AcmStatus
from tests.provider.acmp.sans_io import (
    OUR_IP,
    PEER_GID,
    PEER_IP,
    PEER_LID,
    PEER_QPN,
    Side,
    from_peer,
)

NOW = 100.0
PEER_KEY = cache_key(IP, PEER_IP)
ELSEWHERE = bytes([10, 0, 0, 9])
"""An address nobody here owns."""


@pytest.fixture
def side() -> Side:
    ready = Side()
    ready.join()
    return ready


def request(side: Side, tid: int = 7, dest: bytes = OUR_IP, src: bytes = PEER_IP) -> bytes:
    """A peer's ACM request for ``dest`` (IPv4), from ``src``, naming our group 0."""
    return acm_request(tid, IP, dest, IP, src, [side.group0.mgid]).encode()


def receive(side: Side, received: ReceivedMad) -> tuple[object, ...]:
    return side.protocol.receive(received, NOW)


def asking(side: Side, key: bytes) -> tuple[DestEntry, PendingQuery, int]:
    """A resolution of ``key`` waiting for the answer to our request (TID returned)."""
    entry = side.cache.acquire(key)
    side.cache.set_state(entry, EntryState.QUERY_ADDR)
    pending = entry.wake = PendingQuery(entry)
    tid = side.next_tid()
    side.outstanding[tid] = pending
    return entry, pending, tid


# -- requests --------------------------------------------------------------------------------


def test_a_request_for_us_teaches_the_peer_and_wants_its_route(side: Side) -> None:
    actions = receive(side, from_peer(request(side)))
    entry = side.cache.get(PEER_KEY)
    assert entry is not None
    assert actions == (REQUEST_RECEIVED, RouteWanted(entry, 7))
    assert entry.state is EntryState.ADDR_RESOLVED
    assert (entry.peer_gid, entry.peer_lid, entry.remote_qpn) == (PEER_GID, PEER_LID, PEER_QPN)
    assert entry.mgid == side.group0.mgid and entry.addr_expiry == NOW + side.options.addr_lifetime


def test_a_request_for_someone_else_is_learned_from_but_not_answered(side: Side) -> None:
    actions = receive(side, from_peer(request(side, dest=ELSEWHERE)))
    entry = side.cache.get(PEER_KEY)
    assert entry is not None and entry.state is EntryState.ADDR_RESOLVED
    assert actions == (REQUEST_RECEIVED, RouteWanted(entry, None))


def test_a_ready_peer_asking_again_is_answered_from_the_cache(side: Side) -> None:
    """The response on the wire: our TID back, status 0, the group we share, to the QPN and
    LID the request came from (mad-protocol.md §6.3)."""
    side.receive(from_peer(request(side, tid=1, dest=ELSEWHERE)), NOW)
    entry = side.cache.get(PEER_KEY)
    assert entry is not None
    side.cache.make_ready(entry, NOW, 60.0, 60.0, None, group_route=side.group0.route)
    actions = receive(side, from_peer(request(side, tid=0x1234_5678_9ABC)))
    assert len(actions) == 2 and actions[0] == REQUEST_RECEIVED
    response = actions[1]
    assert isinstance(response, SendResponse)
    assert response.qpn == PEER_QPN
    assert (response.av.dlid, response.av.dgid) == (PEER_LID, PEER_GID)
    mad = AcmMad.decode(response.mad)
    assert mad.method == ACM_METHOD_RESP and mad.tid == 0x1234_5678_9ABC
    assert mad.acm_status == AcmStatus.SUCCESS and mad.gids == [side.group0.mgid]


def test_a_request_while_the_route_is_looked_up_is_answered_later(side: Side) -> None:
    side.receive(from_peer(request(side, dest=ELSEWHERE)), NOW)
    entry = side.cache.get(PEER_KEY)
    assert entry is not None
    side.cache.set_state(entry, EntryState.QUERY_ROUTE)
    assert receive(side, from_peer(request(side, tid=8))) == (
        REQUEST_RECEIVED,
        RouteWanted(entry, 8),
    )
    assert receive(side, from_peer(request(side, dest=bytes(4)))) == (REQUEST_RECEIVED,)


def test_a_request_wakes_the_resolution_waiting_for_that_peer(side: Side) -> None:
    """The peer's own request tells its address as well as an answer would."""
    entry, pending, _ = asking(side, PEER_KEY)
    actions = receive(side, from_peer(request(side, dest=bytes(4))))
    assert actions == (REQUEST_RECEIVED, Complete(pending), RouteWanted(entry, None))


def test_a_peer_at_a_new_lid_drops_its_other_routes(side: Side) -> None:
    name_key = cache_key(NAME, b"peer")
    side.receive(from_peer(request(side, dest=ELSEWHERE)), NOW)
    by_name = acm_request(2, IP, ELSEWHERE, NAME, b"peer", [side.group0.mgid]).encode()
    side.receive(from_peer(by_name), NOW)
    assert side.cache.get(name_key) is not None
    actions = receive(side, from_peer(request(side, tid=3), lid=PEER_LID + 10))
    entry = side.cache.get(PEER_KEY)
    assert entry is not None and entry.peer_lid == PEER_LID + 10
    assert actions == (
        REQUEST_RECEIVED,
        PeerMoved(entry, PEER_LID + 10, 1),
        RouteWanted(entry, 3),
    )
    assert side.cache.get(name_key) is None  # its next request learns it again


def test_a_request_naming_no_group_of_ours_teaches_nothing(side: Side) -> None:
    foreign = acm_request(7, IP, OUR_IP, IP, PEER_IP, [bytes(range(16))]).encode()
    assert receive(side, from_peer(foreign)) == (REQUEST_RECEIVED,)
    assert side.cache.get(PEER_KEY) is None


def test_a_request_from_one_of_our_own_addresses_is_not_learned(side: Side) -> None:
    """Our own multicast coming back, or a spoof of our address: the loopback entry stays."""
    own = cache_key(IP, OUR_IP)
    loop = DestEntry(own)
    side.cache.put_loopback(loop, side.loopback_route(), NOW)
    spoof = acm_request(7, IP, ELSEWHERE, IP, OUR_IP, [side.group0.mgid]).encode()
    assert receive(side, from_peer(spoof)) == (REQUEST_RECEIVED,)
    assert side.cache.get(own) is loop and loop.remote_qpn == 0 and loop.loopback


def test_nothing_is_learned_before_group_0_is_joined() -> None:
    side = Side()
    assert receive(side, from_peer(request(side))) == ()
    assert len(side.cache) == 0


# -- malformed and hostile MADs ---------------------------------------------------------------


def _patched(mad: bytes, offset: int, value: int) -> bytes:
    data = bytearray(mad)
    data[offset] = value
    return bytes(data)


@pytest.mark.parametrize(
    ("what", "offset", "value"),
    [
        ("base version", 0, 2),
        ("management class", 1, 0x03),
        ("class version", 2, 2),
        ("control", 7, 0x02),
        ("more MGIDs than fit (defect 38)", 20, 7),
    ],
)
def test_a_mad_the_codec_rejects_is_counted_and_dropped(
    side: Side, what: str, offset: int, value: int
) -> None:
    for mad in (request(side), acm_response(7, side.group0.mgid).encode()):
        assert receive(side, from_peer(_patched(mad, offset, value))) == (BAD_MAD,), what
    assert len(side.cache) == 0


@pytest.mark.parametrize("size", [0, 24, 255, 257])
def test_a_truncated_or_oversized_mad_is_counted_and_dropped(side: Side, size: int) -> None:
    assert receive(side, from_peer(request(side).ljust(size, b"\0")[:size])) == (BAD_MAD,)
    assert len(side.cache) == 0


@pytest.mark.parametrize(
    ("what", "offset", "value"),
    [("method", 3, 0x02), ("source type 0", 18, 0), ("source type 6", 18, 6)],
)
def test_a_request_of_another_method_or_type_is_counted_and_dropped(
    side: Side, what: str, offset: int, value: int
) -> None:
    assert receive(side, from_peer(_patched(request(side), offset, value))) == (BAD_MAD,), what
    assert len(side.cache) == 0


# -- responses -------------------------------------------------------------------------------


def test_the_answer_to_our_request_completes_it_and_teaches_the_peer(side: Side) -> None:
    entry, pending, tid = asking(side, PEER_KEY)
    answer = acm_response(tid, side.group0.mgid).encode()
    actions = receive(side, from_peer(answer))
    assert actions == (
        RESPONSE_RECEIVED,
        Complete(pending, AcmStatus.SUCCESS, "", tid),
        RouteWanted(entry, None),  # its route at once when the group or bulk table has it
    )
    assert entry.state is EntryState.ADDR_RESOLVED
    assert (entry.peer_gid, entry.peer_lid, entry.remote_qpn) == (PEER_GID, PEER_LID, PEER_QPN)


def test_a_failure_answer_completes_our_request_with_its_status(side: Side) -> None:
    entry, pending, tid = asking(side, PEER_KEY)
    answer = acm_response(tid, side.group0.mgid, AcmStatus.ENODATA).encode()
    (counted, complete) = receive(side, from_peer(answer))
    assert counted == RESPONSE_RECEIVED and isinstance(complete, Complete)
    assert (complete.query, complete.status, complete.tid) == (pending, AcmStatus.ENODATA, tid)
    assert entry.state is EntryState.QUERY_ADDR  # nothing learned


def test_a_response_for_an_unknown_tid_is_counted_and_ignored(side: Side) -> None:
    entry, _, tid = asking(side, PEER_KEY)
    stray = acm_response(tid + 1, side.group0.mgid).encode()
    assert receive(side, from_peer(stray)) == (RESPONSE_RECEIVED, UNMATCHED_RESPONSE)
    assert entry.state is EntryState.QUERY_ADDR and entry.peer_lid == 0


def test_a_late_response_for_an_entry_resolved_meanwhile_is_ignored(side: Side) -> None:
    entry, _, tid = asking(side, PEER_KEY)
    side.receive(from_peer(request(side, dest=ELSEWHERE)), NOW)  # learned so
    late = acm_response(tid, side.group0.mgid).encode()
    assert receive(side, from_peer(late, qpn=0x99)) == (RESPONSE_RECEIVED, UNMATCHED_RESPONSE)
    assert entry.remote_qpn == PEER_QPN


@pytest.mark.parametrize(
    ("key", "source"),
    [
        (cache_key(GID, PEER_GID), {"gid": bytes(15) + b"\x66"}),
        (cache_key(LID, PEER_LID.to_bytes(2, "big")), {"lid": PEER_LID + 200}),
    ],
)
def test_a_spoofed_answer_to_a_gid_or_lid_question_is_ignored(
    side: Side, key: bytes, source: dict[str, object]
) -> None:
    entry, pending, tid = asking(side, key)
    forged = acm_response(tid, side.group0.mgid).encode()
    assert receive(side, from_peer(forged, **source)) == (  # type: ignore[arg-type]
        RESPONSE_RECEIVED,
        UNMATCHED_RESPONSE,
    )
    assert not pending.done.is_set() and entry.state is EntryState.QUERY_ADDR
    # The real peer's answer still completes it.
    assert receive(side, from_peer(forged))[1] == Complete(pending, AcmStatus.SUCCESS, "", tid)


def test_an_answer_naming_no_group_of_ours_fails_the_request(side: Side) -> None:
    entry, pending, tid = asking(side, PEER_KEY)
    answer = acm_response(tid, bytes(range(16))).encode()
    (_, complete) = receive(side, from_peer(answer))
    assert isinstance(complete, Complete) and complete.status == AcmStatus.ENODATA
    assert complete.query is pending and entry.state is EntryState.QUERY_ADDR


def test_no_response_goes_to_a_peer_without_an_address_vector() -> None:
    side = Side()
    side.join()
    entry = side.cache.acquire(PEER_KEY)  # nothing learned: no QPN, no group
    assert PeerProtocol(side).response(entry, 7, AcmStatus.SUCCESS) == RESPONSE_DROPPED


def test_every_count_names_an_endpoint_statistic() -> None:
    """What the endpoint adds one to (``EndpointStats.add``) and shows in its snapshot."""
    stats = EndpointStats()
    for count in (BAD_MAD, REQUEST_RECEIVED, RESPONSE_RECEIVED, UNMATCHED_RESPONSE):
        stats.add(count.tally)
    stats.add(RESPONSE_DROPPED.tally)
    shown = stats.as_dict()
    assert {name for name, value in shown.items() if value} == {
        "bad_mads",
        "requests_received",
        "responses_received",
        "unmatched_responses",
        "responses_dropped",
    }


def test_a_reload_gives_addresses_learned_afterwards_the_new_lifetime(side: Side) -> None:
    side.protocol.reload(Options(addr_timeout=5))
    receive(side, from_peer(request(side, dest=ELSEWHERE)))
    entry = side.cache.get(PEER_KEY)
    assert entry is not None and entry.addr_expiry == NOW + 300.0

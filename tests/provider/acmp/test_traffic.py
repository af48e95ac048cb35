"""An endpoint's QP traffic (``acmp.traffic``): actions applied in the receive round, the
send queue's bound, requests multicast on group 0 over the simulated fabric."""

from __future__ import annotations

import pytest
import trio

from ibacm.config.option_values import RouteProt
from ibacm.config.options import Options
from ibacm.fabric.api import MULTICAST_QPN, AddressVector, SendQueueFull
from ibacm.provider.acmp.counters import EndpointStats
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.groups import joined_mgids
from ibacm.provider.acmp.keys import IP, cache_key
from ibacm.provider.acmp.traffic import EndpointTraffic
from ibacm.wire.acm_mad import acm_request
from tests.provider.acmp.harness import cluster, ipv4
from tests.provider.acmp.sans_io import OUR_IP, PEER_IP, PEER_QPN, Side, from_peer

NOW = 100.0


def _request(side: Side, tid: int) -> bytes:
    return acm_request(tid, IP, OUR_IP, IP, PEER_IP, [side.group0.mgid]).encode()


def test_the_protocols_actions_are_applied_and_a_full_queue_drops_counted() -> None:
    side = Side(Options(route_prot=RouteProt.ACM))
    side.join()
    stats = EndpointStats()
    traffic = EndpointTraffic(side.protocol, side.resolver, stats, side.group0, 1)
    traffic.receive_mad(from_peer(_request(side, 7)), NOW)
    entry = side.cache.get(cache_key(IP, PEER_IP))
    # Learned, routed from the shared group and answered in the same round.
    assert entry is not None and entry.state is EntryState.READY and len(side.responses) == 1
    traffic.receive_mad(from_peer(_request(side, 8)), NOW)  # queued: the queue holds one
    traffic.receive_mad(from_peer(_request(side, 9)), NOW)  # nobody sends: dropped
    traffic.respond(entry, 10, 0)
    traffic.receive_mad(from_peer(b"\x01" * 256), NOW)
    assert stats.as_dict() == {
        **EndpointStats().as_dict(),
        "requests_received": 3,
        "responses_dropped": 2,
        "bad_mads": 1,
    }


@pytest.mark.trio
async def test_requests_go_out_on_group_0_until_the_qp_closes(autojump_clock: object) -> None:
    async with cluster(2) as c:
        await c.wait_ready()
        endpoint, peer = c.endpoint("node1"), c.endpoint("node2")
        traffic = endpoint.traffic
        assert traffic.qp is endpoint.qp is not None
        address = ipv4(c.world, "node1")
        target = ipv4(c.world, "node2")
        mgids = joined_mgids(endpoint.groups)
        request = acm_request(0x77, target.type, target.info, address.type, address.info, mgids)
        mad = request.encode()
        assert traffic.post_request(mad) is True
        with trio.fail_after(10):
            # node2 learns us from the request and answers it; nobody here asked (TID 0x77
            # is not outstanding): counted, dropped.
            while endpoint.stats.unmatched_responses < 1:
                await trio.sleep(0.01)
        assert peer.stats.requests_received >= 1 and peer.stats.responses_sent >= 1
        assert peer.cache.get(cache_key(address.type, address.info)) is not None
        await endpoint.close()
        assert traffic.qp is None and traffic.post_request(mad) is False


class FullQp:
    """A QP whose send slots are all in flight: ``post`` refuses, ``send`` waits its turn."""

    qpn = 0x42

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, int]] = []

    def post(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        raise SendQueueFull("every slot in flight")

    async def send(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        await trio.sleep(0.001)
        self.sent.append((mad, remote_qpn))


@pytest.mark.trio
async def test_a_full_send_queue_delays_requests_and_responses_in_order(
    autojump_clock: object,
) -> None:
    """Neither an ACM request nor a response is lost to a full send queue: they wait for a
    sender, in the order they were posted (C queues them too)."""
    side = Side(Options(route_prot=RouteProt.ACM))
    side.join()
    stats = EndpointStats()
    traffic = EndpointTraffic(side.protocol, side.resolver, stats, side.group0, 8)
    qp = FullQp()
    traffic.qp = qp  # type: ignore[assignment]
    request = acm_request(1, IP, PEER_IP, IP, OUR_IP, [side.group0.mgid]).encode()
    assert traffic.post_request(request) is True
    traffic.receive_mad(from_peer(_request(side, 7)), NOW)  # the peer learned
    entry = side.cache.get(cache_key(IP, PEER_IP))
    assert entry is not None
    traffic.respond(entry, 7, 0)  # our answer to it, behind the request
    async with trio.open_nursery() as nursery:
        nursery.start_soon(traffic.queued_sender)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert [qpn for _, qpn in qp.sent] == [MULTICAST_QPN, PEER_QPN]
    assert qp.sent[0][0] == request
    assert (stats.responses_sent, stats.send_errors, stats.responses_dropped) == (1, 0, 0)

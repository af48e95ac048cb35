"""Fuzzing the MAD receive path through the simulated fabric.

Two live daemons (node1, node2) and a rogue QP on node3. Hypothesis (in a worker thread)
crafts class 0x2C MADs: random bytes, structurally valid requests and responses with random
fields, and valid ones with a few bytes changed, and the rogue puts each on the wire, unicast
to node1's endpoint QP or multicast to the ACM group. Each is processed before the next.

Every MAD the codec rejects is counted in node1's endpoint stats and dropped; nothing is
logged as an error; and after the run node1 resolves node2 through the ACM protocol again
(cache flushed first), so the receive path still works.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibacm.fabric.api import MULTICAST_QPN, AddressVector, UdQp
from ibacm.wire.acm_mad import AcmMad, acm_request, acm_response
from ibacm.wire.errors import WireError
from tests.reliability.errors import logged_errors
from tests.reliability.live import Client, LiveCluster, live_cluster, resolve_frame, soak
from tests.wire.strategies import acm_mads

EXAMPLES = soak(200, 20_000)
MAD_SIZE = 256


@dataclass
class Rogue:
    """node3's QP and where to aim."""

    qp: UdQp
    unicast: AddressVector
    qpn: int
    group: AddressVector


def valid_seeds(cluster: LiveCluster) -> list[bytes]:
    ep = cluster["node1"].endpoints()[0]
    mgids = [ep.group0.mgid]
    return [
        acm_request(7, 1, b"node1", 1, b"node3", mgids).encode(),
        acm_request(8, 1, b"nobody", 1, b"node2", mgids).encode(),
        acm_response(9, ep.group0.mgid).encode(),
        acm_response(ep.core.next_tid(), ep.group0.mgid, 3).encode(),
    ]


def mad_inputs(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(st.sampled_from(seeds)))
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, MAD_SIZE - 1))] = draw(st.integers(0, 255))
        return bytes(data)

    @st.composite
    def encoded(draw: st.DrawFn) -> bytes:
        mad: AcmMad = draw(acm_mads)
        return mad.encode()

    return st.one_of(
        st.binary(min_size=MAD_SIZE, max_size=MAD_SIZE),
        encoded(),
        mutated(),
        st.sampled_from(seeds),
    )


async def rogue_on(cluster: LiveCluster, node: str = "node3") -> Rogue:
    device = (await cluster.world.fabric(node).open())[0]
    qp = await device.port(1).open_ud(0, recv_depth=4)
    target = cluster["node1"].endpoints()[0]
    group = target.group0
    assert group.mgid is not None and group.mlid
    lid = cluster.world.node("node1").lids[0]
    return Rogue(
        qp,
        AddressVector(dlid=lid, dgid=cluster.world.node("node1").gids[0]),
        target.qpn,
        AddressVector(dlid=group.mlid, dgid=group.mgid),
    )


def bad_mads(cluster: LiveCluster, node: str) -> int:
    return sum(ep.stats.bad_mads for ep in cluster[node].endpoints())


@pytest.mark.trio
async def test_random_mads_are_counted_dropped_and_resolving_goes_on(tmp_path: Path) -> None:
    with logged_errors() as errors:
        async with live_cluster(tmp_path, 3, start=2, timeout=200, retries=2) as cluster:
            rogue = await rogue_on(cluster)
            before = bad_mads(cluster, "node1")
            undecodable = 0
            sent_to_node1 = 0

            async def put(mad: bytes, multicast: bool) -> None:
                if multicast:
                    await rogue.qp.send(mad, rogue.group, MULTICAST_QPN)
                else:
                    await rogue.qp.send(mad, rogue.unicast, rogue.qpn)
                # Every daemon task has handled it before the next one goes out.
                await trio.testing.wait_all_tasks_blocked(cushion=0.001)

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(mad=mad_inputs(valid_seeds(cluster)), multicast=st.booleans())
            def one_mad(mad: bytes, multicast: bool) -> None:
                nonlocal undecodable, sent_to_node1
                try:
                    AcmMad.decode(mad)
                except WireError:
                    undecodable += 1
                sent_to_node1 += 1
                trio.from_thread.run(put, mad, multicast)

            await trio.to_thread.run_sync(one_mad)
            counted = bad_mads(cluster, "node1") - before
            assert undecodable > 0
            assert undecodable <= counted <= sent_to_node1
            assert cluster.world.stats["rnr_drop"] == 0 or counted >= undecodable

            # The protocol still works: forget node2, ask again, get the path.
            await cluster["node1"].daemon.flush(None, None)
            client = await Client.connect(cluster["node1"].socket_path)
            with trio.fail_after(10):
                reply = await client.request(resolve_frame("node1", "node2"))
            assert (reply[2], len(reply)) == (0, 88)
            await client.aclose()
            assert cluster["node1"].alive and cluster["node2"].alive
    assert errors == []

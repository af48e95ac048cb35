"""The resolve_depth credits (behavior.md §13) against head-of-line blocking (defect 42).

With the default single credit, a request nobody answers holds it for its whole address
budget. Resolutions queued behind it must still transmit ``retries + 1`` times within their
own budget instead of timing out without having sent anything.
"""

from __future__ import annotations

import pytest
import trio

from ibacm.wire.client import AcmStatus
from tests.provider.acmp.harness import cluster, ipv4

pytestmark = pytest.mark.trio


async def test_a_resolution_queued_behind_an_unanswered_request_still_resolves(
    autojump_clock: object,
) -> None:
    # node3 exists on the fabric but runs no daemon: its requests are never answered.
    async with cluster(3, start=["node1", "node2"]) as c:
        node1 = c["node1"]
        endpoint = c.endpoint("node1")
        window = endpoint.resolver.attempt_wait
        budget = endpoint.resolver.address_budget
        ended: dict[str, tuple[int, float]] = {}

        async def resolve(dest: str) -> None:
            result = await node1.resolve(ipv4(c.world, "node1"), ipv4(c.world, dest))
            ended[dest] = (result.status, trio.current_time())

        requests = c.acm_requests()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(resolve, "node3")
            await trio.sleep(0.1)  # node3's request is out and holds the only credit
            asked = trio.current_time()
            nursery.start_soon(resolve, "node2")
            await trio.sleep(window / 2 - 0.01)
            # The credit still paces: node2's request waits while node3's is fresh.
            assert c.acm_requests() - requests == 1

        status, at = ended["node2"]
        assert status == AcmStatus.SUCCESS
        assert at - asked == pytest.approx(window / 2, abs=0.01)
        status, at = ended["node3"]
        assert status == AcmStatus.ETIMEDOUT
        assert at - (asked - 0.1) == pytest.approx(budget, abs=0.01)
        assert c.acm_requests() - requests == 3 + 1  # retries + 1 to node3, one to node2
        assert endpoint.stats.credit_overdrafts == 1


async def test_queued_resolutions_each_send_every_retry_within_the_budget(
    autojump_clock: object,
) -> None:
    # Two unanswered requests queued behind a third: each is still sent retries + 1 times
    # and each ends after one address budget, not after the ones in front of it.
    async with cluster(5, start=["node1", "node2"]) as c:
        node1 = c["node1"]
        resolver = c.endpoint("node1").resolver
        waited: list[float] = []

        async def resolve(dest: str) -> None:
            started = trio.current_time()
            result = await node1.resolve(ipv4(c.world, "node1"), ipv4(c.world, dest))
            assert result.status == AcmStatus.ETIMEDOUT
            waited.append(trio.current_time() - started)

        requests = c.acm_requests()
        async with trio.open_nursery() as nursery:
            for dest in ("node3", "node4", "node5"):
                nursery.start_soon(resolve, dest)
        retries = node1.core.options.retries
        assert c.acm_requests() - requests == 3 * (retries + 1)
        assert max(waited) == pytest.approx(resolver.address_budget, abs=0.01)

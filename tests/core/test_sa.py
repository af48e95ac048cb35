"""The core's SA path: TIDs, per-port FIFO credits (sa_depth), timeouts/retries from options."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from ibacm.config.options import Options
from ibacm.core.sa import TID_MAX, SaChannel, TidCounter
from ibacm.core.services import DaemonServices
from ibacm.fabric.api import SaSendError, SaTimeout
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.api import Counters
from ibacm.wire.mad import SaMad, build_path_get
from ibacm.wire.path_record import PathRecord
from tests.core.support import make_options, sim_core


def test_tids_start_at_one_and_wrap_without_sign_trouble() -> None:
    tids = TidCounter()
    assert [tids.next() for _ in range(3)] == [1, 2, 3]
    high = TidCounter(0x7FFFFFFF)
    assert [high.next() for _ in range(2)] == [0x7FFFFFFF, 0x80000000]  # C went negative here
    top = TidCounter(TID_MAX)
    assert [top.next() for _ in range(2)] == [TID_MAX, 1]
    with pytest.raises(ValueError):
        TidCounter(0)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def _path_query(world: SimWorld, tid: int) -> bytes:
    node2 = world.node("node2")
    return build_path_get(tid, PathRecord(dlid=node2.lids[0], slid=world.node("node1").lids[0]))


@pytest.mark.trio
@pytest.mark.parametrize("depth", [1, 3])
async def test_sa_depth_is_a_fifo_credit_limit(
    autojump_clock: trio.testing.MockClock, depth: int
) -> None:
    world = SimWorld(generate(2))
    world.faults.sa_service_time = 0.1  # the SA takes 100 ms per MAD
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        fabric = world.fabric("node1")
        device = (await fabric.open())[0]
        port = device.port(1)
        channel = SaChannel(port, await port.query(), depth)
        order: list[int] = []
        peak = 0

        async def one(tid: int) -> None:
            nonlocal peak
            reply = await channel.request(await _path_query(world, tid), timeout_ms=5000, retries=0)
            peak = max(peak, channel.in_flight)
            order.append(SaMad.decode(reply).mad.tid & 0xFFFFFFFF)

        async with trio.open_nursery() as requests:
            for tid in range(1, 9):
                requests.start_soon(one, tid)
                await trio.sleep(0.001)  # queue them in a known order
            await trio.sleep(0.01)
            assert channel.in_flight == depth
            assert channel.waiting == 8 - depth
        assert order == list(range(1, 9))
        assert peak <= depth
        assert channel.sent == 8
        await fabric.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_sa_requests_use_sa_timeout_and_retries(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    options = make_options(tmp_path, timeout=50, retries=0, sa_timeout=300, sa_retries=2)
    async with sim_core(tmp_path, options=options) as core:
        core.world.faults.sa_down = True  # the SA answers nothing
        port = core.topology.devices[0].ports[0]
        assert port.core is not None
        start = trio.current_time()
        with pytest.raises(SaTimeout):
            await core.topology.services.sa_request(port.core, await _path_query(core.world, 5))
        # 3 attempts of 300 ms, not 1 x 50 ms.
        assert trio.current_time() - start == pytest.approx(0.9, abs=0.05)


@pytest.mark.trio
async def test_sa_request_on_a_port_that_is_down(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        port = core.topology.devices[0].ports[0]
        core_port = port.core
        assert core_port is not None
        core.world.set_port_state("node1", "mlx5_0", 1, False)
        with trio.fail_after(5):
            while port.up:
                await trio.sleep(0.01)
        with pytest.raises(SaSendError, match="not up"):
            await core.topology.services.sa_request(core_port, bytes(256))


def test_services_hand_out_daemon_wide_tids() -> None:
    services = DaemonServices(Options(), Counters(), None)
    assert [services.next_tid() for _ in range(3)] == [1, 2, 3]


@pytest.mark.trio
async def test_a_started_request_holds_its_credit_until_its_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``SaChannel.start``: sent at once with a free credit, ended in the round the reply
    is read; with no credit free it is not started (``request`` waits its turn)."""
    world = SimWorld(generate(2))
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        device = (await world.fabric("node1").open())[0]
        port = device.port(1)
        channel = SaChannel(port, await port.query(), 1)
        call = channel.start(await _path_query(world, 7), timeout_ms=100, retries=1)
        assert call is not None and channel.in_flight == 1 and channel.sent == 1
        assert channel.start(await _path_query(world, 8), timeout_ms=100, retries=1) is None
        replies: list[bytes] = []
        call.when_ended(lambda ended: replies.append(ended.result()))
        reply = await call.wait()
        assert replies == [reply] and SaMad.decode(reply).mad.tid & 0xFFFFFFFF == 7
        assert channel.in_flight == 0 and channel.failed == 0
        # Unanswered (the SA is gone): ended by the drive's time-out, counted failed.
        world.faults.sa_down = True
        lost = channel.start(await _path_query(world, 9), timeout_ms=100, retries=1)
        assert lost is not None
        with pytest.raises(SaTimeout):
            await lost.wait()
        assert trio.current_time() >= 0.2 and channel.in_flight == 0 and channel.failed == 1
        nursery.cancel_scope.cancel()

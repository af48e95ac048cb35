"""The way to the simulated SA and back: agents, the SA's queue, where answers and Reports go."""

from __future__ import annotations

import pytest
import trio

from ibacm.fabric.api import FabricError, SaDestination
from ibacm.fabric.sim.sa_transport import SaTransport
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import MadStatus, SaMad, build_path_get
from ibacm.wire.path_record import PathRecord
from tests.fabric.helpers import running


def path_get(agent: int, seq: int, sgid: bytes) -> bytes:
    """A PathRecord GET whose TID names ``agent`` in its high 32 bits, as umad sets it."""
    return build_path_get(agent << 32 | seq, PathRecord(sgid=sgid))


@pytest.mark.trio
async def test_answers_reach_the_agent_named_by_the_tid(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2))
    transport: SaTransport = world.sa_transport
    port = world.port("node2", "mlx5_0", 1)
    got: list[bytes] = []
    agent = transport.register_agent(port, got.append)
    to_sa = SaDestination(world.sm_lid, 0, 0)
    with pytest.raises(FabricError, match="not running"):
        transport.transmit(port, path_get(agent, 1, port.gid0), to_sa)
    async with running(world):
        transport.transmit(port, path_get(agent, 1, port.gid0), to_sa)
        transport.transmit(port, path_get(agent + 1, 2, port.gid0), to_sa)  # nobody's
        # To a LID with no SA behind it: dropped on arrival.
        transport.transmit(port, path_get(agent, 3, port.gid0), SaDestination(port.lid, 0, 0))
        await trio.sleep(1)
        transport.unregister_agent(port, agent)
        transport.transmit(port, path_get(agent, 4, port.gid0), to_sa)
        await trio.sleep(1)
    (answer,) = (SaMad.decode(mad) for mad in got)
    assert (answer.mad.tid, answer.mad.status) == (agent << 32 | 1, 0)
    assert world.stats["sa_served"] == 3 and world.stats["sa_no_agent"] == 2
    assert world.stats["sa_not_sm"] == 1


@pytest.mark.trio
async def test_a_full_queue_is_answered_busy_at_once(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2), sa_service_time=0.5)
    world.faults.sa_queue_limit = 1
    transport = world.sa_transport
    port = world.port("node1", "mlx5_0", 1)
    got: list[tuple[float, SaMad]] = []
    agent = transport.register_agent(
        port, lambda mad: got.append((trio.current_time(), SaMad.decode(mad)))
    )
    async with running(world):
        started = trio.current_time()
        for seq in (1, 2):
            transport.transmit(
                port, path_get(agent, seq, port.gid0), SaDestination(world.sm_lid, 0, 0)
            )
        await trio.sleep(0.1)
        assert transport.queue_length == 1
        await trio.sleep(1)
    (busy_at, busy), (served_at, served) = got
    assert (busy.mad.tid & 0xFF, busy.mad.status) == (2, MadStatus.BUSY)
    assert (served.mad.tid & 0xFF, served.mad.status) == (1, 0)
    assert busy_at - started < 0.01 and served_at - started >= 0.5
    assert world.stats["sa_overload"] == 1

"""Any bytes may reach the SA (corruption is one of the injected faults): it never raises."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.fabric.sim.runtime import PortRuntime
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import MadStatus, SaMad

WORLD = SimWorld(generate(4))
REQUESTER = WORLD.port("node2", "mlx5_0", 1)
assert isinstance(REQUESTER, PortRuntime)


@st.composite
def sa_requests(draw: st.DrawFn) -> bytes:
    """Mostly well-formed SA headers (to get past the first checks) with arbitrary contents."""
    header = bytes(
        [
            draw(st.sampled_from([1, 1, 1, 2])),
            3,
            draw(st.sampled_from([2, 2, 2, 1])),
            draw(st.sampled_from([0x01, 0x02, 0x12, 0x15, 0x03, 0x81, 0x14])),
        ]
    )
    status_and_tid = draw(st.binary(min_size=12, max_size=12))
    attr = draw(st.sampled_from([b"\x00\x35", b"\x00\x38", b"\x00\x11", b"\xff\xff"]))
    rest = draw(st.binary(min_size=238, max_size=238))
    return header + status_and_tid + attr + rest


@settings(max_examples=400, deadline=None)
@given(sa_requests())
def test_sa_answers_or_ignores_any_request(mad: bytes) -> None:
    assert len(mad) == 256
    answers = WORLD.sa.handle(REQUESTER, mad)
    for answer in answers:
        reply = SaMad.decode(answer)
        assert reply.mad.method & 0x80
        assert reply.mad.tid == int.from_bytes(mad[8:16], "big")
        if mad[0] != 1 or mad[2] != 2:
            assert reply.mad.status == MadStatus.BAD_VERSION


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=300))
def test_garbage_is_never_answered_with_an_exception(mad: bytes) -> None:
    WORLD.sa.handle(REQUESTER, mad)
    WORLD.sa.busy(mad)

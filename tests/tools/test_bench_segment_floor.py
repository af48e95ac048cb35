"""The segment-floor benchmark reads read -> write on the relay's socket from strace output, and
measures a real relay (trio's and plain Python's) the way daemon_time traces a daemon."""

from __future__ import annotations

import pytest

from tests.bench import segment_floor
from tests.conftest import require_peer

TRACE = """\
7 1000.000000 read(3, "\\0\\0"..., 4096) = 256 <0.000010>
7 1000.000200 write(3, "\\0\\0"..., 256) = 256 <0.000020>
7 1000.010000 read(5, "\\0"..., 4096) = 256 <0.000010>
7 1000.010050 write(5, "\\0"..., 256) = 256 <0.000020>
7 1000.020000 read(3, "\\0"..., 8) = 8 <0.000004>
7 1000.020100 write(3, "\\0\\0"..., 256) = 256 <0.000020>
7 1000.030000 read(3, "\\0\\0"..., 4096) = 256 <0.000100>
7 1000.030500 write(3, "\\0\\0"..., 256) = 256 <0.000020>
"""


def test_a_segment_runs_from_a_mads_read_returning_to_the_next_write_on_that_socket() -> None:
    segments = segment_floor._segments(TRACE, 3)
    # Another descriptor's calls and a short read (a wake-up) start no segment.
    assert segments == [pytest.approx(0.00019), pytest.approx(0.0004)]


@pytest.mark.parametrize("kind", segment_floor.KINDS)
def test_a_real_relay_is_traced_and_timed(kind: str) -> None:
    require_peer("strace")
    figures = segment_floor.measure(kind, events=5, gap=0.001)
    assert figures["events"] == 5
    assert 0 < figures["segment_traced_p50_ms"] < 1000
    assert figures["cpu_per_event_us"] > 0

"""Fuzzing reaches the provider's MAD handler (``acmp_handler``), and the live fuzz runs with
progress; the long runs are ``make fuzz`` and ``make fuzz-live``."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibacm.acmp.cache import EntryState, cache_key
from ibacm.wire.client import AddrType
from tests.reliability.errors import logged_errors
from tests.reliability.live_mad_fuzz import Progress, run
from tests.reliability.mad_handler_target import HandlerRig, handler_seeds


@pytest.fixture
def rig() -> Iterator[HandlerRig]:
    started = HandlerRig()
    try:
        yield started
    finally:
        started.close()


def test_inputs_reach_the_handler_not_only_the_decoder(rig: HandlerRig) -> None:
    """What the old MAD targets never did: a request for node1's address is answered, a
    stranger is learned, a known peer's new LID is noticed, mutated MADs are survived."""
    endpoint = rig.endpoint
    assert endpoint is not None
    seeds = handler_seeds(rig)
    with logged_errors() as errors:
        for seed in seeds:
            rig.feed(seed)
        stats = endpoint.stats
        assert stats.requests_received >= 5 and stats.responses_sent >= 1
        assert stats.responses_received >= 1
        learned = len(endpoint.cache)
        # node2's request (from node2), then again from LID 77: the peer moved.
        request = seeds[0]
        rig.feed(request)
        entry = endpoint.cache.get(cache_key(AddrType.NAME, b"node2"))
        deadline = time.monotonic() + 10
        while entry is not None and entry.state is not EntryState.READY:  # its SA query
            assert time.monotonic() < deadline, entry.state
            time.sleep(0.01)
        rig.feed(request + bytes([2]) + rig.senders[0].gid + (77).to_bytes(2, "big") + b"\x05")
        assert stats.peer_moves == 1
        # A few hundred mutations of the seeds, with random senders: nothing escapes.
        rng = random.Random(7)
        for _ in range(300):
            data = bytearray(rng.choice(seeds))
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            rig.feed(bytes(data))
        assert stats.bad_mads > 0 and len(endpoint.cache) >= learned
    assert errors == []


@pytest.mark.trio
async def test_the_live_fuzz_reports_progress_and_the_daemons_keep_answering(
    tmp_path: Path,
) -> None:
    seen: list[Progress] = []

    def report(progress: Progress) -> None:
        seen.append(Progress(**{**progress.__dict__}))

    with logged_errors() as errors, trio.fail_after(120):
        progress, failures = await run(tmp_path, 1500, seed=3, every=0.3, report=report)
    assert failures == []
    assert progress.done == 1500 and progress.undecodable > 0
    assert progress.bad_counted >= progress.undecodable
    assert len(seen) >= 2 and seen[-1].done == 1500
    assert all(step.answering for step in seen)
    assert errors == []

"""Fuzzing reaches the provider's MAD handler (``acmp_handler``): received ACM MADs and the
SA's answers to its route queries; the live fuzz runs with progress, says so when an input
stalls, and ends with every daemon resolving the fabric's path. The long runs are
``make fuzz`` and ``make fuzz-live`` (and ``make soak``: the live fuzz with 10^5 inputs)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.keys import cache_key
from ibacm.wire.client import AddrType
from tests.reliability import live_mad_fuzz
from tests.reliability.errors import logged_errors
from tests.reliability.live import SOAK, soak
from tests.reliability.live_mad_fuzz import Progress, run
from tests.reliability.mad_handler_target import HandlerRig, handler_seeds, sa_seeds

LIVE_INPUTS = soak(1500, 100_000)


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


def test_sa_answers_reach_the_route_phase(rig: HandlerRig) -> None:
    """An SA MAD input is the SA's answer to node1's route query for a stranger that asked
    for node1: a usable PathRecord makes the entry READY and the stranger is answered;
    NO_RECORDS, BUSY (retried, then nobody answers) and a wrong TID end without a route;
    GetTable answers become bulk routes. Mutations of them are survived."""
    endpoint = rig.endpoint
    assert endpoint is not None
    stats, counts = endpoint.stats, rig.sa
    seeds = sa_seeds(rig)
    with logged_errors() as errors:
        sent = stats.responses_sent
        rig.feed(seeds[0])
        assert (counts.answered, counts.ready, counts.failed) == (1, 1, 0)
        assert stats.responses_sent == sent + 1  # the stranger got node1's address
        for seed in seeds[1:4]:  # NO_RECORDS, BUSY, a wrong TID
            rig.feed(seed)
        assert (counts.answered, counts.ready, counts.failed) == (4, 1, 3)
        assert endpoint.port.sa.busy_retries == 1
        for seed in seeds[4:]:
            rig.feed(seed)
        # node1's paths to the stranger, node2 and node3 went into the bulk table, and were
        # dropped after the input.
        assert (counts.tables, counts.bulk_paths) == (2, 3)
        assert not endpoint.bulk.by_gid and len(endpoint.cache) < 10
        rng = random.Random(11)
        for _ in range(300):
            data = bytearray(rng.choice(seeds))
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data[1] = 0x03  # still an SA answer
            rig.feed(bytes(data))
        assert counts.answered >= 250 and counts.ready > 1 and counts.failed > 10
    assert errors == []


@pytest.mark.trio
@pytest.mark.timeout(900 if SOAK else 120)
async def test_the_live_fuzz_reports_progress_and_the_daemons_keep_answering(
    tmp_path: Path,
) -> None:
    seen: list[Progress] = []

    def report(progress: Progress) -> None:
        seen.append(Progress(**{**progress.__dict__}))

    with logged_errors() as errors, trio.fail_after(800 if SOAK else 100):
        progress, failures = await run(tmp_path, LIVE_INPUTS, seed=3, every=0.3, report=report)
    # Includes: node1 and node2 each flushed and resolved the other again, and got the
    # fabric's path (GIDs and LIDs of both ends), the same as before the fuzz.
    assert failures == []
    assert progress.done == LIVE_INPUTS and progress.undecodable > 0
    assert progress.bad_counted >= progress.undecodable
    assert len(seen) >= 2 and seen[-1].done == LIVE_INPUTS
    assert all(step.answering and not step.stalled for step in seen)
    assert errors == []


@pytest.mark.trio
async def test_a_stalled_input_is_reported_and_ends_the_live_fuzz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input that never settles (here: the wait for it never returns after input 200)
    does not hang the run silently: STALLED lines say what the daemons are doing, every
    ``every`` seconds, and after the stall limit the run fails and still checks the paths."""
    real_settle = live_mad_fuzz.settle
    settled = 0

    async def settle() -> None:
        nonlocal settled
        settled += 1
        if settled > 200:
            await trio.sleep_forever()
        await real_settle()

    monkeypatch.setattr(live_mad_fuzz, "settle", settle)
    seen: list[Progress] = []

    def report(progress: Progress) -> None:
        seen.append(Progress(**{**progress.__dict__}))

    with trio.fail_after(60):
        progress, failures = await run(
            tmp_path, 1000, seed=3, every=0.2, stall_limit=1.0, report=report
        )
    assert progress.done == 200
    assert len(failures) == 1 and failures[0].startswith("input 201 did not settle in 1 s")
    stalls = [step for step in seen if step.stalled]
    assert len(stalls) >= 3 and all(step.done == 200 for step in stalls)
    assert "STALLED: input 201 has not settled" in stalls[-1].line()
    assert "tasks" in stalls[-1].diagnosis and "ACM requests outstanding" in stalls[-1].diagnosis

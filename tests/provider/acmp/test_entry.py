"""A destination entry (``acmp.entry``): its route query, read-only state, its waiters."""

from __future__ import annotations

import math

import pytest
import trio

from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.entry import NO_GID, DestEntry, EntryState, Operation, PendingQuery
from ibacm.provider.acmp.keys import IP, cache_key
from ibacm.provider.route_table import Hit
from ibacm.wire.path_record import PathRecord


def _key(i: int) -> bytes:
    return cache_key(IP, bytes([10, 0, 0, i]))


def test_a_peer_learned_through_acm_has_its_route_query_built_on_demand() -> None:
    cache = DestCache()
    entry = cache.acquire(_key(1))
    assert entry.route_dest() is None and entry.route_query() is None
    group_record = PathRecord(sgid=b"S" * 16, tclass=3, pkey=0xFFFF, sl=5, mtu=4)
    entry.learned_from = group_record
    entry.peer_gid = b"P" * 16
    query = entry.route_query()
    assert query == PathRecord(sgid=b"S" * 16, dgid=b"P" * 16, tclass=3, pkey=0xFFFF)
    assert entry.route_query() is not query  # fresh: nothing stale leaks (defect 33)
    assert entry.route_dest() == (b"P" * 16, 0)
    explicit = PathRecord(dgid=b"H" * 16, dlid=7)
    entry.query = explicit  # a hosts-file or path-form template wins
    assert entry.route_query() is explicit and entry.route_dest() == (b"H" * 16, 7)
    cache.forget(entry)
    assert entry.route_query() is None and entry.av is None and not entry.route_av


@pytest.mark.trio
async def test_an_operation_ends_once_for_every_waiter() -> None:
    op = Operation()
    seen: list[int] = []

    async def wait() -> None:
        await op.done.wait()
        seen.append(op.status)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(wait)
        await trio.sleep(0)
        assert op.finish(6) is True
        assert op.finish(0) is False
    assert seen == [6, 6, 6]


def test_state_and_route_change_only_through_the_cache() -> None:
    entry = DestEntry(_key(1))
    assert entry.state is EntryState.INIT and entry.path is None and entry.peer_gid is NO_GID
    with pytest.raises(AttributeError):
        entry.state = EntryState.READY  # type: ignore[misc]
    with pytest.raises(AttributeError):
        entry.path = PathRecord(dlid=3)  # type: ignore[misc]
    cache = DestCache()
    entry = cache.acquire(_key(1))
    with pytest.raises(ValueError, match="make_ready"):
        cache.set_state(entry, EntryState.READY)
    cache.make_ready(entry, 1.0, 60.0, math.inf, path=PathRecord(dlid=3))
    assert entry.state is EntryState.READY and entry.packed_path() == PathRecord(dlid=3).encode()
    assert entry.describe(3.5)["age"] == 2.5 and entry.describe(3.5)["dlid"] == 3


def test_hits_counted_by_the_client_loop_add_to_the_entry() -> None:
    entry = DestEntry(_key(1))
    entry.hits = 2
    entry.hit = Hit(PathRecord(dlid=3).encode(), math.inf)
    entry.hit.count = 5
    assert entry.total_hits == 7


@pytest.mark.trio
async def test_news_of_a_peer_is_taken_once() -> None:
    entry = DestEntry(_key(1))
    pending = entry.wake = PendingQuery(entry)
    entry.poke(0)
    entry.poke(6, "too late")  # the first news decides
    await pending.done.wait()
    assert (pending.status, pending.reason) == (0, "")
    assert entry.busy is False
    entry.op = Operation()
    assert entry.busy is True

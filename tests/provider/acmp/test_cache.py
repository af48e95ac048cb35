"""The destination cache: its bound, lifetimes and deadlines, through ``DestCache``."""

from __future__ import annotations

import math

from ibacm.compiled import is_compiled
from ibacm.provider.acmp import cache as cache_module
from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.entry import EntryState, Operation
from ibacm.provider.acmp.keys import (
    IP,
    cache_key,
)
from ibacm.wire.path_record import PathRecord

ROUTE = PathRecord(dlid=7, sl=1)


def _key(i: int) -> bytes:
    return cache_key(IP, bytes([10, 0, 0, i]))


def test_bound_evicts_the_least_recently_used_idle_entry() -> None:
    cache = DestCache(max_entries=3)
    entries = [cache.acquire(_key(i)) for i in range(3)]
    cache.get(_key(0))  # node 0 is now the most recently used
    entries[1].op = Operation()  # someone waits on node 1: never evicted
    cache.acquire(_key(3))
    assert cache.get(_key(2)) is None
    assert cache.get(_key(0)) is entries[0] and cache.get(_key(1)) is entries[1]
    assert cache.evicted == 1 and len(cache) == 3


def test_a_full_cache_drops_its_oldest_unused_entries_at_once() -> None:
    def key(i: int) -> bytes:
        return cache_key(IP, bytes([10, 1, i >> 8, i & 0xFF]))

    def gone(upto: int) -> list[int]:  # without a lookup, which would count as a use
        present = {entry.key for entry in cache.learned()}
        return [i for i in range(upto) if key(i) not in present]

    cache = DestCache(max_entries=128)
    for i in range(128):
        cache.acquire(key(i))
    cache.get(key(0))  # used since it was cached: it gets a second chance
    cache.acquire(key(128))
    # 1/64 below the bound: 126 left, the three oldest entries nobody used are gone.
    assert len(cache) == 126 and cache.evicted == 3
    assert gone(129) == [1, 2, 3]
    # Its second chance spent, entry 0 goes when it is the oldest unused one; new entries
    # nobody used yet go before entries used since the last pass.
    for i in range(4, 129):
        cache.get(key(i))
    for i in range(129, 132):
        cache.acquire(key(i))
    assert gone(132) == [0, 1, 2, 3, 129, 130] and cache.evicted == 6


def test_bound_never_evicts_the_new_entry_or_loopback_entries() -> None:
    cache = DestCache(max_entries=1)
    local = cache.acquire(_key(9))
    cache.put_loopback(local, ROUTE, 0.0)
    busy = cache.acquire(_key(1))
    busy.reply_tid = 5
    new = cache.acquire(_key(2))
    assert cache.get(_key(2)) is new and cache.get(_key(9)) is local
    assert len(list(cache.learned())) == 2  # over the bound only while busy


def test_unbounded_cache_grows() -> None:
    cache = DestCache(max_entries=0)
    for i in range(200):
        cache.acquire(cache_key(IP, i.to_bytes(4, "big")))
    assert len(cache) == 200 and cache.evicted == 0


def test_expiry_removes_addresses_and_demotes_routes() -> None:
    cache = DestCache()
    gone, demoted, forever = (cache.acquire(_key(i)) for i in range(3))
    cache.make_ready(gone, 0.0, addr_lifetime=60.0, route_lifetime=math.inf, path=ROUTE)
    cache.make_ready(demoted, 0.0, addr_lifetime=600.0, route_lifetime=60.0, path=ROUTE)
    cache.make_ready(forever, 0.0, addr_lifetime=math.inf, route_lifetime=math.inf, path=ROUTE)
    assert cache.next_deadline() == 60.0
    assert cache.expire(59.0) == 0
    assert cache.expire(60.0) == 2
    assert cache.get(_key(0)) is None
    assert demoted.state is EntryState.ADDR_RESOLVED
    assert forever.state is EntryState.READY
    assert cache.expire(1e9) == 1  # demoted's address lifetime ends too
    assert cache.next_deadline() == math.inf


def test_peers_learned_in_one_batch_share_their_deadline() -> None:
    cache = DestCache()
    batch_time, later = 12.5, 13.25
    first, second, third = (cache.acquire(_key(i)) for i in range(3))
    cache.set_addr_timeout(first, batch_time, 600.0)
    cache.set_addr_timeout(second, batch_time, 600.0)
    cache.set_addr_timeout(third, later, 600.0)
    assert first.addr_expiry == second.addr_expiry == 612.5 and third.addr_expiry == 613.25
    if not is_compiled(cache_module):
        # One float object for the batch; compiled, the entry holds the float unboxed.
        assert first.addr_expiry is second.addr_expiry
    # An equal time that is not the batch's own reading, or another lifetime: computed anew.
    fourth, fifth = cache.acquire(_key(4)), cache.acquire(_key(5))
    cache.set_addr_timeout(fourth, later, 60.0)
    cache.set_addr_timeout(fifth, later, 600.0)
    assert (fourth.addr_expiry, fifth.addr_expiry) == (73.25, 613.25)
    for entry in (first, second, third, fourth, fifth):
        cache.set_state(entry, EntryState.ADDR_RESOLVED)
    assert cache.expire(100.0) == 1 and cache.get(_key(4)) is None
    assert cache.expire(613.0) == 2  # the batch
    assert [cache.get(_key(i)) for i in (2, 5)] == [third, fifth]


def test_expiry_leaves_entries_being_resolved_alone() -> None:
    cache = DestCache()
    entry = cache.acquire(_key(1))
    cache.make_ready(entry, 0.0, 60.0, 60.0, ROUTE)
    entry.op = Operation()
    assert cache.expire(100.0) == 0
    assert cache.get(_key(1)) is entry


def test_extended_lifetimes_win_over_old_deadlines() -> None:
    cache = DestCache()
    entry = cache.acquire(_key(1))
    cache.make_ready(entry, 0.0, 60.0, math.inf, ROUTE)
    cache.set_timeouts(entry, 50.0, 60.0, math.inf)
    assert cache.expire(70.0) == 0
    assert cache.expire(110.0) == 1


def test_background_expiry_groups_deadlines_by_the_second() -> None:
    cache = DestCache()
    entries = [cache.acquire(_key(i)) for i in range(50)]
    for i, entry in enumerate(entries):
        # 50 deadlines spread over 60.01 .. 60.50: one wake-up for all of them.
        cache.make_ready(entry, (i + 1) / 100, 60.0, math.inf, ROUTE)
    assert cache.next_deadline() == 61.0
    assert cache.expire(60.99) == 0  # never early
    assert cache.expire(61.0) == 50  # at most a second late
    assert len(cache) == 0 and cache.expired == 50


def test_lookups_expire_exactly_even_when_the_sweep_is_late() -> None:
    cache = DestCache()
    entry = cache.acquire(_key(1))
    cache.make_ready(entry, 0.25, addr_lifetime=60.0, route_lifetime=math.inf, path=ROUTE)
    assert entry.addr_expiry == 60.25
    assert cache.next_deadline() == 61.0

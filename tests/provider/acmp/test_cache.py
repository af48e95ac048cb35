"""The destination cache: canonical keys, its bound, lifetimes, operations."""

from __future__ import annotations

import math

import pytest
import trio

from ibacm.compiled import is_compiled
from ibacm.provider.acmp import cache as cache_module
from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.entry import EntryState, Operation
from ibacm.provider.acmp.keys import (
    GID,
    IP,
    IP6,
    LID,
    NAME,
    CacheKeyError,
    cache_key,
    describe_key,
    key_address,
    key_type,
    lid_key,
)
from ibacm.wire.path_record import PathRecord

ROUTE = PathRecord(dlid=7, sl=1)


def test_name_keys_ignore_case_and_trailing_bytes() -> None:
    a = cache_key(NAME, b"Node10")
    b = cache_key(NAME, b"NODE10\0junk-after-the-terminator".ljust(64, b"\0"))
    assert a == b
    assert (key_type(a), key_address(a)) == (NAME, b"node10")


def test_keys_keep_only_significant_bytes() -> None:
    ip = bytes([10, 0, 0, 1])
    assert cache_key(IP, ip + b"\x99" * 60) == cache_key(IP, ip)
    assert cache_key(LID, b"\x00\x05") == lid_key(5)
    # Each type's significant bytes, zero-filled to that size, never to the wire's 64.
    assert key_address(cache_key(GID, bytes(16))) == bytes(16)
    assert cache_key(IP, bytes([10])) == cache_key(IP, bytes([10, 0, 0, 0]))
    assert key_address(cache_key(IP, bytes([10]))) == bytes([10, 0, 0, 0])
    assert key_address(cache_key(NAME, b"node1".ljust(64, b"\0"))) == b"node1"
    # One type's key never equals another's, whatever the bytes.
    assert cache_key(IP, bytes([10, 0, 0, 1])) != cache_key(NAME, bytes([10, 0, 0, 1]))
    assert key_type(cache_key(IP6, bytes(16))) == IP6 and key_type(lid_key(5)) == LID


@pytest.mark.parametrize(("kind", "address"), [(0, b"x"), (6, b"x"), (0x10, b"x"), (IP, bytes(65))])
def test_bad_keys_are_refused(kind: int, address: bytes) -> None:
    with pytest.raises(CacheKeyError):
        cache_key(kind, address)


def test_keys_describe_themselves() -> None:
    assert describe_key(cache_key(IP, bytes([10, 1, 2, 3]))) == "10.1.2.3"
    assert describe_key(lid_key(7)) == "lid 7"
    assert describe_key(cache_key(NAME, b"node1")) == "node1"
    assert describe_key(cache_key(GID, bytes.fromhex("fe80" + "00" * 14))) == "fe80::"


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

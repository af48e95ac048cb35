"""Which entries a full cache drops (``acmp.eviction``): the CLOCK pass, driven directly."""

from __future__ import annotations

import math

from ibacm.provider.acmp.entry import USED, DestEntry, Operation
from ibacm.provider.acmp.eviction import BOUND_SLACK, evict
from ibacm.provider.acmp.keys import IP, CacheKey, cache_key
from ibacm.provider.route_table import Hit


def _entries(n: int) -> dict[CacheKey, DestEntry]:
    keys = [cache_key(IP, (0x0A000000 + i).to_bytes(4, "big")) for i in range(n)]
    return {key: DestEntry(key) for key in keys}


def test_the_oldest_unused_idle_entries_go_down_to_the_slack() -> None:
    entries = _entries(129)
    order = list(entries.values())
    newest = order[-1]
    gone = evict(entries, 128, newest.key)
    # 1/64 below the bound at once: 129 - (128 - 2) = 3 entries, the oldest.
    assert 128 // BOUND_SLACK == 2
    assert gone == order[:3] and len(entries) == 126 and newest.key in entries


def test_used_busy_and_new_entries_get_a_second_chance() -> None:
    entries = _entries(6)
    looked_up, busy, answered, idle, idle2, new = list(entries.values())
    looked_up.seen = USED  # looked up on the trio side since the last pass
    busy.op = Operation()  # a resolution works on it
    answered.hit = Hit(b"\0" * 64, math.inf)
    answered.hit.count = 4  # the client loop answered from it since the last pass
    gone = evict(entries, 4, new.key)
    assert gone == [idle, idle2]
    # Passed over: marked seen (a second pass without a new use evicts them) and younger.
    assert list(entries.values()) == [new, looked_up, busy, answered]
    assert looked_up.seen == 0 and answered.seen == 4
    gone = evict(entries, 2, new.key)
    assert gone == [looked_up, answered] and busy.key in entries


def test_a_cache_of_busy_entries_evicts_nothing() -> None:
    entries = _entries(5)
    for entry in entries.values():
        entry.reply_tid = 7  # a peer awaits our answer
    assert evict(entries, 2, next(iter(entries))) == [] and len(entries) == 5

"""The cache's deadlines by the second (``acmp.deadlines``), driven directly."""

from __future__ import annotations

import math

from ibacm.provider.acmp.deadlines import ExpirySchedule, deadline
from ibacm.provider.acmp.entry import DestEntry
from ibacm.provider.acmp.keys import IP, CacheKey, cache_key


def _entry(i: int) -> DestEntry:
    return DestEntry(cache_key(IP, bytes([10, 0, 0, i])))


def test_a_deadline_is_never_when_the_lifetime_is() -> None:
    assert deadline(5.0, math.inf) == math.inf and deadline(5.0, 60.0) == 65.0


def test_deadlines_of_one_second_share_a_list_and_wake_up_once() -> None:
    schedule = ExpirySchedule()
    a, b = _entry(1), _entry(2)
    schedule.schedule(a, 60.25)
    schedule.schedule(b, 60.75)
    assert schedule.next_deadline() == 61.0 and len(schedule) == 2
    assert a.scheduled == b.scheduled == 61.0
    schedule.schedule(a, 90.0)  # later than its pending wake-up: waits for it
    assert len(schedule) == 2
    assert schedule.take_due(60.9) == []
    assert schedule.take_due(61.0) == [a, b]
    assert a.scheduled == math.inf and schedule.next_deadline() == math.inf
    assert schedule.take_due(1000.0) == []  # each entry is taken once


def test_an_earlier_deadline_takes_over_the_wake_up() -> None:
    schedule = ExpirySchedule()
    entry = _entry(1)
    schedule.schedule(entry, 120.0)
    schedule.schedule(entry, 30.5)
    assert entry.scheduled == 31.0 and schedule.next_deadline() == 31.0
    assert schedule.take_due(31.0) == [entry]
    # The later second still lists it, but its wake-up was taken: nothing more is due.
    assert schedule.take_due(120.0) == []


def test_loopback_entries_and_never_are_not_scheduled() -> None:
    schedule = ExpirySchedule()
    loopback = _entry(1)
    loopback.loopback = True
    schedule.schedule(loopback, 10.0)
    schedule.schedule(_entry(2), math.inf)
    assert len(schedule) == 0 and schedule.next_deadline() == math.inf


def test_entries_that_leave_leave_every_list_and_empty_seconds_leave_the_heap() -> None:
    schedule = ExpirySchedule()
    entries = [_entry(i) for i in range(1, 9)]
    still: dict[CacheKey, DestEntry] = {}
    for i, entry in enumerate(entries):
        entry.addr_expiry = 100.0 + i  # a deadline of its own besides the wake-up
        schedule.schedule(entry, 10.0 + i)
        schedule.schedule(entry, entry.addr_expiry)  # waits: no second slot
    kept = entries[0]
    still[kept.key] = kept
    schedule.unschedule(entries[1:], still)
    assert len(schedule) == 1 and schedule.next_deadline() == 10.0
    assert all(entry.scheduled == math.inf for entry in entries[1:])
    assert schedule.take_due(1000.0) == [kept]

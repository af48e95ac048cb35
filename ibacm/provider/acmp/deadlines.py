"""When the cache looks at which entry again: its deadlines, grouped by the second.

Expiry runs in the background from these deadlines (``DestCache.expire``), besides the
on-lookup checks of C, so entries of peers nobody asks for again do not stay forever. The
on-lookup checks are exact; the background sweep may come up to a second late, which costs an
entry a list slot instead of a heap item of its own.

An entry has one pending wake-up (``DestEntry.scheduled``): a later deadline waits for the
earlier wake-up, which schedules what is left. An entry that leaves the cache (evicted,
expired, flushed, replaced by a loopback entry) leaves the lists too, at once: otherwise an
evicted entry stayed in its list with its address vector and route until its deadline (24
hours by default), and a bound on entries bounded nothing of the memory under a flood of new
sources. The lists it may be in (its pending wake-up's and its deadlines') are rebuilt without
it, once per batch of evictions, and a second whose list empties leaves the heap when half of
it is such seconds.

Times are trio clock seconds; ``math.inf`` means "never".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from ibacm.provider.acmp.entry import DestEntry
from ibacm.provider.acmp.keys import CacheKey


def deadline(now: float, lifetime: float) -> float:
    """``now + lifetime``; "never" is the one shared math.inf rather than a new float per
    entry (routes never expire by default, and an all-to-all makes N^2 entries)."""
    return math.inf if lifetime == math.inf else now + lifetime


class ExpirySchedule:
    """The entries of one cache to look at, by the whole second their wake-up falls in."""

    def __init__(self) -> None:
        self._due: dict[float, list[DestEntry]] = {}
        """Entries to look at, by the whole second their earliest deadline falls in."""
        self._seconds: list[float] = []
        """Heap of the keys of ``_due``."""
        self._second_of: dict[float, float] = {}
        """Each key of ``_due`` by itself (see ``schedule``)."""
        self._empty_seconds = 0
        """Seconds in the heap whose list emptied (see ``unschedule``)."""

    def schedule(self, entry: DestEntry, deadline: float) -> None:
        """Wake ``entry`` up by ``deadline`` (rounded up to its second)."""
        # One pending wake-up per entry: a later deadline waits for the earlier wake-up,
        # which schedules what is left (an all-to-all would queue 3 wake-ups per entry).
        if deadline == math.inf or entry.loopback:
            return
        second = float(math.ceil(deadline))
        if entry.scheduled <= second:
            return
        due = self._due.get(second)
        if due is None:
            self._due[second] = [entry]
            self._second_of[second] = second
            heapq.heappush(self._seconds, second)
        else:
            due.append(entry)
            # The bucket's own float: entries of one second share it (24 bytes each, and a
            # job start schedules N-1 entries in the same second or two).
            second = self._second_of[second]
        entry.scheduled = second

    def unschedule(self, gone: Iterable[DestEntry], entries: dict[CacheKey, DestEntry]) -> None:
        """Take entries that left the cache out of every deadline list they may be in: their
        pending wake-up's, and their deadlines' (a wake-up that came earlier than a deadline
        leaves the entry in that deadline's list too). ``entries``: what is still in the
        cache (a replaced key's new entry may share a list)."""
        seconds: set[float] = set()
        for entry in gone:
            for when in (entry.scheduled, entry.addr_expiry, entry.route_expiry):
                if when != math.inf:
                    seconds.add(float(math.ceil(when)))
            entry.scheduled = math.inf
        for second in seconds:
            due = self._due.get(second)
            if due is None:
                continue
            kept = [entry for entry in due if entries.get(entry.key) is entry]
            if kept:
                due[:] = kept
                continue
            del self._due[second]
            del self._second_of[second]
            self._empty_seconds += 1
        if self._empty_seconds * 2 > len(self._seconds):
            # Seconds without a list go from the heap once they are half of it.
            self._seconds = [second for second in self._seconds if second in self._due]
            heapq.heapify(self._seconds)
            self._empty_seconds = 0

    def next_deadline(self) -> float:
        return self._seconds[0] if self._seconds else math.inf

    def take_due(self, now: float) -> list[DestEntry]:
        """The entries whose wake-up is due at ``now``, taken out of the schedule (each
        once; ``scheduled`` cleared). Deadlines the caller schedules again are later than
        ``now``, so none of them is due in the same call."""
        taken: list[DestEntry] = []
        while self._seconds and self._seconds[0] <= now:
            second = heapq.heappop(self._seconds)
            self._second_of.pop(second, None)
            due = self._due.pop(second, None)
            if due is None:
                self._empty_seconds = max(0, self._empty_seconds - 1)
                continue  # its entries all left the cache before
            for entry in due:
                if entry.scheduled != second:
                    continue  # an earlier wake-up of this entry took over
                entry.scheduled = math.inf
                taken.append(entry)
        return taken

    def __len__(self) -> int:
        """Slots in the deadline lists (an entry may hold more than one): what the bound
        and the tests check never outgrows the cache."""
        return sum(len(due) for due in self._due.values())

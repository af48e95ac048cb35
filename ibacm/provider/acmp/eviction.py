"""Which entries a full destination cache drops: its bound (``cache_max_entries``).

A bound evicts a learned entry nobody is waiting on and nobody used lately (defect 32): the
oldest ones not used since they were last passed over, in the "second chance" (CLOCK)
approximation of least recently used, as page caches do, down to 1/64 below the bound at
once. A use is a lookup (``DestCache.get`` marks the entry ``USED``) or a request the client
loop answered from the entry's Hit (its count grew since the last pass); an exact order cost
an OrderedDict (twice a dict's memory per entry) and a reordering per lookup. Loopback
entries are not in the map passed here and are never evicted.
"""

from __future__ import annotations

from ibacm.provider.acmp.entry import DestEntry
from ibacm.provider.acmp.keys import CacheKey

BOUND_SLACK = 64
"""A full cache drops its oldest idle entries down to 1/BOUND_SLACK below the bound."""


def evict(entries: dict[CacheKey, DestEntry], limit: int, keep: CacheKey) -> list[DestEntry]:
    """Take the entries to evict out of ``entries`` (learned entries, oldest first), which
    holds more than ``limit``; ``keep`` (the entry just made) stays. The caller takes what
    it returns out of the rest of the cache."""
    # Down to 1/64 below the bound at once: a pass starts at the oldest end, behind the
    # holes the young-end moves leave in a dict, so it is paid once per batch.
    excess = len(entries) - (limit - limit // BOUND_SLACK)
    # Used entries (looked up, or their Hit counted by the client loop since the last pass)
    # are marked seen and go to the young end, busy ones and the new one just go there: the
    # second pass finds entries to drop unless all are busy.
    evicted: list[DestEntry] = []
    for _ in range(2):
        for key in list(entries):
            if excess <= 0:
                break
            entry = entries.pop(key)
            hit = entry.hit
            count = hit.count if hit is not None else 0
            used = entry.seen != count
            if used or entry.busy or key == keep:
                entry.seen = count
                entries[key] = entry
                continue
            excess -= 1
            evicted.append(entry)
        if excess <= 0:
            break
    return evicted

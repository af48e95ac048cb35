"""The route table a cache publishes (``acmp.publication``), driven directly."""

from __future__ import annotations

import math

from ibacm.provider.acmp.entry import USED, DestEntry
from ibacm.provider.acmp.keys import IP, cache_key
from ibacm.provider.acmp.publication import RoutePublication, fold
from ibacm.wire.path_record import PathRecord

PACKED = PathRecord(dlid=3).encode()


def _ready(i: int, addr_expiry: float = 60.0) -> DestEntry:
    entry = DestEntry(cache_key(IP, bytes([10, 0, 0, i])))
    entry.addr_expiry = addr_expiry
    return entry


def test_nothing_is_answered_until_the_endpoint_serves() -> None:
    publication = RoutePublication()
    entry = _ready(1)
    hit = publication.renew(entry, PACKED)
    assert hit is not None and hit.expiry == 60.0 and entry.hit is hit
    publication.put(entry.key, hit)
    assert len(publication.table.routes) == 0  # not serving: not answered
    publication.set_serving(True, [entry])
    assert publication.table.routes[entry.key] is hit
    assert publication.table.find(IP, bytes([10, 0, 0, 1]), 59.0) is hit
    assert publication.table.find(IP, bytes([10, 0, 0, 1]), 60.0) is None  # expired
    publication.set_serving(False, [entry])
    assert len(publication.table.routes) == 0


def test_a_hit_is_remade_only_when_its_route_or_lifetime_changed() -> None:
    publication = RoutePublication()
    publication.set_serving(True, [])
    entry = _ready(1)
    first = publication.renew(entry, PACKED)
    assert first is not None
    publication.put(entry.key, first)
    first.count = 3  # answered three times by the client loop
    assert publication.renew(entry) is None  # nothing changed
    entry.addr_expiry = 120.0
    second = publication.renew(entry)
    assert second is not None and second.packed is PACKED and second.expiry == 120.0
    assert entry.hits == 3 and entry.total_hits == 3  # the old Hit's count stays counted
    loopback = _ready(2)
    loopback.loopback = True
    hit = publication.renew(loopback, PACKED)
    assert hit is not None and hit.expiry == math.inf


def test_dropped_hits_leave_the_table_and_keep_their_counts() -> None:
    publication = RoutePublication()
    publication.set_serving(True, [])
    entries = [_ready(i) for i in range(1, 4)]
    for entry in entries:
        hit = publication.renew(entry, PACKED)
        assert hit is not None
        publication.put(entry.key, hit)
    assert entries[0].hit is not None
    entries[0].hit.count = 2
    publication.drop(entries[:2])
    assert set(publication.table.routes) == {entries[2].key}
    assert entries[0].hit is None and entries[0].hits == 2 and entries[0].seen == USED
    assert entries[1].seen == 0  # not used since the bound last looked


def test_a_batch_publishes_once_at_its_end() -> None:
    publication = RoutePublication()
    publication.set_serving(True, [])
    before = publication.table.routes
    with publication.batch():
        for i in range(1, 4):
            entry = _ready(i)
            hit = publication.renew(entry, PACKED)
            assert hit is not None
            publication.put(entry.key, hit)
        with publication.batch():  # nested: still one publication
            pass
        assert publication.table.routes is before
    assert len(publication.table.routes) == 3


def test_fold_marks_a_grown_count_as_a_use() -> None:
    entry = _ready(1)
    publication = RoutePublication()
    made = publication.renew(entry, PACKED)
    assert made is not None
    entry.seen = 0
    fold(entry, made)  # no request since the bound's last pass
    assert entry.seen == 0
    made.count = 1
    fold(entry, made)
    assert entry.seen == USED and entry.hits == 1

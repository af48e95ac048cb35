"""The ACM counters, each defined once: where it sits on the wire and what every output calls it.

A member's value is its index in a PERF_QUERY reply (client-protocol.md §6, ``ACM_CNTR_*``)
and in the admin protocol's arrays: the real ``ib_acme`` and the C daemon read and write the
counters in this order, so a counter is never renumbered, and a new one goes last (past
``ACM_MAX_COUNTER``, off the PERF wire). Its other names:

* ``label``: ``ib_acme -P``'s name for it (ib_acme.md §5), the C tool's text exactly;
* ``key``: its name in the admin protocol's JSON, in ``ibacm-admin`` and in /metrics
  (``ibacm_<key>_total``): the C enum's name lower-cased (``ACM_CNTR_NODATA`` -> ``nodata``);
* ``description``: the help text of its /metrics series;
* ``heading``: its column on the dashboard's Counters tab.

What bumps each one is behavior.md §14; the provider API hands them to providers as
``ibacm.provider.api.Counter``. A new counter is a member here, after the last, plus the code
that counts it: the admin snapshot, ``ibacm-admin``, /metrics and the dashboard follow.
"""

from __future__ import annotations

import enum
from typing import Final

COUNTER_MASK: Final = 0xFFFFFFFFFFFFFFFF
"""Counters are unbounded ints, reported modulo 2**64 (C used 32-bit signed ints)."""

ACM_MAX_COUNTER: Final = 7
"""The counters of the C daemon (``ACM_MAX_COUNTER``): the first members of ``Counter``, and
all that a PERF_QUERY reply carries and a C provider knows. Never more on the wire: Debian's
``ib_acme -P`` dies of SIGSEGV on a reply with more, so a counter of our own, after these, is
seen in the admin snapshot, /metrics, ``ibacm-admin`` and the dashboard only."""


class Counter(enum.IntEnum):
    """The counters in wire order: the admin protocol's arrays hold ``len(Counter)`` of them,
    a PERF_QUERY reply the first ``ACM_MAX_COUNTER``."""

    label: str
    description: str
    heading: str

    def __new__(cls, index: int, *names: str) -> Counter:
        # Names as a tail, so that ``Counter(index)`` (a look-up by value) type-checks too.
        member = int.__new__(cls, index)
        member._value_ = index
        member.label, member.description, member.heading = names
        return member

    # index, ib_acme label, /metrics help, dashboard heading
    ERROR = 0, "Error Count", "Resolve requests answered with an error", "Errors"
    RESOLVE = 1, "Resolve Count", "Resolve requests received", "Resolves"
    NODATA = 2, "No Data", "Resolve requests answered with no data", "No data"
    ADDR_QUERY = 3, "Addr Query Count", "Address resolutions sent to peers", "Addr queries"
    ADDR_CACHE = 4, "Addr Cache Count", "Address resolutions answered from the cache", "Addr hits"
    ROUTE_QUERY = 5, "Route Query Count", "Path records queried from the SA", "Route queries"
    ROUTE_CACHE = 6, "Route Cache Count", "Path records answered from the cache", "Route hits"

    @property
    def key(self) -> str:
        return self.name.lower()

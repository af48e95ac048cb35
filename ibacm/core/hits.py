"""Cache hits: a RESOLVE answered from the providers' route tables, in the client loop's thread.

The common request (address form, SOURCE then DEST, as ``ib_acme`` and librdmacm send it)
goes from the source address to its endpoint's ``RouteTable`` (``DeviceList.route_tables``)
and from the destination to its ``Hit``: two dict lookups and the reply's bytes, with no
provider code, no decoding into objects and no trio on the way. Everything else (another
shape, a miss, an expired route) returns None and goes to the dispatcher on the trio side,
which answers exactly as before, counters included.

Thread rules: what is read here the trio side only replaces whole (``route_tables``, a
table's ``routes`` and ``key``, ``max_paths``); what is written here nobody else writes
(the tally, a table's ``hits``, a hit's ``count``, the source key memo).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ibacm.core.model import (
    LOCAL_ADDRESS_TYPES,
    AddressKey,
    DeviceList,
    DeviceState,
    make_address_key,
)
from ibacm.provider.api import Counter, Counters
from ibacm.wire.client import (
    EpFlag,
    encode_one_path_reply,
    is_address_type,
    unpack_resolve_pair,
)

# Final: mypyc keeps them in C statics, not in the module's dict (read on every request).
_SOURCE: Final = int(EpFlag.SOURCE)
_DEST: Final = int(EpFlag.DEST)
_NOT_NODELAY: Final = ~int(EpFlag.NODELAY)
_RESOLVE: Final = int(Counter.RESOLVE)
_ROUTE_CACHE: Final = int(Counter.ROUTE_CACHE)
SOURCE_KEYS_MAX = 1024
"""Source address keys remembered; a client naming ever new sources costs a rebuild."""


class HitPath:
    """Answers cache hits for the client loop (one instance per loop, used by its thread)."""

    __slots__ = ("_keys", "devices", "max_paths", "tally")

    def __init__(self, devices: Sequence[DeviceState], max_paths: int) -> None:
        self.devices = devices if isinstance(devices, DeviceList) else None
        """The tables' holder; None (a plain list, in some tests): no hit is answered here."""
        self.max_paths = max_paths
        """Paths a reply may carry (the ``max_paths`` of the dispatcher): below 1, none is
        answered here."""
        self.tally = Counters()
        """The daemon-wide RESOLVE and ROUTE_CACHE counts of the hits answered here (added to
        the global counters' snapshot as a tally: this thread is their one writer)."""
        self._keys: dict[tuple[int, bytes], AddressKey] = {}

    def answer(self, frame: bytes, now: float) -> bytes | None:
        """The reply to the framed request ``frame`` if it is a cache hit at trio time
        ``now``, else None (nothing counted, nothing changed): what the dispatcher would
        answer at once, as a RESOLVE of the common shape (two entries, address form)."""
        devices = self.devices
        if devices is None or self.max_paths < 1:
            return None
        fields = unpack_resolve_pair(frame)
        if fields is None:
            return None
        flags0, type0, _, info0, flags1, type1, _, info1 = fields
        # One SOURCE and one DEST (NODELAY changes nothing for a hit), in either order,
        # nothing else flagged: the plan is known without building it.
        if flags0 == _SOURCE and flags1 & _NOT_NODELAY == _DEST:
            pass
        elif flags1 == _SOURCE and flags0 & _NOT_NODELAY == _DEST:
            type0, info0, type1, info1 = type1, info1, type0, info0
        else:
            return None
        if type0 not in LOCAL_ADDRESS_TYPES or not is_address_type(type1):
            return None
        table = devices.route_tables.get(self._source_key(type0, info0))
        if table is None:
            return None
        hit = table.find(type1, info1, now)
        if hit is None:
            return None
        hit.count += 1
        table.hits += 1
        values = self.tally.values
        values[_RESOLVE] += 1
        values[_ROUTE_CACHE] += 1
        return encode_one_path_reply(frame, hit.packed)

    def _source_key(self, addr_type: int, info: bytes) -> AddressKey:
        keys = self._keys
        found = keys.get((addr_type, info))
        if found is None:
            if len(keys) >= SOURCE_KEYS_MAX:
                keys.clear()
            found = keys[(addr_type, info)] = make_address_key(addr_type, info)
        return found

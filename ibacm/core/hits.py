"""Cache hits: a RESOLVE answered from the providers' route tables, in the client loop's thread.

The common request (address form, SOURCE then DEST, as ``ib_acme`` and librdmacm send it)
goes from the source address to its endpoint's ``RouteTable`` (``DeviceList.route_tables``)
and from the destination to its ``Hit``: two dict lookups and the reply's bytes, with no
provider code, no decoding into objects and no trio on the way. Everything else (another
opcode byte than 0x01, another shape, a miss, an expired route) returns None and goes to the
dispatcher on the trio side, which answers exactly as before, counters included.

A request asked before is answered from a memo of its entries' bytes (``_Known``): the
route table and hit it led to, valid while ``route_tables``, that table's ``routes`` and its
``key`` are the very objects they were (the trio side replaces them whole on every change)
and the hit has not expired. A repeated RESOLVE then costs a dict lookup, not the parse, the
two keys and the two lookups of the first time.

Thread rules: what is read here the trio side only replaces whole (``route_tables``, a
table's ``routes`` and ``key``, ``max_paths``); what is written here nobody else writes
(the tally, a table's ``hits``, a hit's ``count``, the source key memo, the request memo).
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
from ibacm.provider.route_table import Hit, RouteTable
from ibacm.wire.client import (
    HDR_LEN,
    PAIR_LENGTH,
    AcmOp,
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
_RESOLVE_OP: Final = int(AcmOp.RESOLVE)
_PAIR_LENGTH: Final = PAIR_LENGTH
_ENTRIES_AT: Final = HDR_LEN
_LOCAL_TYPES: Final = LOCAL_ADDRESS_TYPES
SOURCE_KEYS_MAX = 1024
"""Source address keys remembered; a client naming ever new sources costs a rebuild."""
KNOWN_MAX = 4096
"""Requests remembered with their answer (``_Known``); past that the memo starts anew."""


class _Known:
    """What a request's entries led to, and the objects that made it true."""

    __slots__ = ("hit", "key", "routes", "table")

    def __init__(self, table: RouteTable, hit: Hit) -> None:
        self.table = table
        self.routes = table.routes
        self.key = table.key
        self.hit = hit


class HitPath:
    """Answers cache hits for the client loop (one instance per loop, used by its thread)."""

    __slots__ = ("_keys", "_known", "_tables", "_values", "devices", "max_paths", "tally")

    def __init__(self, devices: Sequence[DeviceState], max_paths: int) -> None:
        self.devices = devices if isinstance(devices, DeviceList) else None
        """The tables' holder; None (a plain list, in some tests): no hit is answered here."""
        self.max_paths = max_paths
        """Paths a reply may carry (the ``max_paths`` of the dispatcher): below 1, none is
        answered here."""
        self.tally = Counters()
        """The daemon-wide RESOLVE and ROUTE_CACHE counts of the hits answered here (added to
        the global counters' snapshot as a tally: this thread is their one writer)."""
        self._values = self.tally.values  # the counters' list, never replaced
        self._keys: dict[tuple[int, bytes], AddressKey] = {}
        self._known: dict[bytes, _Known] = {}
        """Request entries (the bytes after the header) -> what they were answered with."""
        self._tables: object = None
        """The ``route_tables`` the memo was made from."""

    def answer(self, frame: bytes, now: float) -> bytes | None:
        """The reply to the framed request ``frame`` if it is a cache hit at trio time
        ``now``, else None (nothing counted, nothing changed): what the dispatcher would
        answer at once, as a RESOLVE of the common shape (two entries, address form)."""
        devices = self.devices
        if devices is None or self.max_paths < 1:
            return None
        if len(frame) != _PAIR_LENGTH or frame[1] != _RESOLVE_OP:
            return None  # opcode 0x81 and the like: the dispatcher refuses them
        tables = devices.route_tables
        known = self._known
        if tables is not self._tables:
            known.clear()  # another map of tables: nothing remembered holds
            self._tables = tables
        entries = frame[_ENTRIES_AT:]
        seen = known.get(entries)
        if seen is not None:
            table = seen.table
            if table.routes is seen.routes and table.key is seen.key and now < seen.hit.expiry:
                return self._answered(frame, table, seen.hit)
        fields = unpack_resolve_pair(frame)
        if fields is None:  # never: the length was checked above (the codec's own check)
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
        if type0 not in _LOCAL_TYPES or not is_address_type(type1):
            return None
        found = tables.get(self._source_key(type0, info0))
        if found is None:
            return None
        hit = found.find(type1, info1, now)
        if hit is None:
            return None
        if len(known) >= KNOWN_MAX:
            known.clear()
        known[entries] = _Known(found, hit)
        return self._answered(frame, found, hit)

    def _answered(self, frame: bytes, table: RouteTable, hit: Hit) -> bytes:
        hit.count += 1
        table.hits += 1
        values = self._values
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

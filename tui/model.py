"""What the dashboard knows about the daemon: snapshot + events folded into plain rows.

Pure: no widgets and no I/O, so it is tested without a terminal. The app feeds it snapshots
and events as they arrive (cheap) and asks for display rows at most a few times a second
(coalescing); the ``dirty`` flags say which views changed since the last look.

Readers of the admin protocol must tolerate missing and extra keys; the normalizers here
accept the field spellings documented in ``docs/admin-protocol.md`` plus close variants
(``address`` for ``dest``, ``entries`` for ``cache``, ``acmp.*`` event kinds).
"""

from __future__ import annotations

import collections
import datetime
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ibacm.wire.admin import EventMessage
from ibacm.wire.counters import Counter
from ibacm.wire.errors import FieldRangeError
from ibacm.wire.rates import mtu_to_bytes, rate_to_gbps, speed_lane_gbps, width_lanes

HISTORY = 120
"""Samples kept for the sparklines (one per ``stats`` event, i.e. per second)."""
LOG_LINES = 2000

LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error")
"""Log-pane filter levels, lowest first."""
_LEVEL_RANK = {"debug": 0, "info": 1, "warning": 2, "warn": 2, "error": 3, "critical": 4}

CacheKey = tuple[str, str]
GroupKey = tuple[str, str]


def _text(value: Any, default: str = "-") -> str:
    if value is None or value == "":
        return default
    return str(value)


def _list(value: Any) -> list[Any]:
    """A JSON array as a list; anything else (a daemon bug) as an empty one."""
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return None
    return None


def _counters(value: Any) -> list[int]:
    """The counters from a list (wire order) or a mapping by ``Counter.key``; missing ones
    are 0."""
    out = [0] * len(Counter)
    if isinstance(value, Mapping):
        for counter in Counter:
            out[counter] = _int(value.get(counter.key)) or 0
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value[: len(out)]):
            out[index] = _int(item) or 0
    return out


_ADDRESS_TYPES = {0: "invalid", 1: "name", 2: "ip", 3: "ip6", 4: "gid", 5: "lid"}
"""ACM address type numbers (client-protocol), for providers that report them raw."""


def address_type(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return _ADDRESS_TYPES.get(value, str(value))
    return _text(value)


def format_mtu(value: Any) -> str:
    """IBA MTU enum as bytes (``4`` -> ``2048``); other values as given."""
    number = _int(value)
    try:
        return str(mtu_to_bytes(number)) if number is not None else _text(value)
    except FieldRangeError:
        return _text(value)


def _gbps(value: float) -> str:
    return f"{value:g} Gb/s"


def format_rate_enum(value: Any) -> str:
    """IBA rate enum in Gb/s (``3`` -> ``10 Gb/s``); other values as given."""
    number = _int(value)
    try:
        return _gbps(rate_to_gbps(number)) if number is not None else _text(value)
    except FieldRangeError:
        return _text(value)


def format_link(width: Any, speed: Any) -> str:
    """Port link rate from its width and speed codes, e.g. ``100 Gb/s``."""
    lanes, lane = _int(width), _int(speed)
    if lanes is None or lane is None:
        return "-"
    try:
        return _gbps(width_lanes(lanes) * speed_lane_gbps(lane))
    except FieldRangeError:
        return "-"


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def format_rate(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def format_pkey(value: Any) -> str:
    number = _int(value)
    return f"0x{number:04x}" if number is not None else _text(value)


def hit_rate(hits: int, total: int) -> float | None:
    return hits / total if total > 0 else None


@dataclass(slots=True)
class CacheRow:
    endpoint: str
    dest: str
    type: str
    state: str
    hits: int | None
    dlid: int | None
    resolved_at: float | None
    """Dashboard clock time the entry was resolved (from the reported age), if known."""

    def cells(self, now: float) -> tuple[str, ...]:
        age = None if self.resolved_at is None else now - self.resolved_at
        return (
            self.endpoint,
            self.dest,
            self.type,
            self.state,
            format_age(age),
            _text(self.hits),
            _text(self.dlid),
        )


@dataclass(slots=True)
class GroupRow:
    endpoint: str
    mgid: str
    mlid: int | None
    rate: str
    mtu: str
    state: str

    def cells(self) -> tuple[str, ...]:
        mlid = f"0x{self.mlid:04x}" if self.mlid is not None else "-"
        return (self.endpoint, self.mgid, mlid, self.rate, self.mtu, self.state)


@dataclass(slots=True)
class EndpointRow:
    id: str
    pkey: str
    state: str
    provider: str
    """The provider's name; where it came from is in the admin snapshot."""
    addresses: str
    cache_size: int
    groups: int
    counters: list[int]

    def cells(self) -> tuple[str, ...]:
        return (
            self.id,
            self.pkey,
            self.state,
            self.provider,
            self.addresses,
            str(self.groups),
            str(self.cache_size),
            str(self.counters[Counter.RESOLVE]),
            format_rate(
                hit_rate(self.counters[Counter.ROUTE_CACHE], self.counters[Counter.RESOLVE])
            ),
        )


@dataclass(frozen=True, slots=True)
class LogRecord:
    level: str
    text: str
    """One line: ``time level logger: message key=value ...``."""

    @property
    def rank(self) -> int:
        return _LEVEL_RANK.get(self.level, 1)


def _clock_of(stamp: str) -> str:
    """The time of day of an ISO 8601 stamp as the daemon wrote it, without its UTC offset
    (one daemon's lines share it; the line is short)."""
    try:
        return datetime.datetime.fromisoformat(stamp).strftime("%H:%M:%S.%f")[:-3]
    except ValueError:
        return stamp.split("T", 1)[-1]


def log_record(data: Mapping[str, Any]) -> LogRecord:
    """A log event's data as one display line."""
    level = str(data.get("level", "info")).lower()
    message = _text(data.get("event"), "")
    stamp = _text(data.get("timestamp"), "")
    clock = _clock_of(stamp)
    logger = _text(data.get("logger"), "")
    skip = {"event", "level", "timestamp", "logger"}
    extras = " ".join(f"{k}={v}" for k, v in data.items() if k not in skip)
    parts = [clock, f"{level.upper():7}", f"{logger}:" if logger else "", message, extras]
    return LogRecord(level, " ".join(part for part in parts if part))


@dataclass
class Dirty:
    endpoints: bool = True
    groups: bool = True
    cache: bool = True
    counters: bool = True
    logs: bool = True


@dataclass
class DashboardModel:
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    """Only for telling the operator when the data was last updated."""
    daemon: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    ports: dict[str, dict[str, Any]] = field(default_factory=dict)
    endpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[GroupKey, GroupRow] = field(default_factory=dict)
    cache: dict[CacheKey, CacheRow] = field(default_factory=dict)
    counters: list[int] = field(default_factory=lambda: [0] * len(Counter))
    endpoint_counters: dict[str, list[int]] = field(default_factory=dict)
    resolves_per_second: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=HISTORY)
    )
    hit_rates: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=HISTORY)
    )
    logs: collections.deque[LogRecord] = field(
        default_factory=lambda: collections.deque(maxlen=LOG_LINES)
    )
    new_logs: list[LogRecord] = field(default_factory=list)
    dropped_events: int = 0
    needs_snapshot: bool = False
    """Events were lost: the app should ask for a fresh snapshot."""
    dirty: Dirty = field(default_factory=Dirty)
    updated_at: float | None = None
    """``clock`` time of the last snapshot or event from the daemon (None: nothing yet)."""
    updated_wall: float | None = None
    """The same moment on the wall clock, as shown to the operator."""
    _last_stats: tuple[float, list[int]] | None = None
    _instance: tuple[Any, Any] | None = None
    """(pid, start time) of the daemon the rates were measured on."""

    # -- snapshot ----------------------------------------------------------------------------
    def apply_snapshot(self, snapshot: Mapping[str, Any]) -> None:
        """Replace everything with a snapshot (after connect, reconnect or lost events)."""
        now = self._touch()
        daemon, options = snapshot.get("daemon"), snapshot.get("options")
        self.daemon = dict(daemon) if isinstance(daemon, Mapping) else {}
        self.options = dict(options) if isinstance(options, Mapping) else {}
        self.counters = _counters(snapshot.get("counters"))
        self.ports = {
            str(p.get("id")): dict(p) for p in _list(snapshot.get("ports")) if isinstance(p, dict)
        }
        self.endpoints, self.groups, self.cache, self.endpoint_counters = {}, {}, {}, {}
        for raw in _list(snapshot.get("endpoints")):
            if isinstance(raw, Mapping) and raw.get("id") is not None:
                self._load_endpoint(raw, now)
        self.needs_snapshot = False
        # Rates are differences between samples of one daemon: another daemon (restarted, or
        # replaced behind the same socket) starts them over, even before its counters catch
        # up with the old ones (which "counters went down" in _stats could not tell).
        instance = (self.daemon.get("pid"), self.daemon.get("started"))
        if instance != self._instance:
            self._instance = instance
            self.restart_rates()
        self.dirty = Dirty()

    def restart_rates(self) -> None:
        """Forget the rate history and its baseline."""
        self._last_stats = None
        self.resolves_per_second.clear()
        self.hit_rates.clear()

    def _touch(self) -> float:
        now = self.clock()
        self.updated_at, self.updated_wall = now, self.wall_clock()
        return now

    def _load_endpoint(self, raw: Mapping[str, Any], now: float) -> None:
        ep = str(raw["id"])
        self.endpoints[ep] = {k: v for k, v in raw.items() if k not in ("cache", "entries")}
        self.endpoint_counters[ep] = _counters(raw.get("counters"))
        for group in _list(raw.get("groups")):
            if isinstance(group, Mapping):
                self._put_group(ep, group)
        entries = raw.get("cache")
        if entries is None:
            entries = raw.get("entries")
        for entry in _list(entries):
            if isinstance(entry, Mapping):
                self._put_cache(ep, entry, now)

    def _put_group(self, ep: str, raw: Mapping[str, Any]) -> None:
        mgid = _text(raw.get("mgid"))
        self.groups[(ep, mgid)] = GroupRow(
            ep,
            mgid,
            _int(raw.get("mlid")),
            format_rate_enum(raw.get("rate")),
            format_mtu(raw.get("mtu")),
            _text(raw.get("state")),
        )

    def _put_cache(self, ep: str, raw: Mapping[str, Any], now: float) -> None:
        dest = _text(raw.get("dest", raw.get("address")))
        key = (ep, dest)
        if raw.get("removed"):
            self.cache.pop(key, None)
            return
        age = raw.get("age")
        previous = self.cache.get(key)
        if isinstance(age, int | float) and not isinstance(age, bool):
            resolved_at: float | None = now - float(age)
        else:
            resolved_at = previous.resolved_at if previous is not None else None
        self.cache[key] = CacheRow(
            ep,
            dest,
            address_type(raw.get("type")),
            _text(raw.get("state")),
            _int(raw.get("hits")),
            _int(raw.get("dlid")),
            resolved_at,
        )

    # -- events ------------------------------------------------------------------------------
    def apply_event(self, event: EventMessage) -> None:
        """Fold in one event from the daemon."""
        self._touch()
        kind = event.event.removeprefix("acmp.")
        data = event.data
        if kind == "log":
            self._add_log(log_record(data))
        elif kind == "cache":
            self._put_cache(str(data.get("endpoint", "?")), data, self.clock())
            self.dirty.cache = self.dirty.endpoints = True
        elif kind == "group":
            self._put_group(str(data.get("endpoint", "?")), data)
            self.dirty.groups = self.dirty.endpoints = True
        elif kind == "endpoint":
            self._endpoint_event(data)
        elif kind == "port":
            if data.get("id") is not None:
                self.ports[str(data["id"])] = dict(data)
        elif kind == "stats":
            self._stats(data, event.ts)
        elif kind == "dropped":
            count = _int(data.get("count")) or 0
            self.dropped_events += count
            self.needs_snapshot = True
            self._add_log(LogRecord("warning", f"dashboard: {count} events dropped; resyncing"))

    def _endpoint_event(self, data: Mapping[str, Any]) -> None:
        ep_id = data.get("id", data.get("endpoint"))
        if ep_id is None:
            return
        ep = str(ep_id)
        if data.get("state") == "removed":
            self.endpoints.pop(ep, None)
            self.endpoint_counters.pop(ep, None)
            self.groups = {k: v for k, v in self.groups.items() if k[0] != ep}
            self.cache = {k: v for k, v in self.cache.items() if k[0] != ep}
            self.dirty.groups = self.dirty.cache = True
        else:
            merged = self.endpoints.setdefault(ep, {"id": ep})
            merged.update({k: v for k, v in data.items() if k not in ("endpoint",)})
            merged["id"] = ep
        self.dirty.endpoints = True

    def _stats(self, data: Mapping[str, Any], ts: float) -> None:
        counters = _counters(data.get("counters"))
        per_endpoint = data.get("endpoints")
        if isinstance(per_endpoint, Mapping):
            for ep, values in per_endpoint.items():
                if str(ep) in self.endpoints:
                    self.endpoint_counters[str(ep)] = _counters(values)
        previous, self._last_stats = self._last_stats, (ts, counters)
        self.counters = counters
        self.dirty.counters = self.dirty.endpoints = True
        if previous is None:
            return
        dt = ts - previous[0]
        resolves = counters[Counter.RESOLVE] - previous[1][Counter.RESOLVE]
        hits = counters[Counter.ROUTE_CACHE] - previous[1][Counter.ROUTE_CACHE]
        if dt <= 0 or resolves < 0 or hits < 0:
            return  # clock jump or a restarted daemon: start over from this sample
        self.resolves_per_second.append(resolves / dt)
        if resolves > 0:
            self.hit_rates.append(min(1.0, hits / resolves))
        elif self.hit_rates:
            self.hit_rates.append(self.hit_rates[-1])
        else:
            self.hit_rates.append(0.0)

    def add_local_log(self, level: str, text: str) -> None:
        """A line of the dashboard's own (not from the daemon: the data is no fresher)."""
        self._add_log(log_record({"event": text, "level": level, "logger": "ibacm-tui"}))

    def _add_log(self, record: LogRecord) -> None:
        self.logs.append(record)
        self.new_logs.append(record)
        if len(self.new_logs) > LOG_LINES:
            del self.new_logs[: len(self.new_logs) - LOG_LINES]
        self.dirty.logs = True

    # -- views -------------------------------------------------------------------------------
    def endpoint_rows(self) -> dict[str, tuple[str, ...]]:
        cache_sizes = collections.Counter(ep for ep, _ in self.cache)
        group_counts = collections.Counter(ep for ep, _ in self.groups)
        rows: dict[str, tuple[str, ...]] = {}
        for ep, info in self.endpoints.items():
            addresses = ", ".join(
                _text(a.get("address")) if isinstance(a, Mapping) else str(a)
                for a in _list(info.get("addresses"))
            )
            rows[ep] = EndpointRow(
                ep,
                format_pkey(info.get("pkey")),
                _text(info.get("state")),
                _text(info.get("provider")),
                addresses or "-",
                cache_sizes[ep],
                group_counts[ep],
                self.endpoint_counters.get(ep, [0] * len(Counter)),
            ).cells()
        return rows

    def port_rows(self) -> dict[str, tuple[str, ...]]:
        rows: dict[str, tuple[str, ...]] = {}
        for key, port in self.ports.items():
            rows[key] = (
                key,
                _text(port.get("state")),
                _text(port.get("lid")),
                _text(port.get("sm_lid")),
                _text(port.get("gid")),
                format_mtu(port.get("mtu")),
                format_link(port.get("width"), port.get("speed")),
            )
        return rows

    def group_rows(self) -> dict[str, tuple[str, ...]]:
        return {f"{ep}|{mgid}": row.cells() for (ep, mgid), row in self.groups.items()}

    def cache_rows(
        self, text_filter: str = "", *, now: float | None = None
    ) -> dict[str, tuple[str, ...]]:
        """Rows matching the filter, with ages as of ``now`` (default: the clock)."""
        now = self.clock() if now is None else now
        needle = text_filter.strip().lower()
        rows: dict[str, tuple[str, ...]] = {}
        for (ep, dest), row in self.cache.items():
            cells = row.cells(now)
            if needle and not any(needle in cell.lower() for cell in cells):
                continue
            rows[f"{ep}|{dest}"] = cells
        return rows

    def counter_rows(self) -> dict[str, tuple[str, ...]]:
        """One row per scope (global, then each endpoint): its counters and the hit rate."""
        scopes = {"global": self.counters, **self.endpoint_counters}
        return {
            scope: (
                scope,
                *(str(v) for v in values),
                format_rate(hit_rate(values[Counter.ROUTE_CACHE], values[Counter.RESOLVE])),
            )
            for scope, values in scopes.items()
        }

    def summary(self) -> dict[str, str]:
        """Headline numbers of the Counters view."""
        resolves = self.counters[Counter.RESOLVE]
        recent = self.resolves_per_second[-1] if self.resolves_per_second else None
        return {
            "resolves": str(resolves),
            "resolves_per_second": "-" if recent is None else f"{recent:.1f}/s",
            "route_hit_rate": format_rate(hit_rate(self.counters[Counter.ROUTE_CACHE], resolves)),
            "addr_hit_rate": format_rate(hit_rate(self.counters[Counter.ADDR_CACHE], resolves)),
            "recent_hit_rate": format_rate(self.hit_rates[-1] if self.hit_rates else None),
            "cache_entries": str(len(self.cache)),
            "groups": str(len(self.groups)),
            "dropped": str(self.dropped_events),
        }

    def stale_note(self) -> str:
        """What to say over data that is not live: since when it has not moved."""
        if self.updated_at is None or self.updated_wall is None:
            return "not connected: no data from the daemon yet"
        stamp = datetime.datetime.fromtimestamp(self.updated_wall).strftime("%H:%M:%S")
        ago = format_age(self.clock() - self.updated_at)
        return f"STALE: disconnected; last update at {stamp} ({ago} ago), values as they were then"

    def filtered_logs(
        self, min_level: str, records: Iterable[LogRecord] | None = None
    ) -> list[LogRecord]:
        floor = _LEVEL_RANK.get(min_level, 0)
        source = self.logs if records is None else records
        return [record for record in source if record.rank >= floor]

    def take_new_logs(self) -> list[LogRecord]:
        records, self.new_logs = self.new_logs, []
        return records

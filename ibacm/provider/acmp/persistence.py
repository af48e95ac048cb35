"""Saving the destination caches to ``cache_file`` and restoring them at the next start.

Extension (C keeps no state across restarts). The file is JSON: per endpoint (port GID and
partition) the READY entries learned from the fabric, each with its key, path record (hex),
MGID, remote QPN and lifetimes as wall-clock expiry times (the trio clock does not survive a
restart). At restore an entry comes back READY if its route is still valid, ADDR_RESOLVED if
only its address is, and not at all if its address expired or its path does not start at our
port any more. Files are replaced atomically (write to a temporary file, then rename); the
temporaries a save interrupted by a crash or a full disk left behind (``.<name>.*.tmp`` beside
the file) are removed when the file is loaded at start. A relative path is taken from the state
directory (``ibacm.config.paths.state_dir``), not from wherever the daemon was started.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ibacm.log import get_logger
from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.entry import DestEntry, EntryState
from ibacm.provider.acmp.keys import (
    ADDRESS_LEN,
    CacheKey,
    CacheKeyError,
    cache_key,
    key_address,
    key_type,
)
from ibacm.provider.acmp.routes import address_query, av_from_path
from ibacm.wire.errors import WireError
from ibacm.wire.path_record import PathRecord

if TYPE_CHECKING:
    from ibacm.fabric.api import AddressVector
    from ibacm.provider.acmp.endpoint import AcmpPort

log = get_logger("ibacm.provider.acmp")

FORMAT = "ibacm-acmp-cache"
VERSION = 1

Records = dict[str, list[dict[str, Any]]]
"""Saved entries by endpoint id."""


class CacheFileError(Exception):
    """The cache file exists but cannot be used."""


def endpoint_id(gid: bytes, pkey: int) -> str:
    return f"{gid.hex()}/{pkey & 0x7FFF:04x}"


def _wall(expiry: float, now: float, wall_now: float) -> float | None:
    return None if expiry == math.inf else wall_now + (expiry - now)


def _local(wall_expiry: float | None, now: float, wall_now: float) -> float:
    return math.inf if wall_expiry is None else now + (wall_expiry - wall_now)


def snapshot(entries: Iterable[DestEntry], now: float, wall_now: float) -> list[dict[str, Any]]:
    """The savable entries: READY, learned (not loopback/preloaded), with a path."""
    saved = []
    for entry in entries:
        if entry.loopback or entry.preloaded or entry.state is not EntryState.READY:
            continue
        if entry.path is None:
            continue
        addr_type, address = key_type(entry.key), key_address(entry.key)
        saved.append(
            {
                "type": addr_type,
                "address": address.rstrip(b"\0").hex(),
                "path": entry.path.encode().hex(),
                "mgid": entry.mgid.hex(),
                "remote_qpn": entry.remote_qpn,
                "peer_lid": entry.peer_lid,
                "addr_expiry": _wall(entry.addr_expiry, now, wall_now),
                "route_expiry": _wall(entry.route_expiry, now, wall_now),
            }
        )
    return saved


def restore(
    cache: DestCache,
    port: AcmpPort,
    records: Iterable[Mapping[str, Any]],
    now: float,
    wall_now: float,
) -> int:
    """Put saved entries back into ``cache``; returns how many came back."""
    restored = 0
    for record in records:
        try:
            entry = _entry_from(record, port, now, wall_now)
        except (KeyError, TypeError, ValueError) as exc:
            log.info("cache file: entry skipped", reason=str(exc))
            continue
        if entry is None:
            continue
        existing = cache.get(entry.key)
        if existing is not None and (existing.loopback or existing.state is not EntryState.INIT):
            continue  # something fresher is known already
        target = cache.acquire(entry.key)
        target.av = entry.av
        target.mgid = entry.mgid
        target.remote_qpn = entry.remote_qpn
        target.peer_lid = entry.peer_lid
        target.query = entry.query
        lifetimes = (entry.addr_expiry - now, entry.route_expiry - now)
        if entry.route_expiry > now:
            cache.make_ready(target, now, *lifetimes, entry.path)
        else:
            target.ready_at = now
            cache.address_resolved(target)  # the next use asks the SA for the route
            cache.set_timeouts(target, now, *lifetimes)
        restored += 1
    return restored


@dataclass(frozen=True, slots=True)
class _Saved:
    """A saved entry as read back, before the cache takes it (``restore``)."""

    key: CacheKey
    path: PathRecord
    av: AddressVector
    mgid: bytes
    remote_qpn: int
    peer_lid: int
    query: PathRecord
    addr_expiry: float
    route_expiry: float


def _entry_from(
    record: Mapping[str, Any], port: AcmpPort, now: float, wall_now: float
) -> _Saved | None:
    address = bytes.fromhex(record["address"])
    if len(address) > ADDRESS_LEN:
        raise ValueError("address longer than 64 bytes")
    try:
        key = cache_key(int(record["type"]), address)
        path = PathRecord.decode(bytes.fromhex(record["path"]))
    except (CacheKeyError, WireError) as exc:
        raise ValueError(str(exc)) from exc
    mgid = bytes.fromhex(record.get("mgid", "")) or bytes(16)
    if len(mgid) != 16:
        raise ValueError("MGID is not 16 bytes")
    addr_expiry = _local(record.get("addr_expiry"), now, wall_now)
    route_expiry = _local(record.get("route_expiry"), now, wall_now)
    if addr_expiry <= now:
        return None
    if path.sgid != port.gid or not port.owns_lid(path.slid):
        return None  # the path starts somewhere else now: our port changed
    return _Saved(
        key=key,
        path=path,
        av=av_from_path(path, port.sgid_index(path.sgid), port.lid_mask),
        mgid=mgid,
        remote_qpn=int(record.get("remote_qpn", 0)) & 0xFFFFFF,
        peer_lid=int(record.get("peer_lid", path.dlid)) & 0xFFFF,
        query=address_query(path.sgid, path.dgid, path.tclass, path.pkey),
        addr_expiry=addr_expiry,
        route_expiry=route_expiry,
    )


class CacheStore:
    """The cache file: load once, save whole."""

    def __init__(self, path: str, wall_clock: Callable[[], float], state_dir: Path) -> None:
        self.path = state_dir / path  # an absolute ``path`` stays as it is
        self.wall_clock = wall_clock

    async def load(self) -> Records:
        """The saved records; first removes what interrupted saves left behind (nothing else
        writes them: the daemon's lock file keeps a second daemon from starting)."""
        removed = await trio.to_thread.run_sync(_remove_temporaries, self.path)
        if removed:
            log.info("cache file: temporaries of interrupted saves removed", files=removed)
        try:
            text = await trio.to_thread.run_sync(self.path.read_text, "utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CacheFileError(f"{self.path}: {exc.strerror or exc}") from exc
        return parse(text, str(self.path))

    async def save(self, records: Records) -> None:
        text = json.dumps({"format": FORMAT, "version": VERSION, "endpoints": records})
        try:
            await trio.to_thread.run_sync(_write_atomically, self.path, text)
        except OSError as exc:
            raise CacheFileError(f"{self.path}: {exc.strerror or exc}") from exc


def parse(text: str, where: str) -> Records:
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise CacheFileError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CacheFileError(f"{where}: not an ibacm cache file")
    if document.get("version") != VERSION:
        raise CacheFileError(f"{where}: cache file version {document.get('version')!r}")
    endpoints = document.get("endpoints")
    if not isinstance(endpoints, dict):
        raise CacheFileError(f"{where}: 'endpoints' is not an object")
    return {
        str(name): [item for item in items if isinstance(item, dict)]
        for name, items in endpoints.items()
        if isinstance(items, list)
    }


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}."


TEMPORARY_SUFFIX = ".tmp"


def _remove_temporaries(path: Path) -> list[str]:
    removed: list[str] = []
    try:
        candidates = list(path.parent.glob(f"{_temporary_prefix(path)}*{TEMPORARY_SUFFIX}"))
    except OSError:
        return removed
    for candidate in candidates:
        try:
            if candidate.is_file() and not candidate.is_symlink():
                candidate.unlink()
                removed.append(candidate.name)
        except OSError as exc:
            log.warning("cache file: temporary not removed", file=str(candidate), error=str(exc))
    return removed


def _write_atomically(path: Path, text: str) -> None:
    # A temporary file of our own (several savers may write at once), then one rename.
    handle, name = tempfile.mkstemp(
        prefix=_temporary_prefix(path), suffix=TEMPORARY_SUFFIX, dir=path.parent
    )
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise

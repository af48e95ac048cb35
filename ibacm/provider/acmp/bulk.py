"""route_bulk_preload: an endpoint's table of every path from its port's GID in its partition.

One PathRecord GetTable fills it (``keep_loaded``, a task of the endpoint), taken again when
the routes it gave expire (the route lifetime) or the SM changed (``clear``); retried with the
join backoff while the SA does not answer (per-pair queries work meanwhile). The resolver
takes a route from it (``route``) before it would ask the SA for one peer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ibacm.log import get_logger
from ibacm.provider.acmp.routes import BULK_COMP_MASK, SaPaths
from ibacm.wire.client import AcmStatus
from ibacm.wire.path_record import PathRecord

if TYPE_CHECKING:
    from ibacm.config.options import Options

log = get_logger("ibacm.provider.acmp")


class BulkRoutes:
    """The bulk route table of one endpoint (see the module docstring)."""

    def __init__(self, name: str, pkey: int, options: Options) -> None:
        self.name = name
        """The endpoint's, for the log."""
        self.pkey = pkey
        self.by_gid: dict[bytes, PathRecord] = {}
        self.by_lid: dict[int, PathRecord] = {}
        self.loaded_at = -math.inf
        self._refresh = trio.Event()
        self.reload(options)

    def reload(self, options: Options) -> None:
        """A reload: the join backoff and the route lifetime from now on."""
        self.options = options
        self.route_lifetime = options.route_lifetime

    async def keep_loaded(self, sa: SaPaths, own_gid: Callable[[], bytes]) -> None:
        """Load the table, and again when it expires or is cleared (until cancelled);
        ``own_gid``: our port's GID now (a port's GID may change while it is up)."""
        delay = self.options.join_retry_initial_ms / 1000.0
        while True:
            self._refresh = trio.Event()
            gid = own_gid()
            outcome, records = await sa.get_table(
                PathRecord(sgid=gid, pkey=self.pkey), BULK_COMP_MASK
            )
            if outcome.status != AcmStatus.SUCCESS:
                log.info(
                    "bulk route preload failed",
                    status=outcome.status,
                    reason=outcome.reason,
                    retry_in=delay,
                )
                await trio.sleep(delay)
                delay = min(delay * 2, self.options.join_retry_max_ms / 1000.0)
                continue
            delay = self.options.join_retry_initial_ms / 1000.0
            self.load(records, own_gid())
            with trio.move_on_after(self.route_lifetime):
                await self._refresh.wait()

    def load(self, records: list[PathRecord], own_gid: bytes) -> None:
        """The table from a GetTable's ``records`` (paths from ``own_gid`` only)."""
        by_gid: dict[bytes, PathRecord] = {}
        by_lid: dict[int, PathRecord] = {}
        for record in records:
            if record.sgid != own_gid or not record.dlid:
                continue  # not a path from us: useless as a route of ours
            by_gid.setdefault(record.dgid, record)
            by_lid.setdefault(record.dlid, record)
        self.by_gid, self.by_lid = by_gid, by_lid
        self.loaded_at = trio.current_time()
        log.info("bulk route preload", endpoint=self.name, paths=len(by_gid))

    def route(self, dgid: bytes, dlid: int, now: float) -> PathRecord | None:
        """A route from the table, while it is younger than the route lifetime."""
        if not self.by_gid:
            return None
        if now - self.loaded_at >= self.route_lifetime:
            return None
        if any(dgid):
            return self.by_gid.get(dgid)
        return self.by_lid.get(dlid) if dlid else None

    def clear(self) -> None:
        """Forget every route (SM change) and load the table again."""
        self.by_gid, self.by_lid = {}, {}
        self._refresh.set()

    def forget_gid(self, gid: bytes) -> None:
        """The SM says ``gid`` is out of service: its route goes."""
        path = self.by_gid.pop(gid, None)
        if path is not None:
            self.by_lid.pop(path.dlid, None)

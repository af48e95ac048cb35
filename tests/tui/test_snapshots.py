"""Screenshots of the dashboard attached to a real daemon of a simulated cluster.

The cluster is fresh for this module and node1 has resolved node2 exactly once, so every
number on screen is fixed. Ages are the only moving values shown; they are masked (set to
"just resolved") before each screenshot. Update with ``pytest --snapshot-update``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from textual.pilot import Pilot

from tests.tui.cluster import SimCluster
from tui.app import Dashboard, Target
from tui.tables import KeyedTable

SIZE = (120, 35)
SnapCompare = Callable[..., bool]


def _app(cluster: SimCluster) -> Dashboard:
    return Dashboard(Target(str(cluster.admin_socket("node1")), "node1"), clock=lambda: 1000.0)


def _prepared(*keys: str, then: Callable[[Pilot[Any]], Awaitable[None]] | None = None) -> Any:
    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, Dashboard)
        deadline = asyncio.get_running_loop().time() + 20
        while not (app.connected and "node2" in {dest for _, dest in app.model.cache}):
            assert asyncio.get_running_loop().time() < deadline, "dashboard did not load"
            await pilot.pause(0.05)
        for row in app.model.cache.values():
            row.resolved_at = app.model.clock()  # mask ages: "0s"
        app.model.dirty.cache = True
        app.refresh_views()
        await pilot.press(*keys)
        if then is not None:
            await then(pilot)
        await pilot.pause(0.3)

    return run_before


def test_endpoints_view(cluster: SimCluster, snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(cluster), terminal_size=SIZE, run_before=_prepared())


def test_groups_view(cluster: SimCluster, snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(cluster), terminal_size=SIZE, run_before=_prepared("2"))


def test_cache_view(cluster: SimCluster, snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(cluster), terminal_size=SIZE, run_before=_prepared("3"))


async def _select_node2(pilot: Pilot[Any]) -> None:
    cache = pilot.app.query_one("#cache-table", KeyedTable)
    cache.sort_by("dest")
    cache.focus()
    cache.move_cursor(row=cache.get_row_index("mlx5_0/1/0xffff|node2"))
    await pilot.press("f")


def test_flush_confirmation(cluster: SimCluster, snap_compare: SnapCompare) -> None:
    run_before = _prepared("3", then=_select_node2)
    assert snap_compare(_app(cluster), terminal_size=SIZE, run_before=run_before)


def test_help_screen(cluster: SimCluster, snap_compare: SnapCompare) -> None:
    assert snap_compare(_app(cluster), terminal_size=SIZE, run_before=_prepared("question_mark"))

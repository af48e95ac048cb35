"""Pilot tests of the dashboard: real daemons on the simulated fabric, and the lab server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, RichLog, Sparkline, Static

from ibacm.wire.admin import EventMessage
from ibacm.wire.counters import Counter
from tests.tui.cluster import SimCluster
from tests.tui.lab import EP1, LabServer
from tests.tui.workload import BackgroundWorkload, resolve_when_ready
from tui.app import TAB_IDS, Dashboard, Target
from tui.screens import ConfirmScreen, FlushScreen, HelpScreen
from tui.tables import KeyedTable

SIZE = (120, 35)
MGID = "ff15:4001:ffff:3:400::"


def dashboard(path: Path, label: str = "node1", snapshot_interval: float = 0.0) -> Dashboard:
    # No periodic snapshots unless a test asks: each test sees only the path it exercises.
    app = Dashboard(
        Target(str(path), label), backoff=(0.1, 0.4), snapshot_interval=snapshot_interval
    )
    # Keys are checked, not how a tab's underline slides: each press would wait it out.
    app.animation_level = "none"
    return app


async def until(pilot: Pilot[None], predicate: Callable[[], bool], what: str, timeout=15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def table(app: Dashboard, table_id: str) -> KeyedTable:
    return app.query_one(f"#{table_id}", KeyedTable)


def status(app: Dashboard) -> str:
    return str(app.query_one("#status", Static).render())


def log_text(app: Dashboard) -> str:
    return "\n".join(strip.text for strip in app.query_one("#log-pane", RichLog).lines)


class WallClock:
    """A wall clock the test moves: the dashboard shows it as "last update at"."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def banners(app: Dashboard) -> dict[str, str]:
    """The stale banner of each tab that shows one, by tab."""
    shown: dict[str, str] = {}
    for tab in TAB_IDS:
        banner = app.query_one(f"#{tab} .stale-banner", Static)
        if banner.display:
            shown[tab] = str(banner.render())
    return shown


async def connected(pilot: Pilot[None], app: Dashboard) -> None:
    await until(pilot, lambda: app.connected, "the dashboard to connect")
    await pilot.pause(app.refresh_interval * 2)


# -- against real daemons ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_shows_endpoints_ports_groups_and_cache_of_a_real_daemon(cluster: SimCluster) -> None:
    app = dashboard(cluster.admin_socket("node1"))
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        assert "● connected to node1 (ibacm" in status(app)
        endpoint = table(app, "endpoint-table").shown["mlx5_0/1/0xffff"]
        assert endpoint[1:3] == ("0xffff", "ready")
        assert endpoint[3] == "ibacmp"  # the provider, with where it came from in snapshots
        assert "10.0.0.1/16" in endpoint[4] and "node1" in endpoint[4]
        assert table(app, "ports").shown["mlx5_0/1"][:2] == ("mlx5_0/1", "ACTIVE")
        group = table(app, "group-table").shown[f"mlx5_0/1/0xffff|{MGID}"]
        assert group[1] == MGID and group[5] == "joined" and group[2].startswith("0xc0")
        cache = table(app, "cache-table").shown["mlx5_0/1/0xffff|node2"]
        assert cache[1:4] == ("node2", "name", "READY")
        assert cache[6] == "3"  # node2's LID


@pytest.mark.asyncio
async def test_numbers_move_cell_by_cell_under_a_workload(cluster: SimCluster) -> None:
    app = dashboard(cluster.admin_socket("node1"))
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        endpoints = table(app, "endpoint-table")
        before = int(endpoints.shown["mlx5_0/1/0xffff"][7])
        rows_before = list(endpoints.rows)
        with BackgroundWorkload(cluster.client_socket("node1"), "node1", ["node2"]) as work:
            work.wait_for(5)
            await until(
                pilot,
                lambda: int(endpoints.shown["mlx5_0/1/0xffff"][7]) >= before + 5,
                "the resolve count to move",
            )
            await pilot.press("4")
            rps = app.query_one("#rps", Sparkline)
            await until(pilot, lambda: len(rps.data or []) >= 3, "two rate samples plotted")
        # Same rows, changed in place: nothing was cleared and refilled.
        assert list(endpoints.rows) == rows_before
        assert endpoints.cell_updates > 0
        assert len(app.query_one("#hits", Sparkline).data or []) >= 3
        summary = str(app.query_one("#summary", Static).render())
        assert "Route cache hit rate" in summary and "%" in summary
        global_row = table(app, "counter-table").shown["global"]
        assert global_row[-1].endswith("%") and float(global_row[-1][:-1]) > 50


@pytest.mark.asyncio
async def test_flush_one_destination_asks_first(cluster: SimCluster) -> None:
    app = dashboard(cluster.admin_socket("node1"))
    key = "mlx5_0/1/0xffff|node2"
    try:
        async with app.run_test(size=SIZE) as pilot:
            await connected(pilot, app)
            await pilot.press("3")
            cache = table(app, "cache-table")
            cache.focus()
            cache.move_cursor(row=cache.get_row_index(key))
            await pilot.press("f")
            assert isinstance(app.screen, FlushScreen)
            assert [t.dest for t in app.screen.targets] == ["node2", None, None]
            await pilot.press("escape")  # cancel: nothing happens
            await pilot.pause(0.3)
            assert key in cache.shown
            await pilot.press("f")
            await pilot.click("#target-0")
            await until(pilot, lambda: key not in cache.shown, "node2 to leave the cache table")
            assert not isinstance(app.screen, FlushScreen)
    finally:
        # Leave the module's cluster as the fixture made it.
        assert resolve_when_ready(cluster.client_socket("node1"), "node1", "node2") == 0


@pytest.mark.asyncio
async def test_reload_asks_first_and_the_daemon_logs_it(cluster: SimCluster) -> None:
    app = dashboard(cluster.admin_socket("node1"))
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        await pilot.press("5")
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause(0.3)
        assert "configuration reloaded" not in log_text(app)
        await pilot.press("r", "y")
        await until(pilot, lambda: "configuration reloaded" in log_text(app), "the reload log")
        assert "INFO" in log_text(app)


@pytest.mark.asyncio
async def test_a_refused_reload_shows_each_problem(cluster: SimCluster) -> None:
    opts = cluster.node_dir("node1") / "ibacm_opts.cfg"
    good = opts.read_text()
    opts.write_text(good + "timeout banana\n")
    app = dashboard(cluster.admin_socket("node1"))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await connected(pilot, app)
            await pilot.press("5")
            await pilot.press("r", "y")
            await until(pilot, lambda: "reload refused" in log_text(app), "the refusal")
            assert "timeout value 'banana' is not a number" in log_text(app)
            await pilot.pause(0.5)  # the command's reply, after the daemon's log event
            assert log_text(app).count("reload refused") == 1, log_text(app)
    finally:
        opts.write_text(good)


@pytest.mark.asyncio
async def test_daemon_restart_shows_disconnected_then_reconnects(cluster: SimCluster) -> None:
    app = dashboard(cluster.admin_socket("node2"), "node2")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        command = cluster.stop_daemon("node2")
        await until(pilot, lambda: "disconnected" in status(app), "the disconnected status")
        assert status(app).startswith("○ disconnected: ")
        assert "reconnecting in" in status(app)
        # Every tab says its rows (endpoints still "ready", cache entries) are not live.
        stale = banners(app)
        assert set(stale) == set(TAB_IDS), stale
        assert all(
            text.startswith("STALE: disconnected; last update at ") for text in stale.values()
        )
        cluster.start_daemon("node2", command)
        await until(pilot, lambda: app.connections == 2 and app.connected, "a reconnection")
        await pilot.pause(app.refresh_interval * 2)
        assert "● connected to node2" in status(app)
        assert banners(app) == {}
        assert "mlx5_0/1/0xffff" in table(app, "endpoint-table").shown
        await pilot.press("5")
        await until(pilot, lambda: "reconnected to node2" in log_text(app), "the reconnect log")
        assert "disconnected from node2" in log_text(app)


@pytest.mark.asyncio
async def test_rates_start_over_with_a_restarted_daemon(cluster: SimCluster) -> None:
    app = dashboard(cluster.admin_socket("node2"), "node2")
    client = cluster.client_socket("node2")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        await pilot.press("4")
        rps = app.query_one("#rps", Sparkline)
        assert resolve_when_ready(client, "node2", "node1") == 0
        with BackgroundWorkload(client, "node2", ["node1"]):
            await until(
                pilot,
                lambda: any(value > 5 for value in rps.data or []),
                "the old daemon's resolve rate",
            )
        assert app.model.counters[Counter.RESOLVE] > 5
        command = cluster.stop_daemon("node2")
        await until(pilot, lambda: not app.connected, "the disconnection")
        cluster.start_daemon("node2", command)
        await until(pilot, lambda: app.connected and app.connections == 2, "the reconnection")
        # The new daemon resolves nothing: every rate shown from now on is its own, 0, and
        # none of the old daemon's is left next to its total.
        await until(pilot, lambda: len(rps.data or []) >= 3, "two samples of the new daemon")

        def summary() -> str:
            return str(app.query_one("#summary", Static).render())

        assert summary().startswith("Resolves 0  (0.0/s)"), summary()
        assert set(rps.data or []) == {0.0}
        assert str(app.query_one("#rps-label", Static).render()) == "Resolves/s  0.0"
        assert set(app.query_one("#hits", Sparkline).data or []) == {0.0}
        assert "(last second 0.0%)" in summary()


# -- against the lab server (fast, exact) ----------------------------------------------------


@pytest.mark.asyncio
async def test_log_pane_level_filter(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        await pilot.press("5")
        for level in ("debug", "info", "warning", "error"):
            lab.publish("log", {"event": f"a {level} line", "level": level, "logger": "lab"})
        await until(pilot, lambda: "a error line" in log_text(app), "log lines")
        text = log_text(app)
        assert "a debug line" not in text
        assert "a info line" in text and "lab: a info line" in text
        assert "showing info and above" in str(app.query_one("#log-bar", Static).render())
        await pilot.press("l")  # warning and above
        await pilot.pause(0.1)
        assert "a info line" not in log_text(app) and "a warning line" in log_text(app)
        await pilot.press("l", "l")  # error, then debug: everything
        await pilot.pause(0.1)
        assert all(f"a {level} line" in log_text(app) for level in ("debug", "info", "error"))


@pytest.mark.asyncio
async def test_filter_and_sort_the_cache(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        cache = table(app, "cache-table")
        assert len(cache.shown) == 3
        await pilot.press("slash")
        await pilot.press(*"node")
        await pilot.pause(0.1)
        assert list(cache.shown) == [f"{EP1}|node4"]
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert len(cache.shown) == 3
        await pilot.press("s")  # by endpoint
        await pilot.press("s")  # reversed
        order = [str(row.key.value) for row in cache.ordered_rows]
        assert order[0] == "mlx5_0/2/0xffff|10.0.1.3"
        await pilot.press("s")  # next column: destination, ascending
        order = [str(row.key.value) for row in cache.ordered_rows]
        assert [key.split("|")[1] for key in order] == ["10.0.0.3", "10.0.1.3", "node4"]


@pytest.mark.asyncio
async def test_cache_events_update_rows_in_place(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        cache = table(app, "cache-table")
        key = f"{EP1}|10.0.0.3"
        updates = cache.cell_updates
        lab.publish("cache", {"endpoint": EP1, "dest": "10.0.0.3", "state": "READY", "hits": 9})
        lab.publish("cache", {"endpoint": EP1, "dest": "10.0.0.9", "state": "QUERY_ADDR"})
        await until(pilot, lambda: cache.shown.get(key, ("",) * 6)[5] == "9", "hits to change")
        assert cache.cell_updates > updates
        await until(pilot, lambda: f"{EP1}|10.0.0.9" in cache.shown, "a new row")
        lab.publish("cache", {"endpoint": EP1, "dest": "10.0.0.9", "removed": True})
        await until(pilot, lambda: f"{EP1}|10.0.0.9" not in cache.shown, "the row to go")


@pytest.mark.asyncio
async def test_dropped_events_make_the_dashboard_resync(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        # The daemon changed without telling us (its events were lost)...
        lab.run_sync(
            lab.daemon.caches[EP1].__setitem__, "node7", {"dest": "node7", "state": "READY"}
        )
        app.model.apply_event(EventMessage("dropped", {"count": 12}, 0.0))
        cache = table(app, "cache-table")
        await until(pilot, lambda: f"{EP1}|node7" in cache.shown, "the resync")
        assert "12 events dropped" in "\n".join(r.text for r in app.model.logs)


@pytest.mark.asyncio
async def test_periodic_snapshots_catch_unpublished_changes(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab", snapshot_interval=0.3)
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        lab.run_sync(lab.daemon.caches[EP1].pop, "node4")  # no event for this one
        cache = table(app, "cache-table")
        await until(pilot, lambda: f"{EP1}|node4" not in cache.shown, "the periodic snapshot")
        assert f"{EP1}|10.0.0.3" in cache.shown


@pytest.mark.asyncio
async def test_daemon_log_level_and_failed_commands(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        await pilot.press("L")
        await until(pilot, lambda: lab.daemon.log_level == 1, "the daemon's log level")
        await until(pilot, lambda: "log_level 1" in status(app), "the status line")
        lab.daemon.fail_reload = True
        await pilot.press("r", "y")
        await until(
            pilot,
            lambda: any("reload failed" in r.text for r in app.model.logs),
            "the failure to be logged",
        )
        assert lab.daemon.reloads == 0


@pytest.mark.asyncio
async def test_help_screen(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.asyncio
async def test_without_a_daemon_it_says_so_and_refuses_commands(tmp_path: Path) -> None:
    app = dashboard(tmp_path / "nothing.sock", "nowhere")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "disconnected" in status(app), "the status")
        assert f"no admin socket at {tmp_path / 'nothing.sock'}" in status(app)
        await pilot.press("f")
        await pilot.press("r")
        assert not isinstance(app.screen, FlushScreen | ConfirmScreen)


@pytest.mark.asyncio
async def test_escape_outside_the_cache_tab_changes_nothing_and_keys_keep_working(
    lab: LabServer,
) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert app._active_tab() == "endpoints"
        assert not isinstance(app.focused, Input)
        await pilot.press("2")
        await pilot.pause(0.1)
        assert app._active_tab() == "groups"
        # After a dialog, tab digits still switch tabs.
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        await pilot.press("escape")
        await pilot.pause(0.1)
        await pilot.press("4")
        await pilot.pause(0.1)
        assert app._active_tab() == "counters" and not isinstance(app.focused, Input)
        # Escape in the cache filter clears it and leaves the field; q then quits.
        await pilot.press("slash", *"node", "escape")
        await pilot.pause(0.1)
        assert app._active_tab() == "cache" and not isinstance(app.focused, Input)
        assert app.query_one("#cache-filter", Input).value == ""
        await pilot.press("q")
        await pilot.pause(0.2)
    assert app.return_code is not None or not app.is_running


@pytest.mark.asyncio
async def test_every_tab_marks_its_data_stale_with_the_time_of_the_last_update(
    lab: LabServer,
) -> None:
    wall = WallClock(1_790_000_000.0)
    app = Dashboard(
        Target(str(lab.path), "lab"), wall_clock=wall, backoff=(0.1, 0.4), snapshot_interval=0
    )
    key = f"{EP1}|10.0.0.3"
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        assert banners(app) == {}
        await pilot.press("3")
        cache = table(app, "cache-table")
        # The last word from the daemon: an event, at a wall time the test knows.
        wall.now += 3600 + 61
        lab.publish("cache", {"endpoint": EP1, "dest": "10.0.0.3", "state": "READY", "hits": 7})
        await until(pilot, lambda: cache.shown.get(key, ("",) * 7)[5] == "7", "the event")
        last_update = time.strftime("%H:%M:%S", time.localtime(wall.now))
        wall.now += 600  # later than the last update: the banner must not show this time
        lab.stop()
        await until(pilot, lambda: len(banners(app)) == len(TAB_IDS), "a banner on every tab")
        for tab, text in banners(app).items():
            assert text.startswith("STALE: disconnected; last update at "), (tab, text)
            assert f" {last_update} " in text, (tab, text)
        assert app.query_one("#tabs").has_class("stale")  # the tables are dimmed
        # The cache rows are as they were: their ages no longer move.
        age = cache.shown[key][4]
        await pilot.pause(2.2)
        assert cache.shown[key][4] == age
        assert "(stale)" in str(app.query_one("#rps-label", Static).render())
        # Each tab, shown, says so too (the banner is part of the tab, not of one view).
        for digit in "12345":
            await pilot.press(digit)
            banner = app.query_one(f"#{TAB_IDS[int(digit) - 1]} .stale-banner", Static)
            assert banner.display and banner.region.height > 0
        lab.start()
        await until(pilot, lambda: app.connected, "the reconnection")
        await until(pilot, lambda: banners(app) == {}, "the banners to go")
        assert not app.query_one("#tabs").has_class("stale")
        await until(pilot, lambda: cache.shown[key][4] != age, "ages to move again")

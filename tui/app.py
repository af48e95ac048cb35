"""``ibacm-tui``: a Textual dashboard attached to one daemon's admin socket.

    ibacm-tui [--admin PATH | --dir SIMDIR --node NAME]

The connection runs in a worker: connect, hello, subscribe, snapshot, then events until the
daemon goes away; then "disconnected" and reconnection with exponential backoff. Events only
update the model; a timer applies the model to the widgets every ``refresh_interval``
seconds (coalescing), changing table cells in place.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import (
    Footer,
    Input,
    Label,
    RichLog,
    Sparkline,
    Static,
    TabbedContent,
    TabPane,
)

from ibacm import __version__
from ibacm.config.admin_target import admin_target
from ibacm.wire.admin import ErrorCode, EventMessage
from ibacm.wire.counters import Counter
from tui.client import AdminClient, AdminCommandError, AdminConnectionError
from tui.model import LEVELS, DashboardModel, LogRecord
from tui.screens import ConfirmScreen, FlushScreen, FlushTarget, HelpScreen
from tui.tables import KeyedTable

WidgetType = TypeVar("WidgetType", bound=Widget)

REFRESH_INTERVAL = 0.25
SNAPSHOT_INTERVAL = 5.0
"""Seconds between full snapshots, besides the live events (0 = only after lost events)."""
BACKOFF_MIN = 0.5
BACKOFF_MAX = 5.0
SUBSCRIBE_QUEUE = 5000
LOG_REPLAY = 200
"""Recent daemon log records to show right after connecting."""

ENDPOINT_COLUMNS = [
    ("id", "Endpoint"),
    ("pkey", "P_Key"),
    ("state", "State"),
    ("provider", "Provider"),
    ("addresses", "Addresses"),
    ("groups", "Groups"),
    ("cache", "Cache"),
    ("resolves", "Resolves"),
    ("hit_rate", "Hit rate"),
]
PORT_COLUMNS = [
    ("id", "Port"),
    ("state", "State"),
    ("lid", "LID"),
    ("sm_lid", "SM LID"),
    ("gid", "GID"),
    ("mtu", "MTU"),
    ("rate", "Rate"),
]
GROUP_COLUMNS = [
    ("endpoint", "Endpoint"),
    ("mgid", "MGID"),
    ("mlid", "MLID"),
    ("rate", "Rate"),
    ("mtu", "MTU"),
    ("state", "Join state"),
]
CACHE_COLUMNS = [
    ("endpoint", "Endpoint"),
    ("dest", "Destination"),
    ("type", "Type"),
    ("state", "State"),
    ("age", "Age"),
    ("hits", "Hits"),
    ("dlid", "DLID"),
]
COUNTER_COLUMNS = [
    ("scope", "Scope"),
    *((counter.key, counter.heading) for counter in Counter),
    ("hit_rate", "Hit rate"),
]
TAB_IDS = ("endpoints", "groups", "cache", "counters", "log")
TAB_BODIES = {
    "endpoints": "#endpoint-table",
    "groups": "#group-table",
    "cache": "#cache-table",
    "counters": "#counter-table",
    "log": "#log-pane",
}
"""The widget of each tab that takes the keyboard focus when the tab is shown."""
DAEMON_LEVELS = (0, 1, 2)


@dataclass(frozen=True, slots=True)
class Target:
    """Which daemon to watch: its admin socket and a name for the title."""

    admin_socket: str
    label: str


class Dashboard(App[None]):
    TITLE = "ibacm-tui"
    CSS = """
    #status { height: 1; padding: 0 1; background: $boost; }
    #status.connected { color: $success; }
    #status.disconnected { color: $error; text-style: bold; }
    #ports { height: auto; max-height: 8; }
    #ports-title, #plots-title { padding: 1 1 0 1; color: $text-muted; }
    #cache-filter { height: 3; }
    #summary { height: auto; padding: 0 1; }
    .plot-label { padding: 0 1; width: 26; }
    .plot-row { height: 3; }
    Sparkline { height: 3; width: 1fr; }
    #counter-table { height: auto; }
    #log-bar { height: 1; padding: 0 1; color: $text-muted; }
    .stale-banner { display: none; height: auto; padding: 0 1; background: $error 25%; }
    .stale-banner.shown { display: block; }
    #tabs.stale DataTable { text-opacity: 60%; }
    ModalScreen { align: center middle; }
    #dialog { width: 72; height: auto; padding: 1 2; border: thick $warning; background: $surface; }
    #dialog.help { width: 84; border: thick $primary; }
    #dialog Button.wide { width: 100%; margin-top: 1; }
    #dialog .buttons { height: auto; margin-top: 1; align-horizontal: right; }
    #dialog .buttons Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("1", "show_tab('endpoints')", "Endpoints", show=False),
        Binding("2", "show_tab('groups')", "Groups", show=False),
        Binding("3", "show_tab('cache')", "Cache", show=False),
        Binding("4", "show_tab('counters')", "Counters", show=False),
        Binding("5", "show_tab('log')", "Log", show=False),
        Binding("f", "flush", "Flush"),
        Binding("r", "reload", "Reload"),
        Binding("s", "sort", "Sort"),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("l", "cycle_log_filter", "Log filter"),
        Binding("L", "cycle_daemon_level", "Daemon level"),
    ]

    _main_screen: Screen[Any]
    """The dashboard's own screen (set at mount)."""

    def __init__(
        self,
        target: Target,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        refresh_interval: float = REFRESH_INTERVAL,
        backoff: tuple[float, float] = (BACKOFF_MIN, BACKOFF_MAX),
        snapshot_interval: float = SNAPSHOT_INTERVAL,
    ) -> None:
        super().__init__()
        self.target = target
        self.model = DashboardModel(clock=clock, wall_clock=wall_clock)
        self.refresh_interval = refresh_interval
        self.backoff = backoff
        self.client: AdminClient | None = None
        self.connected = False
        self.status_text = ""
        self.log_level_filter = "info"
        self.connections = 0
        """Successful connections so far (the first is not a reconnection)."""
        self._last_cache_sync = -1.0
        self._stale_note: str | None = None
        """The note the stale banners show ("" while live; None before the first refresh)."""
        self._resyncing = False
        self.snapshot_interval = snapshot_interval
        self._last_snapshot = clock()
        self.sub_title = target.label

    # -- layout ------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        with TabbedContent(initial="endpoints", id="tabs"):
            with TabPane("1 Endpoints", id="endpoints"):
                yield _stale_banner()
                yield KeyedTable(ENDPOINT_COLUMNS, id="endpoint-table")
                yield Label("Ports", id="ports-title")
                yield KeyedTable(PORT_COLUMNS, id="ports")
            with TabPane("2 Groups", id="groups"):
                yield _stale_banner()
                yield KeyedTable(GROUP_COLUMNS, id="group-table")
            with TabPane("3 Cache", id="cache"):
                yield _stale_banner()
                yield Input(
                    placeholder="filter (/): endpoint, address, state...",
                    id="cache-filter",
                    select_on_focus=False,  # "/" goes on with the filter, it does not replace it
                )
                yield KeyedTable(CACHE_COLUMNS, id="cache-table")
            with TabPane("4 Counters", id="counters"):
                yield _stale_banner()
                yield Static("", id="summary")
                yield Label("Over time (one sample per second)", id="plots-title")
                with Horizontal(classes="plot-row"):
                    yield Static("Resolves/s", id="rps-label", classes="plot-label")
                    yield Sparkline([], id="rps", summary_function=max)
                with Horizontal(classes="plot-row"):
                    yield Static("Cache hit rate", id="hit-label", classes="plot-label")
                    yield Sparkline([], id="hits", summary_function=max)
                yield KeyedTable(COUNTER_COLUMNS, id="counter-table")
            with TabPane("5 Log", id="log"), Vertical():
                yield _stale_banner()
                yield Static("", id="log-bar")
                yield RichLog(id="log-pane", max_lines=2000, wrap=False, markup=False)
        yield Footer()

    def _find(self, selector: str, expect_type: type[WidgetType]) -> WidgetType:
        """A widget of the dashboard itself, also while a modal screen is on top
        (``App.query_one`` would search the modal)."""
        return self._main_screen.query_one(selector, expect_type)

    def _modal_open(self) -> bool:
        return self.screen is not self._main_screen

    def on_mount(self) -> None:
        self._main_screen = self.screen
        self.title = f"ibacm-tui — {self.target.label}"
        self._set_status(False, f"connecting to {self.target.admin_socket}")
        self._update_log_bar()
        self.set_interval(self.refresh_interval, self.refresh_views)
        self.maintain_connection()

    # -- connection --------------------------------------------------------------------------
    @work(exclusive=True, group="connection")
    async def maintain_connection(self) -> None:
        """Stay connected: on any loss, say so and retry with exponential backoff."""
        delay = self.backoff[0]
        while True:
            reason, was_connected = await self._one_connection()
            self.client = None
            self.connected = False
            # Re-drawn at once, marked stale (and the cache ages stopped).
            self.model.dirty.counters = self.model.dirty.cache = True
            self.refresh_views()
            if was_connected:
                delay = self.backoff[0]  # it worked a moment ago: try again soon
                self._log_local("warning", f"disconnected from {self.target.label}: {reason}")
            self._set_status(False, f"disconnected: {reason}; reconnecting in {delay:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.backoff[1])

    async def _one_connection(self) -> tuple[str, bool]:
        """Connect, load and follow until the connection ends: (why it ended, had it worked)."""
        try:
            client = await AdminClient.connect(self.target.admin_socket, self._on_event)
        except AdminConnectionError as exc:
            return str(exc), False
        connected = False
        try:
            await client.call("subscribe", max_queue=SUBSCRIBE_QUEUE, replay=LOG_REPLAY)
            snapshot = await client.call("snapshot")
            if not isinstance(snapshot, dict):
                return "the daemon sent a snapshot that is not an object", False
            self.model.apply_snapshot(snapshot)
            self._last_snapshot = self.model.clock()
            self.client, self.connected, connected = client, True, True
            self.model.dirty.counters = True  # live again
            self.connections += 1
            self._set_connected_status()
            if self.connections > 1:
                self._log_local("info", f"reconnected to {self.target.label}")
            self.refresh_views()
            return await client.wait_closed(), True
        except (AdminConnectionError, AdminCommandError) as exc:
            return str(exc), connected
        finally:
            await client.aclose()

    def _on_event(self, event: EventMessage) -> None:
        self.model.apply_event(event)

    def _set_connected_status(self) -> None:
        daemon = self.model.daemon
        server = self.client.server if self.client is not None else {}
        version = daemon.get("version") or server.get("server_version") or "?"
        node = daemon.get("node") or self.target.label
        level = daemon.get("log_level", self.model.options.get("log_level", "?"))
        self._set_status(True, f"connected to {node} (ibacm {version}, log_level {level})")

    def _set_status(self, connected: bool, text: str) -> None:
        self.status_text = text
        with contextlib.suppress(NoMatches):  # shutting down
            status = self._find("#status", Static)
            status.set_classes("connected" if connected else "disconnected")
            status.update(Text(("● " if connected else "○ ") + text))

    # -- periodic refresh --------------------------------------------------------------------
    def refresh_views(self) -> None:
        """Apply what changed in the model to the widgets (called every refresh_interval)."""
        # While the app shuts down its widgets go away before the timer and worker stop.
        with contextlib.suppress(NoMatches):
            self._refresh_views()

    def _refresh_views(self) -> None:
        model, dirty = self.model, self.model.dirty
        self._show_staleness()
        if dirty.endpoints:
            self._find("#endpoint-table", KeyedTable).sync(model.endpoint_rows())
            self._find("#ports", KeyedTable).sync(model.port_rows())
            dirty.endpoints = False
        if dirty.groups:
            self._find("#group-table", KeyedTable).sync(model.group_rows())
            dirty.groups = False
        now = model.clock()
        # Ages move every second even without events.
        if dirty.cache or now - self._last_cache_sync >= 1.0:
            self._sync_cache()
            self._last_cache_sync = now
            dirty.cache = False
        if dirty.counters:
            self._refresh_counters()
            dirty.counters = False
        if dirty.logs:
            self._append_logs(model.take_new_logs())
            dirty.logs = False
        # A fresh snapshot after lost events, and now and then anyway: not every change is
        # published as an event (a provider may only describe its state in snapshots).
        stale = self.snapshot_interval > 0 and now - self._last_snapshot >= self.snapshot_interval
        if (model.needs_snapshot or stale) and self.connected and not self._resyncing:
            self.resync()

    def _sync_cache(self) -> None:
        text = self._find("#cache-filter", Input).value
        # Disconnected, the ages stop where the daemon last told us about the entries.
        now = None if self.connected else self.model.updated_at
        self._find("#cache-table", KeyedTable).sync(self.model.cache_rows(text, now=now))

    def _show_staleness(self) -> None:
        """Every tab says so when its data is not live, and since when it has not moved."""
        note = "" if self.connected else self.model.stale_note()
        if note == self._stale_note:
            return
        self._stale_note = note
        with contextlib.suppress(NoMatches):  # shutting down
            self._find("#tabs", TabbedContent).set_class(bool(note), "stale")
            for banner in self._main_screen.query(".stale-banner").results(Static):
                banner.update(Text(note))
                banner.set_class(bool(note), "shown")

    def _refresh_counters(self) -> None:
        summary = self.model.summary()
        self._find("#summary", Static).update(
            Text.assemble(
                ("Resolves ", "bold"),
                f"{summary['resolves']}  ({summary['resolves_per_second']})   ",
                ("Route cache hit rate ", "bold"),
                f"{summary['route_hit_rate']}  (last second {summary['recent_hit_rate']})   ",
                ("Addr cache hit rate ", "bold"),
                f"{summary['addr_hit_rate']}\n",
                ("Cache entries ", "bold"),
                f"{summary['cache_entries']}   ",
                ("Groups ", "bold"),
                f"{summary['groups']}   ",
                ("Events dropped ", "bold"),
                summary["dropped"],
            )
        )
        rps = list(self.model.resolves_per_second)
        hits = [rate * 100 for rate in self.model.hit_rates]
        # A leading zero anchors the scale at 0 (Sparkline scales from the data's minimum).
        self._find("#rps", Sparkline).data = [0.0, *rps] if rps else []
        self._find("#hits", Sparkline).data = [0.0, *hits] if hits else []
        mark = "" if self.connected else " (stale)"
        self._find("#rps-label", Static).update(
            (f"Resolves/s  {rps[-1]:.1f}" if rps else "Resolves/s  -") + mark
        )
        self._find("#hit-label", Static).update(
            (f"Cache hit rate  {hits[-1]:.0f}%" if hits else "Cache hit rate  -") + mark
        )
        self._find("#counter-table", KeyedTable).sync(self.model.counter_rows())

    def _append_logs(self, records: Sequence[LogRecord]) -> None:
        pane = self._find("#log-pane", RichLog)
        for record in self.model.filtered_logs(self.log_level_filter, records):
            pane.write(_styled(record))

    def _rewrite_logs(self) -> None:
        pane = self._find("#log-pane", RichLog)
        pane.clear()
        self.model.take_new_logs()
        for record in self.model.filtered_logs(self.log_level_filter):
            pane.write(_styled(record))

    def _log_local(self, level: str, text: str) -> None:
        self.model.add_local_log(level, text)

    def _update_log_bar(self) -> None:
        self._find("#log-bar", Static).update(
            f"showing {self.log_level_filter} and above (l: change)"
        )

    @work(exclusive=True, group="resync")
    async def resync(self) -> None:
        """Take a fresh snapshot (events were dropped, or the periodic refresh is due)."""
        client = self.client
        if client is None:
            return
        self._resyncing = True
        self._last_snapshot = self.model.clock()
        try:
            snapshot = await client.call("snapshot")
            if isinstance(snapshot, dict):
                self.model.apply_snapshot(snapshot)
        except (AdminConnectionError, AdminCommandError) as exc:
            self._log_local("warning", f"resync failed: {exc}")
        finally:
            self._resyncing = False

    # -- actions -----------------------------------------------------------------------------
    def action_show_tab(self, tab: str) -> None:
        tabs = self._find("#tabs", TabbedContent)
        focused = self._main_screen.focused
        tabs.active = tab
        if focused is not None and tabs.active_pane is not None:
            leaving = [pane for pane in focused.ancestors if isinstance(pane, TabPane)]
            if leaving and leaving[0] is not tabs.active_pane:
                # Focus must not stay in the pane being hidden: Textual would hand it to a
                # visible sibling there (on Cache, the filter field), which shows that pane
                # again and takes every later key as text. Give it to the new tab instead.
                self._main_screen.set_focus(self._find(TAB_BODIES[tab], Widget))

    def action_help(self) -> None:
        if self._modal_open():
            return
        self.push_screen(HelpScreen())

    def _active_tab(self) -> str:
        return self._find("#tabs", TabbedContent).active

    def _active_table(self) -> KeyedTable | None:
        body = self._find(TAB_BODIES[self._active_tab()], Widget)
        return body if isinstance(body, KeyedTable) else None

    def action_sort(self) -> None:
        table = self._active_table()
        if table is None:
            return
        if table.sort_column is not None and not table.sort_reverse:
            table.sort_by(table.sort_column, reverse=True)
            column = table.sort_column
            order = "descending"
        else:
            column = table.sort_next()
            order = "ascending"
        label = table.label_of(column)
        self.notify(f"sorted by {label}, {order}", timeout=2)

    def action_filter(self) -> None:
        self.action_show_tab("cache")
        self._find("#cache-filter", Input).focus()

    def action_clear_filter(self) -> None:
        """Escape: clears the cache filter and leaves it, on the Cache tab only (elsewhere it
        used to jump there and put the focus in the filter, which then ate '2' and 'q')."""
        if self._active_tab() != "cache":
            return
        field = self._find("#cache-filter", Input)
        if field.value:
            field.value = ""
        self._find("#cache-table", KeyedTable).focus()

    @on(Input.Changed, "#cache-filter")
    def _filter_changed(self) -> None:
        self._sync_cache()

    @on(Input.Submitted, "#cache-filter")
    def _filter_submitted(self) -> None:
        self._find("#cache-table", KeyedTable).focus()

    def action_cycle_log_filter(self) -> None:
        index = LEVELS.index(self.log_level_filter)
        self.log_level_filter = LEVELS[(index + 1) % len(LEVELS)]
        self._update_log_bar()
        self._rewrite_logs()

    def _flush_targets(self) -> list[FlushTarget]:
        targets: list[FlushTarget] = []
        tab = self._active_tab()
        if tab == "cache":
            key = self._find("#cache-table", KeyedTable).selected_key()
            if key is not None and "|" in key:
                endpoint, dest = key.split("|", 1)
                targets += [FlushTarget(endpoint, dest), FlushTarget(endpoint, None)]
        elif tab == "endpoints":
            key = self._find("#endpoint-table", KeyedTable).selected_key()
            if key is not None:
                targets.append(FlushTarget(key, None))
        targets.append(FlushTarget(None, None))
        return targets

    def _require_connection(self) -> AdminClient | None:
        if self.client is None:
            self.notify("not connected to the daemon", severity="error")
        return self.client

    def action_flush(self) -> None:
        if self._modal_open():
            return
        if self._require_connection() is None:
            return

        def chosen(target: FlushTarget | None) -> None:
            if target is not None:
                self.run_command("flush", f"flush {target.describe()}", **_flush_args(target))

        self.push_screen(FlushScreen(self.target.label, self._flush_targets()), chosen)

    def action_reload(self) -> None:
        if self._modal_open():
            return
        if self._require_connection() is None:
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_command("reload", "reload")

        question = f"Reload the configuration files of [b]{self.target.label}[/b]?"
        self.push_screen(ConfirmScreen(question, yes="Reload"), answered)

    def action_cycle_daemon_level(self) -> None:
        if self._require_connection() is None:
            return
        current = self.model.daemon.get("log_level", 0)
        level = DAEMON_LEVELS[(DAEMON_LEVELS.index(current) + 1) % 3] if current in (0, 1, 2) else 0
        self.run_command("set_log_level", f"daemon log_level {level}", level=level)

    @work(group="commands")
    async def run_command(self, cmd: str, what: str, **args: Any) -> None:
        client = self.client
        if client is None:
            self.notify("not connected to the daemon", severity="error")
            return
        try:
            result = await client.call(cmd, **args)
        except (AdminConnectionError, AdminCommandError) as exc:
            self.notify(f"{what} failed: {exc}", severity="error", timeout=6)
            if not _logged_by_daemon(exc):
                self._log_local("error", f"{what} failed: {exc}")
            return
        if cmd == "flush" and isinstance(result, dict):
            self.notify(f"{what}: {result.get('flushed', 0)} entries dropped")
        elif cmd == "set_log_level":
            self.model.daemon["log_level"] = args["level"]
            self._set_connected_status()
            self.notify(what)
        else:
            self.notify(f"{what}: done")
        with contextlib.suppress(AdminConnectionError, AdminCommandError):
            snapshot = await client.call("snapshot")
            if isinstance(snapshot, dict):
                self.model.apply_snapshot(snapshot)
                self._set_connected_status()


def _logged_by_daemon(exc: Exception) -> bool:
    """Whether the daemon's own log (shown on the Logs tab) already says why the command
    failed: a refused reload logs its problems, so the dashboard does not say it twice."""
    return isinstance(exc, AdminCommandError) and exc.code == ErrorCode.INVALID_CONFIG


def _stale_banner() -> Static:
    """The line over a tab's data that says it is not live (shown only then)."""
    return Static("", classes="stale-banner")


def _flush_args(target: FlushTarget) -> dict[str, Any]:
    return {"endpoint": target.endpoint, "dest": target.dest}


_LEVEL_STYLES = {"debug": "dim", "info": "", "warning": "yellow", "error": "bold red"}


def _styled(record: LogRecord) -> Text:
    return Text(record.text, style=_LEVEL_STYLES.get(record.level, ""))


# -- command line ------------------------------------------------------------------------------


def target_from_args(args: argparse.Namespace) -> Target:
    """The admin socket to watch; raises ValueError with a message for the user."""
    path, label = admin_target(args.admin, args.dir, args.node)
    return Target(path, label)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ibacm-tui",
        description="Live dashboard of an ibacm daemon, attached to its admin socket.",
    )
    parser.add_argument("--admin", metavar="PATH", help="admin socket of the daemon")
    parser.add_argument("--dir", metavar="SIMDIR", help="directory of an ibacm-sim cluster")
    parser.add_argument("--node", metavar="NAME", help="node of the cluster to watch")
    parser.add_argument("--version", action="version", version=f"ibacm-tui {__version__}")
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        target = target_from_args(args)
    except ValueError as exc:
        print(f"ibacm-tui: {exc}", file=sys.stderr)
        return 2
    Dashboard(target).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

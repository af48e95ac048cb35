"""Every key of the dashboard works from every tab, whatever happened to the focus before.

The walk: for each tab, in each of three states, each key is pressed once (after putting the
dashboard back into that state) and its effect is checked; at the end ``q`` quits. States:

* ``filter closed``: the cache filter is empty, the tab was chosen with its digit;
* ``escape``: as above, then Escape (on Cache it clears the filter and leaves the field);
* ``filter open``: a cache filter was typed after ``/`` and kept with Enter, then the tab
  was chosen: the filter still narrows the cache table.

While the filter field itself has the focus, printable keys are text (an address filter needs
digits); ``test_the_filter_field_takes_text_and_lets_go`` covers the ways out of it.
"""

from __future__ import annotations

import pytest
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Input

from tests.tui.lab import EP1, LabServer
from tests.tui.test_app import SIZE, connected, dashboard, table, until
from tui.app import TAB_BODIES, TAB_IDS, Dashboard
from tui.screens import ConfirmScreen, FlushScreen, HelpScreen
from tui.tables import KeyedTable

STATES = ("filter closed", "escape", "filter open")
FILTER = "10.0.0"
DIGITS = {tab: str(index) for index, tab in enumerate(TAB_IDS, start=1)}
KEYS = (*DIGITS.values(), "question_mark", "f", "r", "s", "slash", "escape", "l", "L")
"""Every binding of the dashboard but ``q`` (pressed last, it ends the walk)."""


def filter_field(app: Dashboard) -> Input:
    return app.query_one("#cache-filter", Input)


def typing(app: Dashboard) -> bool:
    return isinstance(app.focused, Input)


def sort_order(sorted_table: KeyedTable | None) -> tuple[str | None, bool] | None:
    return None if sorted_table is None else (sorted_table.sort_column, sorted_table.sort_reverse)


async def reach(pilot: Pilot[None], app: Dashboard, tab: str, state: str) -> None:
    """Put the dashboard on ``tab`` in ``state``, from wherever the last key left it."""
    wanted = FILTER if state == "filter open" else ""
    if typing(app) or filter_field(app).value != wanted:
        # "3" shows Cache (or is typed into the filter), and Escape clears the filter and
        # leaves the field.
        await pilot.press("3", "escape")
        if wanted:
            await pilot.press("slash", *wanted, "enter")
    await pilot.press(DIGITS[tab])
    if state == "escape":
        await pilot.press("escape")
    await pilot.pause()
    assert app.screen is app._main_screen
    assert app._active_tab() == tab, f"{state}: on {app._active_tab()}, not {tab}"
    assert not typing(app), f"{state} on {tab}: the filter field has the focus"
    assert filter_field(app).value == (FILTER if state == "filter open" else "")


async def press_and_check(
    pilot: Pilot[None], app: Dashboard, lab: LabServer, tab: str, state: str, key: str
) -> None:
    where = f"{key!r} on {tab} ({state})"
    before_filter = filter_field(app).value
    sorted_table = app._active_table()
    sort_before = sort_order(sorted_table)
    log_filter, daemon_level = app.log_level_filter, lab.daemon.log_level
    reloads = lab.daemon.reloads
    await pilot.press(key)
    await pilot.pause()
    if key in DIGITS.values():
        shown = TAB_IDS[int(key) - 1]
        assert app._active_tab() == shown, f"{where}: on {app._active_tab()}"
        assert app.focused is not None and not typing(app), f"{where}: focus {app.focused}"
        assert filter_field(app).value == before_filter, where
        return
    if key == "question_mark":
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), f"{where}: help")
        await pilot.press("escape")
    elif key == "f":
        await until(pilot, lambda: isinstance(app.screen, FlushScreen), f"{where}: flush dialog")
        await pilot.press("escape")
    elif key == "r":
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), f"{where}: reload dialog")
        await pilot.press("n")
    elif key == "s":
        if sorted_table is not None:
            assert sort_order(sorted_table) != sort_before, f"{where}: the table was not sorted"
    elif key == "slash":
        assert app._active_tab() == "cache" and app.focused is filter_field(app), where
        await pilot.press(*"x", "enter")  # the field takes text, Enter leaves it
        assert filter_field(app).value == before_filter + "x", where
        assert not typing(app), where
        return
    elif key == "escape":
        if tab == "cache":
            assert filter_field(app).value == "", f"{where}: the filter was not cleared"
            assert app.focused is table(app, "cache-table"), f"{where}: focus {app.focused}"
        else:
            assert filter_field(app).value == before_filter, where
    elif key == "l":
        assert app.log_level_filter != log_filter, where
    elif key == "L":
        await until(pilot, lambda: lab.daemon.log_level != daemon_level, f"{where}: log_level")
    await pilot.pause()
    assert app.screen is app._main_screen, f"{where}: a dialog stayed open"
    assert app._active_tab() == tab, f"{where}: moved to {app._active_tab()}"
    assert not typing(app), f"{where}: the filter field took the focus"
    assert lab.daemon.reloads == reloads, f"{where}: reloaded without a yes"


@pytest.mark.asyncio
@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("tab", TAB_IDS)
async def test_every_key_works_from_every_tab_and_focus_state(
    lab: LabServer, tab: str, state: str
) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        for key in KEYS:
            await reach(pilot, app, tab, state)
            if state == "filter open":  # the filter really narrows the table
                assert set(table(app, "cache-table").shown) == {f"{EP1}|10.0.0.3"}
            await press_and_check(pilot, app, lab, tab, state, key)
        await reach(pilot, app, tab, state)
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, f"q on {tab} ({state}) to quit")
    assert app.return_code == 0


@pytest.mark.asyncio
async def test_the_filter_field_takes_text_and_lets_go(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        cache = table(app, "cache-table")
        # In the field, digits and q are text (addresses have digits)...
        await pilot.press("slash", *"10.0.1", "q")
        assert filter_field(app).value == "10.0.1q" and typing(app)
        await pilot.press("backspace", "enter")  # ...Enter keeps the filter and leaves...
        await until(pilot, lambda: list(cache.shown) == ["mlx5_0/2/0xffff|10.0.1.3"], "filter")
        assert app.focused is cache and filter_field(app).value == "10.0.1"
        await pilot.press("1")
        assert app._active_tab() == "endpoints"
        await pilot.press("slash", "tab")  # ...Tab moves on to the table, keeping the text...
        assert app.focused is cache and filter_field(app).value == "10.0.1"
        await pilot.press("2")
        assert app._active_tab() == "groups" and not typing(app)
        await pilot.press("slash", "escape")  # ...Escape clears it and leaves.
        assert app.focused is cache and filter_field(app).value == ""
        await until(pilot, lambda: len(cache.shown) == 3, "the whole cache again")
        await pilot.press("5")
        assert app._active_tab() == "log" and app.focused is app.query_one(TAB_BODIES["log"])


@pytest.mark.asyncio
async def test_a_tab_digit_moves_on_from_whichever_widget_has_the_focus(lab: LabServer) -> None:
    app = dashboard(lab.path, "lab")
    async with app.run_test(size=SIZE) as pilot:
        await connected(pilot, app)
        for index, tab in enumerate(TAB_IDS):
            await pilot.press(DIGITS[tab])
            # Every widget the Tab key reaches while this tab is shown (tab bar included).
            reached: list[Widget] = []
            while app.focused is not None and app.focused not in reached:
                reached.append(app.focused)
                await pilot.press("tab")
            assert app.query_one(TAB_BODIES[tab]) in reached, tab
            following = TAB_IDS[(index + 1) % len(TAB_IDS)]
            for widget in reached:
                if isinstance(widget, Input):
                    continue  # keys are text there (see the test above)
                await pilot.press(DIGITS[tab])
                app.screen.set_focus(widget)
                await pilot.press(DIGITS[following])
                where = f"{DIGITS[following]} with the focus on {widget} ({tab})"
                assert app._active_tab() == following, where
                assert not typing(app), where
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "q to quit")

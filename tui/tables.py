"""A keyed DataTable that follows a dict of rows by changing only what changed.

``sync(rows)`` adds new keys, removes vanished ones and calls ``update_cell`` for each cell
whose text differs, so the cursor, the scroll position and the sort stay where the operator
left them while numbers move. Clicking a header (or ``sort_next``) sorts by that column;
a second click on the same column reverses the order. Sorting is "natural": numbers, ages,
percentages and hex values compare by value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist

_AGE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?")


def natural_key(value: Any) -> tuple[int, float, str]:
    """Sort key of one cell: numbers by value (also ``12s``, ``75.0%``, ``0x0003``), else text."""
    text = str(value).strip()
    if text.startswith("0x"):
        try:
            return (0, float(int(text, 16)), "")
        except ValueError:
            pass
    age = _AGE.match(text) if text and text[-1] in "hms" else None
    if age is not None and any(age.groups()):
        hours, minutes, seconds = (int(g) if g else 0 for g in age.groups())
        return (0, float(hours * 3600 + minutes * 60 + seconds), "")
    number = _NUMBER.match(text)
    if number is not None:
        return (0, float(number.group()), text)
    return (1, 0.0, text.lower())


class KeyedTable(DataTable[str]):
    """DataTable whose rows are identified by string keys and updated cell by cell."""

    def __init__(self, columns: Sequence[tuple[str, str]], **kwargs: Any) -> None:
        kwargs.setdefault("cursor_type", "row")
        kwargs.setdefault("zebra_stripes", True)
        super().__init__(**kwargs)
        self.column_keys = [key for key, _ in columns]
        self._labels = list(columns)
        self._shown: dict[str, tuple[str, ...]] = {}
        self.sort_column: str | None = None
        self.sort_reverse = False
        self.cell_updates = 0
        """How many cells ``sync`` changed in place (observability for tests)."""

    def on_mount(self) -> None:
        for key, label in self._labels:
            self.add_column(label, key=key)

    def label_of(self, column: str) -> str:
        return dict(self._labels).get(column, column)

    @property
    def shown(self) -> Mapping[str, tuple[str, ...]]:
        return self._shown

    def sync(self, rows: Mapping[str, tuple[str, ...]]) -> None:
        """Make the table show ``rows`` (key -> one text per column)."""
        for key in [k for k in self._shown if k not in rows]:
            self.remove_row(key)
            del self._shown[key]
        added = False
        changed_sort_column = False
        for key, cells in rows.items():
            if len(cells) != len(self.column_keys):
                raise ValueError(
                    f"row {key!r} has {len(cells)} cells, table has {len(self.column_keys)} columns"
                )
            old = self._shown.get(key)
            if old is None:
                self.add_row(*cells, key=key)
                added = True
            else:
                for index, (before, after) in enumerate(zip(old, cells, strict=True)):
                    if before != after:
                        column = self.column_keys[index]
                        self.update_cell(key, column, after, update_width=True)
                        self.cell_updates += 1
                        changed_sort_column |= column == self.sort_column
            self._shown[key] = cells
        if self.sort_column is not None and (added or changed_sort_column):
            self._apply_sort()

    def sort_by(self, column: str, *, reverse: bool | None = None) -> None:
        if column not in self.column_keys:
            raise ValueError(f"no column {column!r} (columns: {', '.join(self.column_keys)})")
        if reverse is None:
            reverse = not self.sort_reverse if column == self.sort_column else False
        self.sort_column, self.sort_reverse = column, reverse
        self._apply_sort()

    def sort_next(self) -> str:
        """Sort by the next column (keyboard users); returns its key."""
        if self.sort_column is None:
            column = self.column_keys[0]
        else:
            index = self.column_keys.index(self.sort_column)
            column = self.column_keys[(index + 1) % len(self.column_keys)]
        self.sort_by(column, reverse=False)
        return column

    def _apply_sort(self) -> None:
        if self.sort_column is not None and self.row_count:
            self.sort(self.sort_column, key=natural_key, reverse=self.sort_reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        column = event.column_key.value
        if column is not None:
            self.sort_by(column)

    def selected_key(self) -> str | None:
        """Key of the row under the cursor, if any."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except CellDoesNotExist:  # the cursor may point past a row that just vanished
            return None

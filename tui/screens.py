"""Modal screens of the dashboard: help, confirmation, and the flush choice."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

HELP_TEXT = """\
[b]ibacm-tui[/b] — live view of one ibacm daemon over its admin socket

[b]Views[/b]
  1  Endpoints (and ports)      2  Multicast groups      3  Cache
  4  Counters, hit rates, plots 5  Log
  tab / shift+tab  move between widgets

[b]Tables[/b]
  ↑ ↓ PgUp PgDn  move       s  sort by the next column (again: reverse)
  click a column header to sort by it
  /  filter the cache (matches any column): enter keeps it, escape clears it

[b]Actions[/b] (each asks for confirmation)
  f  flush the cache: the selected destination, its endpoint, or everything
  r  reload the daemon's configuration files

[b]Logging[/b]
  l  log pane: cycle the minimum level shown (debug, info, warning, error)
  L  daemon: cycle its log_level (0 warnings, 1 info, 2 debug)

  ?  this help        q  quit

When the daemon goes away the status line says [b]disconnected[/b] and each tab
[b]STALE[/b], with the time of the last update. The dashboard reconnects by
itself and reloads everything (rates start over with a restarted daemon).
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="help"):
            yield Static(HELP_TEXT, id="help-text")
            yield Button("Close", id="close", variant="primary")

    def action_close(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True only for an explicit yes."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, question: str, yes: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.question, id="question")
            with Horizontal(classes="buttons"):
                yield Button(self.yes, id="yes", variant="warning")
                yield Button("Cancel", id="no", variant="primary")

    def on_mount(self) -> None:
        # Focus on Cancel: a stray Enter must not trigger the action.
        self.query_one("#no", Button).focus()

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")


@dataclass(frozen=True, slots=True)
class FlushTarget:
    """What to flush: ``None`` fields mean "all"."""

    endpoint: str | None
    dest: str | None

    def describe(self) -> str:
        if self.dest is not None:
            where = f" on {self.endpoint}" if self.endpoint else ""
            return f"the cache entry for {self.dest}{where}"
        if self.endpoint is not None:
            return f"every cache entry of endpoint {self.endpoint}"
        return "every cache entry of every endpoint"


class FlushScreen(ModalScreen[FlushTarget | None]):
    """Choose what to flush among the targets the current selection allows."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, node: str, targets: list[FlushTarget]) -> None:
        super().__init__()
        if not targets:
            raise ValueError("FlushScreen needs at least one target")
        self.node = node
        self.targets = targets

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(f"Flush the address cache of [b]{self.node}[/b]?", id="question")
            for index, target in enumerate(self.targets):
                yield Button(
                    f"Flush {target.describe()}",
                    id=f"target-{index}",
                    variant="warning",
                    classes="wide",
                )
            yield Button("Cancel", id="cancel", variant="primary", classes="wide")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        button = event.button.id or ""
        if button.startswith("target-"):
            self.dismiss(self.targets[int(button.removeprefix("target-"))])
        else:
            self.dismiss(None)

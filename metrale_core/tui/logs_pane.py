"""``LogsPane``: the server's logs with follow / pause and a filter box.

Owner: the dashboard app (tab 3).  Reads a :class:`LogRing` (fed by a loguru sink the CLI
installs); never touches loguru itself.

Invariants:
- Following: each poll appends the records newer than the last one seen that match the filter,
  and the view scrolls to the end.  Paused: the view is frozen (records keep arriving in the
  ring and are counted); resuming redraws from the ring.
- Changing the filter redraws the view from the whole ring (case-insensitive substring over the
  level and the message).
"""

from __future__ import annotations

from rich.text import Text
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, RichLog, Static

from metrale_core.tui.logring import LogRecord, LogRing

__all__ = ["LogsPane"]

_LEVEL_STYLE = {
    "ERROR": "bold red",
    "CRITICAL": "bold red",
    "WARNING": "yellow",
    "SUCCESS": "green",
    "INFO": "",
    "DEBUG": "dim",
    "TRACE": "dim",
}


def _line(record: LogRecord) -> Text:
    text = Text(f"{record.time:%H:%M:%S} ", style="dim")
    text.append(f"{record.level:<7} ", style=_LEVEL_STYLE.get(record.level, ""))
    text.append(record.message)
    return text


class LogsPane(Vertical):
    DEFAULT_CSS = """
    LogsPane > Horizontal { height: 3; }
    LogsPane #log-filter { width: 1fr; }
    LogsPane #log-state { width: 30; padding: 1 1; }
    LogsPane RichLog { height: 1fr; border: round $primary-darken-2; }
    """

    def __init__(self, ring: LogRing | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ring = ring if ring is not None else LogRing()
        self.following = True
        self.filter = ""
        self._seen = 0
        self._pending = 0

    def compose(self):
        with Horizontal():
            yield Input(placeholder="filter: (type to filter the logs)", id="log-filter")
            yield Static(id="log-state")
        yield RichLog(id="log-view", max_lines=self.ring.capacity, wrap=True)

    def on_mount(self) -> None:
        self._show_state()

    # --- controls ----------------------------------------------------------------------------
    def toggle_follow(self) -> None:
        self.following = not self.following
        if self.following:
            self.redraw()
        self._show_state()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "log-filter":
            self.filter = event.value
            self.redraw()
            event.stop()

    # --- drawing -----------------------------------------------------------------------------
    def redraw(self) -> None:
        view = self.query_one("#log-view", RichLog)
        view.clear()
        self._seen, self._pending = 0, 0
        self.poll()

    def poll(self) -> None:
        records = self.ring.since(self._seen)
        if not records:
            return
        if not self.following:
            self._pending += len(records)
            self._seen = records[-1].seq
            self._show_state()
            return
        view = self.query_one("#log-view", RichLog)
        for record in records:
            if record.matches(self.filter):
                view.write(_line(record), scroll_end=True)
        self._seen = records[-1].seq

    def _show_state(self) -> None:
        if self.following:
            state = Text("● following", style="green")
        else:
            state = Text(f"❚❚ paused ({self._pending} new)", style="yellow")
        self.query_one("#log-state", Static).update(state)

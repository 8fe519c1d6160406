"""``MetraleApp``: the terminal dashboard of ``met serve`` (Textual).

Owner: ``met serve`` runs it in the main thread while the HTTP server and the engine run on
theirs (:mod:`metrale_core.tui.launch`); tests drive it headless with ``App.run_test()``.

Tabs: 1 Overview (start-up checklist, weight load, READY strip), 2 Stats (engine snapshot),
3 Logs (follow / pause, filter), 4 Chat (streaming client over the HTTP API), 5 Help.

Invariants:
- The app only reads: :class:`ServerStatus` and the engine's published ``EngineSnapshot``, on a
  timer (``refresh_s``).  Nothing here calls into the engine, so the engine loop never waits
  for the UI.
- Quitting (``q``, ``ctrl+q``, ``ctrl+c``) calls :meth:`ServerStatus.request_stop` before the
  app exits, so the server and the engine stop with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

from rich.table import Table
from textual.app import App
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.widgets import Footer, Static, TabbedContent, TabPane

from metrale_core.tui.chat_client import ChatClient
from metrale_core.tui.chat_pane import ChatPane
from metrale_core.tui.header import HeaderBar
from metrale_core.tui.logring import LogRing
from metrale_core.tui.logs_pane import LogsPane
from metrale_core.tui.overview import OverviewPane
from metrale_core.tui.stats_pane import RateTracker, StatsPane
from metrale_core.tui.status import ServerStatus

__all__ = ["KEYS", "TABS", "MetraleApp"]

#: (tab id, title), in key order 1..5.
TABS = (("overview", "Overview"), ("stats", "Stats"), ("logs", "Logs"), ("chat", "Chat"), ("help", "Help"))

#: (keys, what they do) — the help tab lists exactly these.
KEYS = (
    ("1 … 5", "jump to Overview, Stats, Logs, Chat, Help"),
    ("tab / shift+tab", "move the focus"),
    ("?", "this help"),
    ("f", "logs: follow / pause"),
    ("/", "logs: focus the filter box (Esc leaves it)"),
    ("Enter", "chat: send the message"),
    ("Esc", "leave a text box"),
    ("q, ctrl+q, ctrl+c", "quit: stop the server and exit"),
)


def _help_table() -> Table:
    table = Table(title="Metrale dashboard — keys", title_justify="left", expand=False)
    table.add_column("key", style="bold cyan")
    table.add_column("action")
    for keys, action in KEYS:
        table.add_row(keys, action)
    return table


class MetraleApp(App):
    TITLE = "Metrale"
    CSS = """
    TabbedContent { height: 1fr; }
    #help-body { padding: 1 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(str(i + 1), f"show_tab('{tab}')", title, show=False) for i, (tab, title) in enumerate(TABS)),
        Binding("question_mark", "show_tab('help')", "Help"),
        Binding("f", "toggle_follow", "Follow/pause logs"),
        Binding("slash", "focus_filter", "Filter logs", show=False),
        Binding("escape", "leave_input", "Leave box", show=False),
        Binding("q", "quit_server", "Quit"),
        Binding("ctrl+q", "quit_server", "Quit", show=False, priority=True),
        Binding("ctrl+c", "quit_server", "Quit", show=False, priority=True),
    ]

    def __init__(
        self,
        status: ServerStatus,
        logs: LogRing | None = None,
        *,
        refresh_s: float = 0.5,
        chat_client_factory: Callable[[ServerStatus], ChatClient] | None = None,
        chat_max_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.status = status
        self.logs = logs if logs is not None else LogRing()
        self.refresh_s = refresh_s
        self.chat_client_factory = chat_client_factory
        self.chat_max_tokens = chat_max_tokens
        self.clock = clock
        self.rates = RateTracker()
        self.tick = 0

    def compose(self):
        yield HeaderBar(id="header")
        with TabbedContent(initial="overview"):
            with TabPane("1 Overview", id="overview"):
                yield OverviewPane()
            with TabPane("2 Stats", id="stats"):
                yield StatsPane()
            with TabPane("3 Logs", id="logs"):
                yield LogsPane(self.logs)
            with TabPane("4 Chat", id="chat"):
                yield ChatPane(self.status, self.chat_client_factory, self.chat_max_tokens)
            with TabPane("5 Help", id="help"):
                yield VerticalScroll(Static(_help_table(), id="help-body"))
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_now()
        self.set_interval(self.refresh_s, self.refresh_now)

    def refresh_now(self) -> None:
        """Poll the status, the snapshot and the logs once and redraw (a tick while the
        dashboard's screen is not there -- the interval can fire once more during shutdown --
        does nothing)."""
        try:
            header = self.query_one(HeaderBar)
        except NoMatches:
            return
        self.tick += 1
        status = self.status
        status.poll()
        snap = status.snapshot()
        self.rates.sample(snap, self.clock())
        header.show(status)
        self.query_one(OverviewPane).show(status, self.tick)
        self.query_one(StatsPane).show(snap, self.rates)
        self.query_one(LogsPane).poll()

    # --- actions -----------------------------------------------------------------------------
    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self.set_focus(None)
        if tab == "chat":
            self.query_one("#chat-input").focus()

    def action_toggle_follow(self) -> None:
        self.query_one(LogsPane).toggle_follow()

    def action_focus_filter(self) -> None:
        self.action_show_tab("logs")
        self.query_one("#log-filter").focus()

    def action_leave_input(self) -> None:
        self.set_focus(None)

    def action_quit_server(self) -> None:
        self.status.request_stop()
        self.exit()

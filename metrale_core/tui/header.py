"""``HeaderBar``: the dashboard's top line: wordmark, status pill, uptime and the server's badges.

Owner: the dashboard app (one instance, refreshed on every poll).

Invariants:
- It claims nothing it does not know: with no model it shows the port (if any) and "no model";
  unknown values are left out rather than guessed.
- The pill text is exactly :attr:`ServerStatus.pill` (LOADING / SERVING / NO MODEL / ...).
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from metrale_core.tui import fmt
from metrale_core.tui.status import ServerStatus

__all__ = ["HeaderBar", "header_text"]

_PILL_STYLE = {
    "SERVING": "bold black on green",
    "LOADING": "bold black on yellow",
    "NO MODEL": "bold white on grey37",
    "FAILED": "bold white on red",
    "STOPPING": "bold black on dark_orange",
}


def header_text(status: ServerStatus) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" M E T R A L E ", style="bold cyan")
    pill = status.pill
    text.append(f" {pill} ", style=_PILL_STYLE.get(pill, "reverse"))
    text.append(f"  {fmt.uptime(status.uptime())}", style="bold")
    parts = []
    if status.listen:
        parts.append(("listen", status.listen))
    if status.state == "no_model":
        parts.append(("model", "none"))
    elif status.model:
        parts.append(("model", status.model))
    if status.kv_dtype:
        parts.append(("kv", status.kv_dtype))
    if status.scheduler:
        parts.append(("sched", status.scheduler))
    for key, value in parts:
        text.append("  · ", style="dim")
        text.append(f"{key} ", style="dim")
        text.append(value)
    if status.state == "failed" and status.error:
        text.append(f"  {status.error}", style="red")
    return text


class HeaderBar(Static):
    DEFAULT_CSS = """
    HeaderBar { height: 1; background: $panel; }
    """

    def show(self, status: ServerStatus) -> None:
        self.update(header_text(status))

"""``OverviewPane``: the start-up checklist, the weight-load panel and, once serving, the READY strip.

Owner: the dashboard app (tab 1).  Reads only :class:`ServerStatus`.

Invariants:
- Each phase renders as ``✓`` (done, with seconds), a spinner (running, with seconds so far),
  ``○`` (pending) or ``✗`` (failed, with its reason).
- The weight-load panel shows tensors n/N, bytes read, rate and ETA; the ETA disappears once
  all tensors are read.
"""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from metrale_core.tui import fmt
from metrale_core.tui.status import ServerStatus

__all__ = ["OverviewPane", "ready_text", "startup_text", "weights_text"]

_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
BAR_WIDTH = 40


def startup_text(status: ServerStatus, tick: int = 0) -> Text:
    now = status.clock()
    text = Text("STARTUP\n", style="bold")
    if not status.phases:
        text.append("  (no start-up phases reported)\n", style="dim")
    for phase in status.phases:
        elapsed = fmt.duration(phase.elapsed(now)) if phase.started is not None else ""
        if phase.state == "done":
            text.append("  ✓ ", style="green")
        elif phase.state == "running":
            text.append(f"  {_SPINNER[tick % len(_SPINNER)]} ", style="yellow")
        elif phase.state == "failed":
            text.append("  ✗ ", style="red")
        else:
            text.append("  ○ ", style="dim")
        text.append(f"{phase.name:<14}", style="dim" if phase.state == "pending" else "")
        text.append(f" {elapsed:>6}")
        if phase.detail:
            text.append(f"  {phase.detail}", style="red" if phase.state == "failed" else "dim")
        text.append("\n")
    return text


def weights_text(status: ServerStatus) -> Text:
    load = status.load
    text = Text("WEIGHT LOAD\n", style="bold")
    if load.tensors_total == 0:
        text.append("  waiting for the checkpoint…\n", style="dim")
        return text
    text.append(f"  {fmt.bar(load.fraction, BAR_WIDTH)} {fmt.percent(load.fraction)}\n", style="cyan")
    text.append(f"  tensors {load.tensors_done}/{load.tensors_total}")
    text.append(f"  ·  read {fmt.human_bytes(load.bytes_done)}")
    if load.checkpoint_bytes:
        text.append(f"  ·  checkpoint {fmt.human_bytes(load.checkpoint_bytes)}")
    rate = load.rate()
    text.append(f"  ·  {fmt.human_bytes(rate)}/s" if rate is not None else "")
    if load.tensors_done < load.tensors_total:
        text.append(f"  ·  ETA {fmt.duration(load.eta())}")
    text.append("\n")
    return text


def ready_text(status: ServerStatus) -> Text:
    text = Text()
    if status.state == "serving":
        loaded_in = (status.ready_at - status.started) if status.ready_at is not None else None
        text.append(" READY ", style="bold black on green")
        text.append(f"  loaded in {fmt.duration(loaded_in)}")
        if status.listen:
            text.append(f" · listening {status.listen}")
        text.append("\n")
    elif status.state == "no_model":
        text.append(" NO MODEL ", style="bold white on grey37")
        text.append("  no model is loaded; start `met serve --model PATH`\n")
    elif status.state == "failed":
        text.append(" FAILED ", style="bold white on red")
        text.append(f"  {status.error or 'start-up failed'}\n")
    elif status.state == "stopping":
        text.append(" STOPPING ", style="bold black on dark_orange")
        text.append("  shutting the server down…\n")
    else:
        text.append(" LOADING ", style="bold black on yellow")
        text.append("  starting up…\n")
    return text


class OverviewPane(VerticalScroll):
    DEFAULT_CSS = """
    OverviewPane > Static { margin: 0 1 1 1; }
    """

    def compose(self):
        yield Static(id="ready")
        yield Static(id="startup")
        yield Static(id="weights")

    def show(self, status: ServerStatus, tick: int) -> None:
        self.query_one("#ready", Static).update(ready_text(status))
        self.query_one("#startup", Static).update(startup_text(status, tick))
        self.query_one("#weights", Static).update(weights_text(status))

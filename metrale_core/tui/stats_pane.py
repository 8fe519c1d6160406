"""``StatsPane``: the engine's numbers, from the snapshot the engine publishes each step.

Owner: the dashboard app (tab 2).  It reads ``EngineSnapshot`` values only (never the engine's
live objects), so it cannot slow the engine loop down.

Invariants:
- Rates (generation / prompt tok/s) are differences of two snapshots' counters over the
  dashboard's own clock, sampled on every poll (also while the tab is hidden), so an idle
  engine — which publishes nothing — reads as 0 tok/s.
- Plugin extras render with the label and formatter their plugin declared when publishing them
  (``label=`` / ``format=``); an undeclared extra is listed as ``name: value``.  The pane knows
  no plugin by name.  Absent ones are not shown.
"""

from __future__ import annotations

from collections import deque

from attrs import define, field
from rich.text import Text
from textual.containers import Grid, VerticalScroll
from textual.widgets import Static

from metrale_core.engine.snapshot import EngineSnapshot
from metrale_core.tui import fmt

__all__ = ["RateTracker", "StatsPane", "describe_extras", "stats_texts"]

SPARK_WIDTH = 30
HIST_WIDTH = 24


@define
class RateTracker:
    """Generation and prompt tok/s history from successive snapshots."""

    history: int = 60
    gen: deque = field(init=False)
    prompt: deque = field(init=False)
    _last: tuple[float, int, int] | None = field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.gen = deque(maxlen=self.history)
        self.prompt = deque(maxlen=self.history)

    def sample(self, snap: EngineSnapshot | None, now: float) -> None:
        if snap is None:
            return
        current = (now, snap.generation_tokens_total, snap.prompt_tokens_total)
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            self.gen.append(max(0, current[1] - self._last[1]) / dt)
            self.prompt.append(max(0, current[2] - self._last[2]) / dt)
        self._last = current

    @property
    def gen_rate(self) -> float:
        return self.gen[-1] if self.gen else 0.0

    @property
    def prompt_rate(self) -> float:
        return self.prompt[-1] if self.prompt else 0.0


def describe_extras(snap: EngineSnapshot) -> list[tuple[str, str]]:
    """``(label, value)`` lines for the plugin extras of a snapshot, as each plugin declared
    them (``EngineSnapshot.extra_formats``)."""
    return snap.describe_extras()


def _tile(title: str) -> Text:
    return Text(f"{title}\n", style="bold")


def stats_texts(snap: EngineSnapshot | None, rates: RateTracker) -> dict[str, Text]:
    """The text of each stats tile, keyed by tile id."""
    if snap is None:
        waiting = Text("no engine yet — the model is still loading", style="dim")
        return {"requests": waiting}
    out: dict[str, Text] = {}
    t = _tile("REQUESTS")
    t.append(f"total {snap.requests_total}  active {snap.num_running}  waiting {snap.num_waiting}\n")
    t.append(f"finished {snap.requests_finished}")
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(snap.finish_reasons.items()))
    if reasons:
        t.append(f" ({reasons})", style="dim")
    out["requests"] = t

    t = _tile("THROUGHPUT")
    t.append(f"gen    {rates.gen_rate:8.1f} tok/s  ")
    t.append(fmt.sparkline(rates.gen, SPARK_WIDTH), style="green")
    t.append(f"\nprompt {rates.prompt_rate:8.1f} tok/s  ")
    t.append(fmt.sparkline(rates.prompt, SPARK_WIDTH), style="cyan")
    t.append(f"\ntokens: {snap.generation_tokens_total} generated, {snap.prompt_tokens_total} prompt", style="dim")
    out["throughput"] = t

    t = _tile("TTFT")
    t.append(
        f"p50 {fmt.ttft_ms(snap.ttft_percentile(50))}   "
        f"p90 {fmt.ttft_ms(snap.ttft_percentile(90))}   n={snap.ttft_count}\n"
    )
    buckets = fmt.histogram(snap.ttft_samples)
    top = max((c for _, c in buckets), default=0)
    for i, (label, count) in enumerate(buckets):
        style = "yellow" if i >= len(buckets) - 1 else "magenta"
        t.append(f"{label:>7} ")
        t.append(fmt.bar(count / top if top else 0.0, HIST_WIDTH), style=style)
        t.append(f" {count}\n")
    out["ttft"] = t

    t = _tile("KV CACHE & SEQUENCES")
    used = snap.num_used_blocks
    frac = used / snap.num_blocks if snap.num_blocks else 0.0
    t.append(f"KV blocks used {used} / free {snap.num_free_blocks} of {snap.num_blocks}\n")
    t.append(fmt.bar(frac, HIST_WIDTH), style="cyan")
    t.append(f" {fmt.percent(frac)}\n")
    if snap.num_state_slots:
        t.append(f"state slots used {snap.num_state_slots - snap.num_free_state_slots} / {snap.num_state_slots}\n")
    else:
        t.append("state slots: none (no recurrent state)\n", style="dim")
    t.append(f"prefilling {snap.num_prefilling}  preemptions {snap.num_preemptions}")
    out["memory"] = t

    t = _tile("CACHE & PLUGINS")
    t.append(
        f"prefix-cache hit rate {fmt.percent(snap.prefix_cache_hit_rate)}"
        f"  ({snap.prefix_cache_hits}/{snap.prefix_cache_queries} tokens, "
        f"{snap.num_cached_blocks} cached blocks)\n"
    )
    for label, value in describe_extras(snap):
        t.append(f"{label}: {value}\n")
    out["plugins"] = t
    return out


class StatsPane(VerticalScroll):
    DEFAULT_CSS = """
    StatsPane Grid { grid-size: 2; grid-gutter: 1 2; height: auto; padding: 0 1; }
    StatsPane Static { height: auto; border: round $primary-darken-2; padding: 0 1; }
    """
    TILES = ("requests", "throughput", "ttft", "memory", "plugins")

    def compose(self):
        with Grid():
            for tile in self.TILES:
                yield Static(id=f"tile-{tile}")

    def show(self, snap: EngineSnapshot | None, rates: RateTracker) -> None:
        texts = stats_texts(snap, rates)
        for tile in self.TILES:
            widget = self.query_one(f"#tile-{tile}", Static)
            widget.display = tile in texts
            if tile in texts:
                widget.update(texts[tile])

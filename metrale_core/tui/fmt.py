"""Text formatting for the dashboard: durations, sizes, rates, bars, sparklines, histograms.

Owner: the dashboard panes.  Pure functions, no Textual import, so they are unit-testable.

Invariants:
- Every function returns plain text of a predictable width (bars and sparklines are exactly
  ``width`` cells); ``None`` inputs render as ``"—"``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TTFT_BUCKETS", "bar", "duration", "histogram", "human_bytes", "percent", "sparkline", "ttft_ms", "uptime"]

DASH = "—"
_SPARK = "▁▂▃▄▅▆▇█"
#: Upper bounds (seconds) of the TTFT histogram buckets; the last bucket is open-ended.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def uptime(seconds: float) -> str:
    """``up 0:01:05``; past a day ``up 1d 02:03``."""
    s = int(max(0, seconds))
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"up {days}d {hours:02d}:{minutes:02d}"
    return f"up {hours}:{minutes:02d}:{secs:02d}"


def duration(seconds: float | None) -> str:
    """``0.4s``, ``12s``, ``3m05s``."""
    if seconds is None:
        return DASH
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def human_bytes(n: float | None) -> str:
    if n is None:
        return DASH
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} GB"  # pragma: no cover - loop always returns


def percent(fraction: float | None) -> str:
    return DASH if fraction is None else f"{100 * fraction:.1f}%"


def ttft_ms(seconds: float | None) -> str:
    return DASH if seconds is None else f"{1000 * seconds:.0f} ms"


def bar(fraction: float, width: int) -> str:
    """A ``width``-cell bar: ``█`` filled, ``░`` empty."""
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    return "█" * filled + "░" * (width - filled)


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as block characters, scaled to their max; left-padded."""
    data = list(values)[-width:]
    top = max(data, default=0.0)
    cells = []
    for v in data:
        if top <= 0 or v <= 0:
            cells.append(_SPARK[0])
        else:
            cells.append(_SPARK[min(len(_SPARK) - 1, int(v / top * (len(_SPARK) - 1) + 0.5))])
    return " " * (width - len(cells)) + "".join(cells)


def bucket_labels() -> list[str]:
    labels = []
    for bound in TTFT_BUCKETS:
        labels.append(f"<{bound * 1000:.0f}ms" if bound < 1 else f"<{bound:g}s")
    labels.append(f"≥{TTFT_BUCKETS[-1]:g}s")
    return labels


def histogram(samples: Sequence[float]) -> list[tuple[str, int]]:
    """Counts of ``samples`` per TTFT bucket, as ``(label, count)``."""
    counts = [0] * (len(TTFT_BUCKETS) + 1)
    for s in samples:
        for i, bound in enumerate(TTFT_BUCKETS):
            if s < bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    return list(zip(bucket_labels(), counts))

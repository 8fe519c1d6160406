"""The FP8 KV scale source as a dashboard line (the ``fp8_scale_source`` snapshot extra).

Owner: ``metrale_fp8``; ``metrale_engine_started`` attaches :func:`scale_source_summary` as an
extras provider of every engine whose KV cache is FP8, and the stats tab of ``met serve``'s
dashboard shows it as "FP8 scale source: ...".

Invariants: the line is derived from what the codec uses per layer (``codec.sources``, the open
calibration windows), not from the start-up classification, so it tracks calibration freezing;
it reads Python lists only (no device work), so it is cheap enough for every step's publish.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from metrale_fp8.build import describe_sources
from metrale_fp8.metrics import fp8_codec_of

__all__ = ["EXTRA_LABEL", "EXTRA_NAME", "attach", "scale_source_summary"]

#: The snapshot extra, shown on the dashboard as :data:`EXTRA_LABEL`.
EXTRA_NAME = "fp8_scale_source"
EXTRA_LABEL = "FP8 scale source"


def scale_source_summary(codec: Any) -> str:
    """One line: where the K/V scales of ``codec``'s layers come from right now.

    ``calibration (256 tok, frozen) on 30/30 layers``, ``checkpoint on 30/30 layers``,
    ``partial: checkpoint on 12/30 layers, 1.0 on 18 (checkpoint: 0-11; unit: 12-29)`` or
    ``unscaled: 1.0 on 30/30 layers``.
    """
    sources = list(codec.sources)
    total = len(sources)
    counts = Counter(sources)
    if counts["calibration"]:
        still_open = codec.num_open_windows
        state = "frozen" if still_open == 0 else f"{still_open} open"
        return f"calibration ({codec.calibration_tokens} tok, {state}) on {counts['calibration']}/{total} layers"
    if counts["checkpoint"] == total:
        return f"checkpoint on {total}/{total} layers"
    if counts["checkpoint"]:
        return (
            f"partial: checkpoint on {counts['checkpoint']}/{total} layers, "
            f"1.0 on {total - counts['checkpoint']} ({describe_sources(sources)})"
        )
    return f"unscaled: 1.0 on {total}/{total} layers"


def attach(engine: Any) -> bool:
    """Publish the summary of ``engine``'s FP8 codec at every step; False (nothing attached)
    when its KV cache is not FP8."""
    codec = fp8_codec_of(engine)
    if codec is None:
        return False
    engine.snapshots.add_extras_provider(EXTRA_NAME, lambda: scale_source_summary(codec), label=EXTRA_LABEL)
    return True

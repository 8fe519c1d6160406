"""2026-09-25: B1 margin observer: counts low top-1/top-2 logit gaps inside tool parameter bodies.

The engine's ``LogitPipeline`` runs it only for final-decode positions
(``LogitProcessorSpec.kinds = {PositionKind.FINAL_DECODE}``): plain decode rows, and under
speculative decoding each committed position of a verify chunk (the verifier re-runs the
``FINAL_DECODE`` stages per committed token), so verify positions that may be rejected are not
counted.  ``PREFILL_LAST`` is not observed either: the stream parser has been fed no generated
text yet when the first output token is sampled, so it can never be inside a body with emitted
characters (a preempted sequence re-prefilled by recompute samples at ``FINAL_DECODE``).

Where it sits: order :data:`metrale_b1.ORDER` (150), after the masking processors (default
order 100) and before plugin penalties (metrale-dry at 200) and the core's penalties and
``logit_bias``, which ``LogitPipeline.adjusted_logits`` applies after every processor.  So it
sees masked, unpenalised logits before temperature.

Owner: scheduler (the engine's logit pipeline calls :class:`B1MarginObserver` once per step).
Invariants:
- ``__call__`` never writes ``logits`` (the pipeline checks torch's version counter; tests
  compare bit for bit).
- A position counts iff its sequence's stream parser (``row.extras["stream_parser"]``) is inside
  a parameter body that has already emitted characters, outside reasoning, and the gap of the
  row's two largest logits is below :data:`LOW_MARGIN_THRESHOLD`.  NaN gaps never count.
- One batched top-2 scan (:class:`metrale_b1.top2.Top2`) per step over the rows inside a body;
  Python loops run only over the counted rows (one trace line and one ``bump`` each).
- The count is per engine: each observer (one per engine's pipeline) owns its :class:`B1Stats`;
  ``/metrics`` and the dashboard read the observer of the engine they serve
  (:func:`observer_of`).  There is no process-wide counter.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from attrs import define, field
from loguru import logger

__all__ = [
    "B1_SUMMARY_PERIOD",
    "DRIFT_WARNING",
    "LOW_MARGIN_THRESHOLD",
    "B1MarginObserver",
    "B1Stats",
    "in_body",
    "low_margin_count",
    "make_observer",
    "observer_of",
    "record_low_margin",
]

#: The ``LogitProcessorSpec`` name (also ``metrale_b1.NAME``).
PROCESSOR_NAME = "b1-margin"

#: 2026-09-25: One warn line per this many low-margin positions.
B1_SUMMARY_PERIOD = 100
#: 2026-09-25: A top-1 minus top-2 logit gap below this is "low margin". The logit gap equals
#: the logprob gap.
LOW_MARGIN_THRESHOLD = 1.5
#: The warn line, seed 000 wording (``{}`` is the running count).
DRIFT_WARNING = (
    "B1 drift gauge: {} low-margin (<1.5 logprobs) decode positions observed inside "
    "parameter bodies. FP8 numerical noise is in the argmax-flip regime — consider "
    "reviewing tool-arg outputs for whitespace / digit-collapse drift."
)


@define
class B1Stats:
    """The low-margin counter of one engine (the seed's ``b1_low_margin``); only grows."""

    b1_low_margin: int = 0
    _lock: threading.Lock = field(factory=threading.Lock, repr=False, eq=False)

    def bump(self, n: int = 1) -> int:
        """Atomically add ``n``; returns the value before (the seed's ``bump``)."""
        with self._lock:
            before = self.b1_low_margin
            self.b1_low_margin = before + n
        return before


def record_low_margin(margin: float, top1: int, top2: int, stats: B1Stats) -> int:
    """Count one low-margin position in ``stats.b1_low_margin``; returns the new count."""
    n = stats.bump() + 1
    # 2026-09-25: One trace line per low-margin position; the logger name is this module's,
    # ``metrale_b1.b1_margin``.
    logger.trace("B1 low margin: gap={:.3f} top1={} top2={}", margin, top1, top2)
    if n % B1_SUMMARY_PERIOD == 0:
        logger.warning(DRIFT_WARNING, n)
    return n


def in_body(row: Any) -> bool:
    """True when ``row``'s stream parser is inside a parameter body that emitted characters."""
    parser = row.extras.get("stream_parser")
    return (
        parser is not None
        and bool(getattr(parser, "inside_parameter_body", False))
        and getattr(parser, "param_body_chars_emitted", 0) > 0
        and not getattr(parser, "in_reasoning", False)
    )


class B1MarginObserver:
    """The read-only ``b1-margin`` logit processor (see the module docstring)."""

    def __init__(self, stats: B1Stats | None = None) -> None:
        #: Where ``b1_low_margin`` is counted: this observer's own (so its engine's) counter.
        self.stats = stats if stats is not None else B1Stats()
        self._ops: dict[torch.device, Any] = {}

    def top2(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, indices)``, each ``[N, 2]``: the two largest logits of every row."""
        op = self._ops.get(logits.device)
        if op is None:  # built once per device; on CUDA this compiles kernels/top2.cu
            from metrale_b1.top2 import Top2

            op = self._ops[logits.device] = Top2(logits.device)
        return op(logits)

    def __call__(self, logits: torch.Tensor, ctx: Any) -> None:
        # 2026-09-25: the parser state lives in Python objects, so eligibility is one attribute
        # read per row; no tensor work at all in a step without a row inside a body.
        selected = [j for j, row in enumerate(ctx.rows) if in_body(row)]
        if not selected:
            return None
        rows = (
            logits
            if len(selected) == logits.shape[0]
            else logits.index_select(0, torch.tensor(selected, device=logits.device))
        )
        # 2026-09-25: One scan for top-1 and top-2 of every selected row, before penalties and bias.
        values, ids = self.top2(rows)
        margins = values[:, 0] - values[:, 1]
        low = (margins < LOW_MARGIN_THRESHOLD).nonzero().flatten()  # NaN < x is False
        if low.numel() == 0:
            return None
        found = zip(margins[low].tolist(), ids[low].tolist())
        for margin, (top1, top2) in found:
            record_low_margin(margin, top1, top2, self.stats)
        return None


def observer_of(engine: Any) -> B1MarginObserver | None:
    """The observer in ``engine``'s logit pipeline, or None when it runs none."""
    pipeline = getattr(getattr(engine, "output_processor", None), "pipeline", None)
    if pipeline is None:
        return None
    found = pipeline.processor(PROCESSOR_NAME)
    return found if isinstance(found, B1MarginObserver) else None


def low_margin_count(engine: Any) -> int:
    """``engine``'s ``b1_low_margin`` count (what ``/metrics`` and the dashboard show); 0 when the
    engine runs no observer."""
    observer = observer_of(engine)
    return 0 if observer is None else observer.stats.b1_low_margin


def make_observer(config: Any) -> B1MarginObserver | None:
    """``LogitProcessorSpec.factory``: the observer, or None when ``--b1-observer off``."""
    options = getattr(config, "plugin_options", None) or {}
    setting = options.get("b1_observer", "on")
    if setting in ("off", False, 0, "0", "false"):
        return None
    return B1MarginObserver()

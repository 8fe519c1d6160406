"""The statistics of ``met bench``: percentiles, per-request latencies and one load level's figures.

Owner: :mod:`metrale_core.bench.serve` and :mod:`metrale_core.bench.engine` (and the scripts
under ``bench/``).  Pure functions of the recorded times: no clock is read here, so the tests
give them known event times.

Definitions (those of ``vllm bench serve``):
- TTFT: request sent -> first event with text.
- E2E: request sent -> the response's end.
- ITL: the gaps between consecutive events with text, per *event* (an event may carry several
  tokens: ``met serve`` merges a stream's tokens every ``--stream-interval-ms``, 20 ms by default).
- TPOT: ``(E2E - TTFT) / (output tokens - 1)``, per output *token*.

Invariants:
- :func:`percentile` interpolates linearly between the closest ranks (numpy's default); the
  percentiles of an empty list are NaN, never an exception.
- Every time in a :func:`summary` is in milliseconds; rates are per second of the level's
  wall time (first request sent -> last response ended).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PERCENTILES",
    "RequestRecord",
    "inter_event_gaps",
    "level_figures",
    "mean_sd",
    "percentile",
    "summary",
]

NAN = float("nan")
#: The percentiles every latency summary reports.
PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear between closest ranks; NaN if empty."""
    if not values:
        return NAN
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(seconds: Sequence[float]) -> dict[str, float]:
    """``mean`` and ``p50`` / ``p90`` / ``p99`` of ``seconds``, in milliseconds (NaN if empty)."""
    ms = [s * 1000 for s in seconds]
    out = {"mean": statistics.fmean(ms) if ms else NAN}
    out.update({f"p{q}": percentile(ms, q) for q in PERCENTILES})
    return out


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value; NaN, NaN if empty)."""
    if not values:
        return NAN, NAN
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def inter_event_gaps(event_times: Sequence[float]) -> list[float]:
    """The gaps between consecutive event times (one fewer than the events)."""
    return [b - a for a, b in itertools.pairwise(event_times)]


@dataclass
class RequestRecord:
    """One benchmark request: its times (``time.perf_counter`` seconds) and what it produced.

    ``output_tokens`` / ``prompt_tokens`` come from the stream's ``usage`` where the server sent
    one (``tokens_from == "usage"``), else the output is the count of events with text."""

    sent: float
    event_times: list[float] = field(default_factory=list)
    done: float = NAN
    output_tokens: int = 0
    prompt_tokens: int | None = None
    tokens_from: str = "events"
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float:
        return self.event_times[0] - self.sent if self.event_times else NAN

    @property
    def e2e(self) -> float:
        return self.done - self.sent

    @property
    def tpot(self) -> float:
        """Seconds per output token after the first; NaN with fewer than 2 tokens."""
        if self.output_tokens < 2 or not self.event_times:
            return NAN
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @classmethod
    def from_usage(
        cls, sent: float, event_times: list[float], done: float, usage: dict[str, Any] | None
    ) -> RequestRecord:
        """A successful request's record; tokens from ``usage`` when it has them."""
        if usage and isinstance(usage.get("completion_tokens"), int):
            return cls(sent, list(event_times), done, usage["completion_tokens"], usage.get("prompt_tokens"), "usage")
        return cls(sent, list(event_times), done, len(event_times))


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if v == v]


def level_figures(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """One load level's figures: request counts, rates over its wall time and latency summaries.

    The wall time spans the first request sent to the last response ended, failures included."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    ends = _finite([r.done for r in records])
    duration = (max(ends) - min(r.sent for r in records)) if ends and records else NAN
    output = sum(r.output_tokens for r in ok)
    prompt_known = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    prompt = sum(prompt_known) if len(prompt_known) == len(ok) and ok else None
    events = sum(len(r.event_times) for r in ok)
    rate = (lambda n: n / duration) if duration and duration > 0 else (lambda n: NAN)
    sources = sorted({r.tokens_from for r in ok})
    return {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({r.error for r in failed if r.error})[:5],
        "duration_s": duration,
        "output_tokens": output,
        "prompt_tokens": prompt,
        "output_tokens_from": sources[0] if len(sources) == 1 else ",".join(sources) or None,
        "events": events,
        "tokens_per_event": output / events if events else NAN,
        "request_throughput": rate(len(ok)),
        "output_throughput": rate(output),
        "total_token_throughput": rate(output + prompt) if prompt is not None else NAN,
        "ttft_ms": summary(_finite([r.ttft for r in ok])),
        "tpot_ms": summary(_finite([r.tpot for r in ok])),
        "itl_ms": summary([gap for r in ok for gap in inter_event_gaps(r.event_times)]),
        "e2e_ms": summary(_finite([r.e2e for r in ok])),
    }

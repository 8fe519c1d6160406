"""Process-wide counters of the structured-output plugin (Prometheus and dashboard read them).

Owner: the compiler and the processor write; ``metrale_metrics`` and the ``structured`` snapshot
extra read.  Invariants: plain numbers updated by one thread at a time (the engine thread, or the
processor's mask worker while the engine thread waits for the forward: requests, masks; server
thread: compiles); readers accept a value one step stale.
"""

from __future__ import annotations

from attrs import define, field

__all__ = ["STATS", "StructuredStats"]


@define
class StructuredStats:
    #: Constrained sequences the processor has started to mask.
    requests: int = 0
    #: Steps with at least one constrained row, and the seconds the engine thread spent in the
    #: processor (waiting for the mask, or filling it, then applying it).
    mask_steps: int = 0
    mask_seconds: float = 0.0
    mask_max_s: float = 0.0
    #: Seconds spent building masks on any thread (the worker's share overlaps the forward), and
    #: the steps whose mask was built during the forward pass.
    fill_seconds: float = 0.0
    prepared_steps: int = 0
    #: Grammars compiled (cache misses), cache hits, and each compile's seconds (bounded list).
    compiled: int = 0
    cache_hits: int = 0
    compile_seconds: list = field(factory=list)
    compile_total_s: float = 0.0
    #: Seconds spent building llguidance tokenizers (once per model).
    tokenizer_setup_s: float = 0.0
    #: Rows whose matcher failed mid-generation (forced to end).
    matcher_errors: int = 0

    def record_mask(self, seconds: float) -> None:
        self.mask_steps += 1
        self.mask_seconds += seconds
        self.mask_max_s = max(self.mask_max_s, seconds)

    def record_compile(self, seconds: float) -> None:
        self.compiled += 1
        self.compile_total_s += seconds
        self.compile_seconds.append(seconds)
        if len(self.compile_seconds) > 4096:
            del self.compile_seconds[:2048]

    def snapshot(self) -> dict:
        """The dashboard's ``structured`` extra."""
        mean_ms = 1e3 * self.mask_seconds / self.mask_steps if self.mask_steps else 0.0
        return {
            "requests": self.requests,
            "mask_ms_mean": round(mean_ms, 3),
            "mask_ms_max": round(1e3 * self.mask_max_s, 3),
            "prepared_steps": self.prepared_steps,
            "compiled": self.compiled,
            "cache_hits": self.cache_hits,
        }


STATS = StructuredStats()

"""``SpecStats``: the speculative-decoding counters of one engine.

Owner: the ``GatedSpeculator`` bumps the draft counters after each step; ``/metrics``
(``metrale_metrics``) reads :meth:`SpecStats.snapshot`, the dashboard :meth:`SpecStats.summary`
(the ``speculative`` snapshot extra).  (The B1 drift gauge ``b1_low_margin`` lives in
``metrale_b1``'s own per-engine ``B1Stats``.)

Invariants:
- One ``SpecStats`` per speculator, so per engine (each engine builds its speculator once): two
  engines in one process count separately; there is no process-wide instance.
- Every counter only grows; :func:`bump` is atomic (one lock per ``SpecStats``), so the engine
  thread and observers may bump while the server thread reads.
- ``accepted_per_position[i] <= proposed_per_position[i]`` and ``drafts_accepted <=
  drafts_proposed``: a position counts as proposed only when it was verified.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from attrs import define, field

__all__ = ["COUNTERS", "SpecStats", "bump", "describe_summary"]

#: Scalar counters, in export order.
COUNTERS = ("num_verifies", "drafts_proposed", "drafts_accepted", "tokens_emitted", "gate_switches")


@define
class SpecStats:
    """Thread-safe counters of one engine (see the module docstring)."""

    #: Verify chunks run.
    num_verifies: int = 0
    #: Draft tokens verified.
    drafts_proposed: int = 0
    #: Draft tokens accepted.
    drafts_accepted: int = 0
    #: Tokens committed by verify chunks (accepted drafts plus recovered / bonus tokens).
    tokens_emitted: int = 0
    #: Times the gate turned speculation off or on for a batch-width bucket.
    gate_switches: int = 0
    #: Per draft position i (0-based): verifies that reached / accepted draft i+1.
    proposed_per_position: list[int] = field(factory=list)
    accepted_per_position: list[int] = field(factory=list)
    _lock: threading.Lock = field(factory=threading.Lock, repr=False, eq=False)

    def record_verify(self, num_proposed: int, num_accepted: int, num_emitted: int) -> None:
        """Count one verify chunk: ``num_proposed`` drafts, the first ``num_accepted`` accepted."""
        with self._lock:
            self.num_verifies += 1
            self.drafts_proposed += num_proposed
            self.drafts_accepted += num_accepted
            self.tokens_emitted += num_emitted
            for counts, n in ((self.proposed_per_position, num_proposed), (self.accepted_per_position, num_accepted)):
                if len(counts) < num_proposed:  # both lists as long as the longest draft
                    counts.extend([0] * (num_proposed - len(counts)))
                for i in range(n):
                    counts[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (0 before any verify)."""
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else 0.0

    @property
    def acceptance_length(self) -> float:
        """Mean tokens committed per verify chunk (accepted drafts + 1, less stops mid-draft)."""
        return self.tokens_emitted / self.num_verifies if self.num_verifies else 0.0

    def snapshot(self) -> dict:
        """A consistent copy of every counter plus the derived rates."""
        with self._lock:
            out = {name: getattr(self, name) for name in COUNTERS}
            out["proposed_per_position"] = list(self.proposed_per_position)
            out["accepted_per_position"] = list(self.accepted_per_position)
        out["acceptance_rate"] = out["drafts_accepted"] / out["drafts_proposed"] if out["drafts_proposed"] else 0.0
        out["acceptance_length"] = out["tokens_emitted"] / out["num_verifies"] if out["num_verifies"] else 0.0
        return out

    def summary(self) -> dict:
        """The dashboard's ``speculative`` extra: acceptance rate and length plus the counts."""
        snap = self.snapshot()
        return {
            name: snap[name]
            for name in ("acceptance_rate", "acceptance_length", "drafts_accepted", "drafts_proposed", "num_verifies")
        }

    def metrics(self, prefix: str = "metrale:spec_decode_") -> dict[str, float]:
        """Flat ``{name: value}`` for ``/metrics`` (per-position counters get an index suffix)."""
        snap = self.snapshot()
        out = {f"{prefix}{name}": float(snap[name]) for name in COUNTERS}
        out[f"{prefix}acceptance_length"] = snap["acceptance_length"]
        out[f"{prefix}acceptance_rate"] = snap["acceptance_rate"]
        for i, n in enumerate(snap["accepted_per_position"]):
            out[f"{prefix}num_accepted_tokens_pos{i}"] = float(n)
        return out


def describe_summary(summary: Any) -> str:
    """The dashboard line of :meth:`SpecStats.summary`: ``acceptance 75.0%, 2.50 tok/verify``."""
    rate = summary.get("acceptance_rate") if isinstance(summary, Mapping) else summary
    if not isinstance(rate, (int, float)):
        return str(summary)
    length = summary.get("acceptance_length") if isinstance(summary, Mapping) else None
    per_verify = f", {length:.2f} tok/verify" if isinstance(length, (int, float)) else ""
    return f"acceptance {100 * float(rate):.1f}%{per_verify}"


def bump(stats: SpecStats, counter: str, n: int = 1) -> int:
    """Atomically add ``n`` to ``stats.<counter>``; returns the value before (seed 000's ``bump``)."""
    if counter not in COUNTERS:
        raise ValueError(f"unknown SpecStats counter {counter!r}; known: {', '.join(COUNTERS)}")
    with stats._lock:
        before = getattr(stats, counter)
        setattr(stats, counter, before + n)
    return before

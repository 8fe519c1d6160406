"""``GatedSpeculator``: a proposer behind the throughput gate, counting into ``SpecStats``.

Owner: every proposer factory in this plugin returns one; the engine sees only the core
``Speculator`` contract (``metrale_core.engine.speculation``): ``propose`` before a step,
``observe`` after it.

Invariants:
- The gate decides per step for the whole batch width; a step the gate keeps plain asks the
  proposer for nothing (its ``observe`` still runs, so stateful proposers stay in sync).
- ``k`` (``--num-draft-tokens``) caps every draft on top of the engine's per-sequence caps.
- Stats count only verified drafts (the engine's ``VerifyOutcome`` records).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any, Protocol

from loguru import logger

from metrale_core.api import Draft, StepReport
from metrale_speculative.gate import SpecGate
from metrale_speculative.spec_stats import SpecStats, bump

__all__ = ["GatedSpeculator", "Proposer"]


class Proposer(Protocol):
    """A draft source inside this plugin."""

    def propose(self, seqs: Seq[Any], max_drafts: Seq[int]) -> list[Draft | None]: ...

    def observe(self, report: StepReport) -> None: ...


class GatedSpeculator:
    """Implements the engine's ``Speculator`` around one :class:`Proposer`."""

    def __init__(
        self, proposer: Proposer, k: int, *, gate: SpecGate | None = None, stats: SpecStats | None = None
    ) -> None:
        if k < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {k}")
        self.proposer = proposer
        self.k = k
        self.gate = gate if gate is not None else SpecGate()
        self.stats = stats if stats is not None else SpecStats()
        self.wants_hidden = bool(getattr(proposer, "wants_hidden", False))
        self._last_speculative: bool | None = None

    def __repr__(self) -> str:
        return f"GatedSpeculator({type(self.proposer).__name__}, k={self.k})"

    def propose(self, seqs: Seq[Any], max_drafts: Seq[int]) -> list[Draft | None]:
        speculate = self.gate.should_speculate(len(seqs))
        self._last_speculative = speculate
        if not speculate:
            return [None] * len(seqs)
        return self.proposer.propose(seqs, [min(self.k, m) for m in max_drafts])

    def observe(self, report: StepReport) -> None:
        for o in report.outcomes:
            self.stats.record_verify(o.num_proposed, o.num_accepted, o.num_emitted)
        if report.num_decode_seqs and not report.num_prefill_tokens and self._last_speculative is not None:
            before = self.gate.switches
            self.gate.record(report.num_decode_seqs, self._last_speculative, report.num_emitted, report.duration_s)
            if self.gate.switches != before:
                bump(self.stats, "gate_switches", self.gate.switches - before)
                logger.info("speculation gate: batch-width buckets now {}", self.gate.describe())
        self._last_speculative = None
        self.proposer.observe(report)

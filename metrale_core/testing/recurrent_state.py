"""The recording fake's recurrent state (seed 004), on when ``recurrent_fed_rows`` is set.

A stand-in for a model (GLM-5.3's KDA layers) whose per-sequence state advances with every token
it consumes and cannot be rewound by lowering the sequence length.

Each sequence remembers the next position its state expects.  A forward that consumes positions
starting anywhere else (a step re-run, or a continuing row fed twice) corrupts the state for good,
and every later output of that sequence is ``GARBAGE``, so a client stream shows it.  A prefill
from position 0 starts fresh state.

Owner: ``RecordingModel`` (metrale_core.testing.recording_model) calls :meth:`consume` once per
sequence per forward.
Invariants: with the option off, nothing is tracked and every forward is clean; the state is
keyed by the request (its first prompt token), not by the slot, so a swapped-out sequence comes
back to its own state.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import define, field

__all__ = ["RecurrentTracker"]


@define
class RecurrentTracker:
    """Per-key ``(next expected position, corrupted)`` exactly as seed 004 keeps it."""

    enabled: bool
    #: Where "consumed again" lines go (the model's recorder).
    record: Callable[[str], None]
    states: dict[int, tuple[int, bool]] = field(factory=dict)

    def consume(self, key: int, start: int, length: int) -> bool:
        """Consume positions ``start .. start + length`` of sequence ``key``.

        Returns ``False`` once the state is corrupted.  A ``start`` of 0 begins fresh state.
        """
        if not self.enabled:
            return True
        expected, corrupted = self.states.get(key, (0, False))
        if start == 0:
            expected, corrupted = 0, False
        reused = expected if (expected != start and not corrupted) else None
        corrupted = corrupted or reused is not None
        self.states[key] = (start + length, corrupted)
        if reused is not None:
            self.record(f"recurrent state of s{key} consumed again at {start} (expected {reused})")
        return not corrupted

    def rollback(self, key: int, position: int) -> None:
        """Speculative verify commit: the state is back to "consumed up to ``position``" (the
        model restored a per-row snapshot); a corrupted state stays corrupted."""
        if self.enabled and key in self.states:
            expected, corrupted = self.states[key]
            if position > expected:
                raise ValueError(f"s{key}: cannot roll forward to {position} (state at {expected})")
            self.states[key] = (position, corrupted)

    def corrupt(self, key: int) -> None:
        """Mark ``key``'s state corrupted for good (a slot bug seen by the model)."""
        if self.enabled:
            expected, _ = self.states.get(key, (0, False))
            self.states[key] = (expected, True)

    def is_clean(self, key: int) -> bool:
        """True when ``key``'s state is not corrupted (always True with the option off)."""
        return not self.enabled or not self.states.get(key, (0, False))[1]

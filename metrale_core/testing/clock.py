"""``FakeClock``: a monotonic clock that only moves when a test says so.

Owner: tests (and plugin tests) pass one as ``EngineConfig.clock`` so timeouts are reproducible.
Invariants: ``now`` never goes backwards; ``advance`` rejects negative steps.
"""

from __future__ import annotations

from attrs import define, field

__all__ = ["FakeClock"]


@define
class FakeClock:
    """A callable clock: ``clock()`` returns the current fake time in seconds."""

    now: float = field(default=0.0)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (>= 0) and return the new time."""
        if seconds < 0:
            raise ValueError(f"FakeClock.advance needs seconds >= 0, got {seconds!r}")
        self.now += seconds
        return self.now

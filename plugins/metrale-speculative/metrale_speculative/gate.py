"""``SpecGate``: turn speculation off for a batch width when it delivers less than plain decode.

Owner: the ``GatedSpeculator`` asks :meth:`SpecGate.should_speculate` before each step and
feeds every clean decode step back through :meth:`SpecGate.record`.  Modelled on the Rust
engine's MTP gate (``crates/speculative/src/mtp_gate.rs``, reference metrale.md §4):

- Measure *delivered* tok/s (tokens committed / step wall time, drafting included) separately
  for speculative and plain steps, per batch-width bucket (powers of two), over windows of
  ``window_steps`` steps; each window updates an EWMA (``alpha``) of the rate and of its relative
  deviation.
- In speculative mode, after each speculative window: a *loss* is a rate below the plain
  estimate by more than ``max(min_margin, (dev_spec + dev_plain) / 2)``; ``dwell`` consecutive
  losses switch the bucket to plain.  Without a plain estimate (or when it is older than
  ``refresh_tokens`` tokens) one plain window is measured first.
- In plain mode, every ``reprobe_tokens`` tokens one speculative probe window runs; a probe that
  does not lose switches the bucket back to speculative.

Invariants:
- With ``force=True`` the gate always speculates (``--mtp-gate force``).
- Steps of zero duration (a frozen test clock) or with prefill rows are not measurements.
- Deterministic: the gate reads no clock; durations come from the caller.
"""

from __future__ import annotations

from attrs import define, field

__all__ = ["BucketState", "SpecGate"]


def bucket_of(width: int) -> int:
    """Power-of-two bucket of a batch width: 1, 2-3, 4-7, 8-15, ..."""
    return max(1, width).bit_length()


@define
class _Ewma:
    rate: float | None = None
    dev: float = 0.0

    def update(self, value: float, alpha: float) -> None:
        if self.rate is None:
            self.rate = value
            return
        self.dev = (1 - alpha) * self.dev + alpha * abs(value - self.rate) / max(self.rate, 1e-12)
        self.rate = (1 - alpha) * self.rate + alpha * value


@define
class _Window:
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.seconds += seconds


@define
class BucketState:
    """The gate's view of one batch-width bucket."""

    #: "spec" or "plain".
    mode: str = "spec"
    #: The current window measures the other mode ("refresh" of plain / "probe" of spec) or not.
    measuring: str | None = None
    spec: _Ewma = field(factory=_Ewma)
    plain: _Ewma = field(factory=_Ewma)
    window: _Window = field(factory=_Window)
    losses: int = 0
    #: Tokens delivered since the plain estimate was refreshed / since speculation was switched
    #: off or last probed.
    tokens_since_plain: int = 0
    tokens_since_probe: int = 0


@define
class SpecGate:
    """Per-bucket speculative / plain decision (see the module docstring)."""

    window_steps: int = 16
    alpha: float = 0.3
    dwell: int = 2
    min_margin: float = 0.05
    reprobe_tokens: int = 256
    refresh_tokens: int = 1024
    force: bool = False
    #: Mode changes so far (both directions).
    switches: int = 0
    buckets: dict[int, BucketState] = field(factory=dict)

    def state(self, width: int) -> BucketState:
        return self.buckets.setdefault(bucket_of(width), BucketState())

    def should_speculate(self, width: int) -> bool:
        """Whether the next step at batch width ``width`` should run drafts."""
        if self.force:
            return True
        s = self.state(width)
        if s.measuring is None:
            if s.mode == "spec" and (s.plain.rate is None or s.tokens_since_plain >= self.refresh_tokens):
                s.measuring = "plain"
            elif s.mode == "plain" and s.tokens_since_probe >= self.reprobe_tokens:
                s.measuring = "spec"
        current = s.measuring or s.mode
        return current == "spec"

    def record(self, width: int, speculative: bool, tokens: int, seconds: float) -> None:
        """One decode step at ``width`` in the given mode delivered ``tokens`` in ``seconds``."""
        if self.force or seconds <= 0:
            return
        s = self.state(width)
        if speculative != ((s.measuring or s.mode) == "spec"):
            return  # the step ran under an older decision; not this window's mode
        s.tokens_since_plain += tokens
        s.tokens_since_probe += tokens
        s.window.add(tokens, seconds)
        if s.window.steps < self.window_steps:
            return
        rate = s.window.tokens / s.window.seconds
        s.window = _Window()
        (s.spec if speculative else s.plain).update(rate, self.alpha)
        if not speculative:
            s.tokens_since_plain = 0
        if s.measuring is not None:
            measured, s.measuring = s.measuring, None
            if measured == "spec":  # a probe in plain mode
                s.tokens_since_probe = 0
                if not self._loses(s):
                    self._switch(s, "spec")
            return
        if s.mode == "spec":
            s.losses = s.losses + 1 if self._loses(s) else 0
            if s.losses >= self.dwell:
                self._switch(s, "plain")

    def _loses(self, s: BucketState) -> bool:
        if s.plain.rate is None or s.spec.rate is None:
            return False
        margin = max(self.min_margin, 0.5 * (s.spec.dev + s.plain.dev))
        return s.spec.rate < s.plain.rate * (1.0 - margin)

    def _switch(self, s: BucketState, mode: str) -> None:
        s.mode, s.losses, s.tokens_since_probe = mode, 0, 0
        self.switches += 1

    def describe(self) -> dict[int, str]:
        """bucket -> mode, for logs and the dashboard."""
        return {b: s.mode for b, s in sorted(self.buckets.items())}

"""Unit tests: n-gram drafting, SpecStats counters, the throughput gate (fake clock), flags."""

from __future__ import annotations

import argparse
import threading

import pytest

from metrale_core.testing import FakeClock
from metrale_speculative import metrale_engine_flags
from metrale_speculative.gate import SpecGate, bucket_of
from metrale_speculative.ngram import ngram_draft
from metrale_speculative.spec_stats import SpecStats, bump


def test_spec_ngram_rule():
    assert ngram_draft([1, 2, 3, 4, 2, 3], 2, 3, 4) == (4, 2, 3)  # specs §4.4 example
    assert ngram_draft([1, 2, 3, 4, 2, 3], 2, 3, 1) == (4,)
    # the longest n wins over an earlier shorter match
    assert ngram_draft([7, 3, 9, 5, 3, 8, 5, 3], 1, 2, 2) == (8, 5)
    # earliest occurrence among equal-length matches
    assert ngram_draft([5, 1, 5, 2, 5], 1, 1, 1) == (1,)
    assert ngram_draft([1, 2, 3], 2, 3, 4) == ()
    assert ngram_draft([1], 1, 3, 4) == ()


def test_spec_stats_counters_and_bump_threads():
    stats = SpecStats()
    stats.record_verify(4, 2, 3)
    stats.record_verify(2, 2, 3)
    stats.record_verify(3, 0, 1)
    snap = stats.snapshot()
    assert snap["num_verifies"] == 3 and snap["drafts_proposed"] == 9 and snap["drafts_accepted"] == 4
    assert snap["proposed_per_position"] == [3, 3, 2, 1]
    assert snap["accepted_per_position"] == [2, 2, 0, 0]
    assert snap["acceptance_length"] == pytest.approx(7 / 3)
    assert snap["acceptance_rate"] == pytest.approx(4 / 9)
    metrics = stats.metrics()
    assert metrics["metrale:spec_decode_drafts_accepted"] == 4.0
    assert metrics["metrale:spec_decode_num_accepted_tokens_pos1"] == 2.0

    def worker():
        for _ in range(2000):
            bump(stats, "gate_switches")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.gate_switches == 8000
    assert bump(stats, "gate_switches", 5) == 8000 and stats.gate_switches == 8005
    with pytest.raises(ValueError, match="unknown SpecStats counter"):
        bump(stats, "nope")


def _drive(gate: SpecGate, clock: FakeClock, width: int, steps: int, spec_rate: float, plain_rate: float) -> list[bool]:
    """Run ``steps`` decode steps; each delivers ``width`` tokens (plain) or ``2*width``
    (speculative) in the time the given rate implies, advancing the fake clock."""
    decisions = []
    for _ in range(steps):
        speculate = gate.should_speculate(width)
        decisions.append(speculate)
        tokens = 2 * width if speculate else width
        start = clock()
        clock.advance(tokens / (spec_rate if speculate else plain_rate))
        gate.record(width, speculate, tokens, clock() - start)
    return decisions


def test_spec_gate_switches_off_and_reprobes():
    clock = FakeClock()
    gate = SpecGate(window_steps=4, dwell=2, reprobe_tokens=64, refresh_tokens=10_000)
    # speculation wins at width 1: stays on after the first plain measurement window
    d = _drive(gate, clock, 1, 40, spec_rate=200.0, plain_rate=100.0)
    assert d[:4] == [False] * 4 and all(d[4:])
    assert gate.state(1).mode == "spec" and gate.switches == 0
    # at width 8 speculation loses: after the plain window and 2 losing windows it turns off
    d = _drive(gate, clock, 8, 12, spec_rate=50.0, plain_rate=100.0)
    assert d == [False] * 4 + [True] * 8
    assert gate.state(8).mode == "plain" and gate.switches == 1
    # off: plain steps until 64 tokens went by, then one probe window; still losing -> stays off
    d = _drive(gate, clock, 8, 12, spec_rate=50.0, plain_rate=100.0)
    assert d[:8] == [False] * 8 and d[8:12] == [True] * 4
    assert gate.state(8).mode == "plain"
    # the workload changes and speculation wins again: the next probe turns it back on
    d = _drive(gate, clock, 8, 40, spec_rate=400.0, plain_rate=100.0)
    assert gate.state(8).mode == "spec" and gate.switches == 2
    assert d[-1] is True
    # width 1 was never disturbed (buckets are independent)
    assert gate.state(1).mode == "spec"
    assert bucket_of(1) != bucket_of(8) == bucket_of(15)


def test_spec_gate_force_and_zero_durations():
    gate = SpecGate(force=True, window_steps=1)
    gate.record(4, True, 4, 1.0)
    assert gate.should_speculate(4) and gate.buckets == {}
    gate = SpecGate(window_steps=1)
    gate.should_speculate(2)
    gate.record(2, False, 2, 0.0)  # a frozen clock measures nothing
    assert gate.state(2).plain.rate is None


def test_spec_flags():
    parser = argparse.ArgumentParser()
    metrale_engine_flags(parser)
    args = parser.parse_args(
        ["--speculative", "ngram", "--num-draft-tokens", "3", "--draft-model", "/x", "--spec-gate", "force"]
    )
    assert (args.speculative, args.num_draft_tokens, args.draft_model, args.spec_gate) == ("ngram", 3, "/x", "force")
    assert parser.parse_args([]).speculative is None

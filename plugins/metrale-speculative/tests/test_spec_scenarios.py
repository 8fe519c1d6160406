"""Recording-fake scenarios of speculative verify, with golden traces.

A scripted proposer drafts each sequence's scripted continuation (so the fake model's answers
accept it) with deliberate mistakes and skipped steps; every scenario must give exactly the
client streams of the same scenario without speculation, leave no model error, and match its
golden trace (``--update-goldens`` rewrites them).
"""

from __future__ import annotations

import pytest

from metrale_core.engine.speculation import Draft
from metrale_core.testing import Abort, Arrive, Scenario, run_scenario
from metrale_core.testing.recording_model import SeqScript
from metrale_speculative.gate import SpecGate
from metrale_speculative.speculator import GatedSpeculator

WRONG = 3  # a token no script below uses


class ScriptedProposer:
    """Drafts the script's next tokens; ``wrong[rid]`` output indices get ``WRONG`` instead and
    ``skip[rid]`` call numbers (0-based, per request) get no draft."""

    wants_hidden = False

    def __init__(self, events, wrong=None, skip=None) -> None:
        self.scripts = {e.request_id: SeqScript(e.prompt, e.output) for e in events if isinstance(e, Arrive)}
        self.wrong = wrong or {}
        self.skip = skip or {}
        self.calls: dict[str, int] = {}

    def propose(self, seqs, max_drafts):
        out = []
        for seq, k in zip(seqs, max_drafts):
            rid = seq.request_id
            call = self.calls.get(rid, 0)
            self.calls[rid] = call + 1
            script = self.scripts[rid]
            if call in self.skip.get(rid, ()) or k == 0:
                out.append(None)
                continue
            n = len(seq.output_ids)
            out.append(
                Draft(
                    [
                        WRONG if n + j in self.wrong.get(rid, ()) else script.token_at(seq.num_tokens + j, 2)
                        for j in range(k)
                    ]
                )
            )
        return out

    def observe(self, report) -> None:
        return None


def _scenario(name, events, k, *, wrong=None, skip=None, model=None):
    proposer = ScriptedProposer(events, wrong, skip)
    spec = GatedSpeculator(proposer, k, gate=SpecGate(force=True))
    return Scenario(name, events, model=model or {}, speculator=spec)


A = dict(prompt=(10, 11, 12), output=(20, 21, 22, 23, 24, 25, 26, 27, 28))
B = dict(prompt=(40, 41, 42, 43, 44), output=(50, 51, 52, 53, 54, 55))
C = dict(prompt=(30, 31), output=(33, 34, 35, 36, 37))

SCENARIOS = {
    "spec_verify_k2": lambda: _scenario("spec_verify_k2", [Arrive(0, "a", **A)], 2),
    "spec_verify_k3": lambda: _scenario("spec_verify_k3", [Arrive(0, "a", **A)], 3, wrong={"a": {5}}),
    # max_tokens ends the sequence in the middle of an accepted draft
    "spec_verify_k4": lambda: _scenario("spec_verify_k4", [Arrive(0, "a", max_tokens=7, **A)], 4),
    "spec_batched_verify": lambda: _scenario(
        "spec_batched_verify", [Arrive(0, "a", **A), Arrive(0, "b", **B), Arrive(2, "c", **C)], 3, wrong={"b": {3}}
    ),
    # 0, 1, 2 and 3 of 4 drafts accepted, then EOS inside a draft
    "spec_partial_accepts": lambda: _scenario(
        "spec_partial_accepts", [Arrive(0, "a", max_tokens=20, **A)], 4, wrong={"a": {1, 3, 6, 10}}
    ),
    # steps without a draft for one sequence while the other verifies (plain + verify rows)
    "spec_zero_draft_steps": lambda: _scenario(
        "spec_zero_draft_steps", [Arrive(0, "a", **A), Arrive(0, "b", **B)], 2, skip={"a": {0, 2, 3}, "b": {1}}
    ),
    "spec_cancel_during_verify": lambda: _scenario(
        "spec_cancel_during_verify", [Arrive(0, "a", **A), Arrive(0, "b", **B), Abort(3, "a")], 2
    ),
    # recurrent state: the engine must roll the state back to the kept rows (commit_verify)
    "spec_recurrent_verify": lambda: _scenario(
        "spec_recurrent_verify",
        [Arrive(0, "a", **A), Arrive(0, "b", **B)],
        3,
        wrong={"a": {2, 6}, "b": {4}},
        model={"recurrent_fed_rows": True},
    ),
    # attention windows (two KV groups): verify rows and rollbacks while the window's blocks slide
    "spec_window_verify": lambda: _scenario(
        "spec_window_verify",
        [Arrive(0, "a", **A), Arrive(0, "b", **B)],
        3,
        wrong={"a": {2, 6}, "b": {4}},
        model={"window": 3},
    ),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_spec_scenario(name, golden):
    scenario = SCENARIOS[name]()
    result = run_scenario(scenario)
    assert result.model.errors == []
    assert "consumed again" not in result.trace
    assert "GARBAGE" not in result.trace
    plain = run_scenario(Scenario(name, scenario.events, model=scenario.model))
    for rid, stream in result.streams.items():
        if stream.finish_reason == "abort":  # cut earlier or later: a prefix of the script
            script = scenario.speculator.proposer.scripts[rid].output
            assert tuple(stream.token_ids) == script[: len(stream.token_ids)]
        else:
            assert stream.render() == plain.streams[rid].render()
    stats = scenario.speculator.stats
    assert stats.num_verifies > 0
    assert result.steps < plain.steps  # verify commits several tokens per step
    golden(name, result.trace)


def test_spec_scenario_partial_accept_counts():
    scenario = SCENARIOS["spec_partial_accepts"]()
    run_scenario(scenario)
    stats = scenario.speculator.stats
    assert 0 < stats.drafts_accepted < stats.drafts_proposed
    assert stats.accepted_per_position[0] < stats.proposed_per_position[0]


def test_spec_forgotten_commit_corrupts_recurrent_state():
    """Without the engine's commit_verify, the fake's recurrent state is consumed again: the
    rollback really is what keeps the recurrent scenario clean."""
    from metrale_core.engine.runner import ModelRunner

    original = ModelRunner.commit_verify
    ModelRunner.commit_verify = lambda self, slots, kept: None
    try:
        result = run_scenario(SCENARIOS["spec_recurrent_verify"]())
    finally:
        ModelRunner.commit_verify = original
    assert "consumed again" in result.trace

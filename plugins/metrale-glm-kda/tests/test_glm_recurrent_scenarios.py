"""Recording-fake scenarios in the recurrent mode (seed 004) for a KDA-style model.

The real engine drives ``RecordingModel(recurrent_fed_rows=True)``, which corrupts a sequence's
state for good (every later answer GARBAGE) if a position is consumed twice, a continuing row is
fed from a wrong position, ``state_fresh`` is wrong, or a sequence continues in a slot holding
another sequence's state — the contract ``GlmKdaLM`` relies on.  Each scenario asserts that no
client stream ever shows GARBAGE, every stream follows its script, and the state was fed
contiguously (fresh exactly at position 0).
"""

from __future__ import annotations

import pytest

from metrale_core.testing import EOS, GARBAGE, Abort, Arrive, Scenario, run_scenario


def _p(first: int, n: int) -> list[int]:
    return [first + i for i in range(n)]


RECURRENT = dict(recurrent_fed_rows=True)
SCENARIOS = {
    s.name: s
    for s in [
        Scenario(
            "glm_preempt_resume",
            [
                Arrive(0, "a", _p(10, 7), _p(40, 9), max_tokens=9, ignore_eos=True),
                Arrive(0, "b", _p(20, 6), _p(50, 8), max_tokens=8, ignore_eos=True),
                Arrive(2, "c", _p(30, 5), [58, 59, 60]),
            ],
            engine=dict(num_kv_blocks=7, max_prefill_tokens=4),
            model=RECURRENT,
        ),
        Scenario(
            "glm_cancel_then_reuse_slot",
            [
                Arrive(0, "a", _p(10, 4), _p(40, 8)),
                Arrive(0, "b", _p(20, 4), _p(50, 5)),
                Abort(3, "a"),
                Arrive(4, "c", _p(30, 6), [56, 57, 58]),
            ],
            engine=dict(max_num_seqs=2),
            model=RECURRENT,
        ),
        Scenario(
            "glm_chunked_prefill",
            [
                Arrive(0, "a", _p(3, 23), [40, 41, 42]),
                Arrive(1, "b", _p(30, 2), _p(50, 6)),
            ],
            engine=dict(max_prefill_tokens=5),
            model=RECURRENT,
        ),
        Scenario(
            "glm_mixed_batches",
            [
                Arrive(0, "a", _p(10, 3), _p(40, 6)),
                Arrive(1, "b", _p(20, 9), [50, 51]),
                Arrive(2, "c", _p(30, 12), _p(52, 4)),
                Arrive(3, "d", [60, 61], [43, 44, 45]),
            ],
            engine=dict(max_prefill_tokens=6, max_num_seqs=3),
            model=RECURRENT,
        ),
    ]
}


def _script(scenario: Scenario, rid: str) -> list[int]:
    return next(list(e.output) + [EOS] for e in scenario.events if isinstance(e, Arrive) and e.request_id == rid)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_recurrent_scenario_never_shows_garbage(name):
    scenario = SCENARIOS[name]
    result = run_scenario(scenario)
    trace = result.trace
    assert result.model.errors == [], trace
    assert "consumed again" not in trace and "!!" not in trace, trace
    for rid, stream in result.streams.items():
        assert stream.finished and GARBAGE not in stream.token_ids, trace
        want = _script(scenario, rid)
        assert stream.token_ids == want[: len(stream.token_ids)], trace
        if stream.finish_reason != "abort":
            assert stream.token_ids, trace
    fed: dict[int, int] = {}
    for call in result.model.calls:
        for seq in call.seqs:
            assert seq.fresh == (seq.start == 0), trace
            assert seq.start in (0, fed.get(seq.key, 0)), f"s{seq.key} fed at {seq.start}\n{trace}"
            fed[seq.key] = seq.start + seq.num_rows


def test_preempt_scenario_really_preempts_and_chunks():
    result = run_scenario(SCENARIOS["glm_preempt_resume"])
    restarts = [s for c in result.model.calls for s in c.seqs if s.fresh]
    assert len(restarts) > 3, "no sequence was preempted and replayed: the scenario lost its point"
    assert all(s.num_rows <= 4 for c in result.model.calls for s in c.seqs)
    assert result.streams["a"].token_ids == _p(40, 9) and result.streams["b"].token_ids == _p(50, 8)


def test_cancelled_sequence_frees_its_slot_for_a_fresh_one():
    result = run_scenario(SCENARIOS["glm_cancel_then_reuse_slot"])
    assert result.streams["a"].finish_reason == "abort"
    c_calls = [s for call in result.model.calls for s in call.seqs if s.key == 30]
    assert c_calls and c_calls[0].fresh and c_calls[0].start == 0
    assert result.streams["c"].token_ids == [56, 57, 58, EOS]

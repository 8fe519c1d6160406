"""Preemption by recompute under KV pressure, and sequences that can never fit."""

from __future__ import annotations

import pytest

from metrale_core.sampling import SamplingParams


def params(i: int, sampling: str) -> SamplingParams:
    if sampling == "greedy":
        return SamplingParams(temperature=0.0, max_tokens=12)
    return SamplingParams(temperature=1.0, seed=77 + i, max_tokens=12)


PROMPTS = [[(3 * i + j) % 50 for j in range(5 + i % 4)] for i in range(8)]


def run_counting(engine):
    """Run to the end; returns (deltas by id, sampled rows by id, preempted ids)."""
    outs, sampled, preempted = {}, {}, []
    for _ in range(5000):
        if not engine.has_unfinished():
            return outs, sampled, preempted
        deltas = engine.step()
        plan = engine.scheduler.last_plan
        preempted += plan.preempted
        for c in plan.chunks:
            if c.sample:
                sampled[c.seq.request_id] = sampled.get(c.seq.request_id, 0) + 1
        for d in deltas:
            outs.setdefault(d.request_id, []).append(d)
    raise AssertionError("did not finish")


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@pytest.mark.parametrize("recurrent", [False, True])
def test_small_pool_preempts_and_changes_nothing(make_engine, run, tokens, toy_model, sampling, recurrent):
    big = make_engine(toy_model(recurrent=recurrent), num_kv_blocks=256)
    for i, p in enumerate(PROMPTS):
        big.add_request(f"r{i}", p, params(i, sampling))
    expected = {k: tokens(v) for k, v in run(big).items()}
    assert not big.scheduler.last_plan.preempted

    # Each request ends with up to 20 tokens = 5 blocks of 4; all 8 at once would need 40.
    small = make_engine(toy_model(recurrent=recurrent), num_kv_blocks=12, max_prefill_tokens=16)
    for i, p in enumerate(PROMPTS):
        small.add_request(f"r{i}", p, params(i, sampling))
    outs, sampled, preempted = run_counting(small)
    assert preempted, "the pool was meant to be too small"
    for i in range(8):
        got = tokens(outs[f"r{i}"])
        assert got == expected[f"r{i}"], f"request {i}"
        assert sampled[f"r{i}"] == len(got)  # replayed positions never sampled again
        assert outs[f"r{i}"][-1].finish_reason == "length"
    bm = small.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert small.stats().num_free_state_slots == (16 if recurrent else 0)


def test_preempted_sequence_goes_to_the_queue_front(make_engine):
    engine = make_engine(num_kv_blocks=4, max_prefill_tokens=64)
    engine.add_request("old", [1, 2, 3, 4, 5, 6, 7], SamplingParams(temperature=0.0, max_tokens=20))
    engine.add_request("new", [9, 8, 7, 6, 5], SamplingParams(temperature=0.0, max_tokens=20))
    engine.add_request("queued", [4, 4], SamplingParams(temperature=0.0, max_tokens=2))
    while not engine.scheduler.last_plan.preempted:
        engine.step()
    assert engine.scheduler.last_plan.preempted == ("new",)
    new = next(s for s in engine.scheduler.waiting if s.request_id == "new")
    assert engine.scheduler.waiting[0] is new
    assert new.block_ids == [] and new.num_computed_tokens == 0
    assert new.num_prefill_tokens == 5 + len(new.output_ids) and new.output_ids


def test_sequence_larger_than_the_pool_errors_alone(make_engine, run, tokens):
    engine = make_engine(num_kv_blocks=8, max_prefill_tokens=8)  # 32 tokens in all
    engine.add_request("huge_prompt", list(range(1, 40)), SamplingParams(temperature=0.0))
    engine.add_request("grows", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=100))
    engine.add_request("fine", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4))
    outs = run(engine)
    huge = outs["huge_prompt"][-1]
    assert huge.finish_reason == "error" and "needs 10 KV blocks" in huge.error
    assert "whole pool holds 8 blocks" in huge.error and huge.num_output_tokens == 0
    grows = outs["grows"]
    assert grows[-1].finish_reason == "error" and "KV blocks" in grows[-1].error
    assert 20 < len(tokens(grows)) < 32
    assert outs["fine"][-1].finish_reason == "length" and len(tokens(outs["fine"])) == 4
    bm = engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks

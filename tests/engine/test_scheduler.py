"""Scheduler: chunked prefill, row order, continuous batching, max_num_seqs, state slots."""

from __future__ import annotations

import pytest

from metrale_core.engine import SchedulerOutput
from metrale_core.sampling import PositionKind, SamplingParams


def plan_summary(plan: SchedulerOutput):
    return [(c.seq.request_id, c.start, c.num_tokens, c.sample) for c in plan.chunks]


def test_chunked_prefill_splits_by_budget(make_engine, run, tokens):
    engine = make_engine(max_prefill_tokens=8)
    engine.add_request("a", list(range(1, 21)), SamplingParams(temperature=0.0, max_tokens=3))
    plans = []
    while engine.has_unfinished():
        engine.step()
        plans.append(plan_summary(engine.scheduler.last_plan))
    assert plans[:3] == [[("a", 0, 8, False)], [("a", 8, 8, False)], [("a", 16, 4, True)]]
    assert plans[3:] == [[("a", 20, 1, True)], [("a", 21, 1, True)]]
    whole = make_engine(max_prefill_tokens=64)
    whole.add_request("a", list(range(1, 21)), SamplingParams(temperature=0.0, max_tokens=3))
    assert tokens(run(whole)["a"]) == engine_tokens(make_engine, run, tokens, 8)


def engine_tokens(make_engine, run, tokens, budget):
    e = make_engine(max_prefill_tokens=budget)
    e.add_request("a", list(range(1, 21)), SamplingParams(temperature=0.0, max_tokens=3))
    return tokens(run(e)["a"])


def test_budget_is_shared_decodes_first_then_prefills_in_admission_order(make_engine):
    engine = make_engine(max_prefill_tokens=6)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    engine.add_request("a", [1, 2, 3], params)
    engine.step()  # a prefills 3
    engine.add_request("b", list(range(1, 11)), params)
    engine.add_request("c", [5, 6], params)
    engine.step()
    assert plan_summary(engine.scheduler.last_plan) == [("a", 3, 1, True), ("b", 0, 6, False)]
    engine.step()
    assert plan_summary(engine.scheduler.last_plan) == [("a", 4, 1, True), ("b", 6, 4, True), ("c", 0, 2, True)]
    kinds = [c.kind for c in engine.scheduler.last_plan.chunks]
    assert kinds == [PositionKind.FINAL_DECODE, PositionKind.PREFILL_LAST, PositionKind.PREFILL_LAST]
    engine.step()
    # rows: decodes in running order (a, b, c); the forward batch follows the plan exactly
    assert plan_summary(engine.scheduler.last_plan) == [("a", 5, 1, True), ("b", 10, 1, True), ("c", 2, 1, True)]


def test_forward_batch_layout(make_engine, toy_model):
    model = toy_model()
    engine = make_engine(model, max_prefill_tokens=5)
    engine.add_request("a", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4))
    engine.step()
    engine.add_request("b", list(range(1, 9)), SamplingParams(temperature=0.0, max_tokens=4))
    engine.step()
    batch = model.calls[-1]
    a, b = engine.scheduler.seqs["a"], engine.scheduler.seqs["b"]
    assert batch.query_lens_host == (1, 5) and batch.context_lens_host == (4, 5)
    assert batch.positions.tolist() == [3, 0, 1, 2, 3, 4]
    assert batch.input_ids.tolist() == [a.output_ids[0], 1, 2, 3, 4, 5]
    assert batch.logits_rows.tolist() == [0]  # b's chunk does not finish its prompt
    bs = batch.block_size
    expected_slots = [a.block_ids[0] * bs + 3] + [b.block_ids[p // bs] * bs + p % bs for p in range(5)]
    assert batch.slot_mapping.tolist() == expected_slots
    assert batch.block_tables[0, :1].tolist() == a.block_ids[:1]
    assert batch.state_slots.tolist() == [-1, -1]
    assert batch.state_fresh.tolist() == [False, True]


def test_max_num_seqs_limits_running(make_engine, run, tokens):
    engine = make_engine(max_num_seqs=2)
    for i in range(4):
        engine.add_request(f"r{i}", [i + 1, 2], SamplingParams(temperature=0.0, max_tokens=3))
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["r0", "r1"]
    assert [s.request_id for s in engine.scheduler.waiting] == ["r2", "r3"]
    outs = run(engine)
    assert all(outs[f"r{i}"][-1].finish_reason == "length" for i in range(4))


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_continuous_batching_matches_running_alone(make_engine, run, tokens, sampling):
    def params(i):
        if sampling == "greedy":
            return SamplingParams(temperature=0.0, max_tokens=4 + i % 5)
        return SamplingParams(temperature=0.9, top_p=0.95, seed=1000 + i, max_tokens=4 + i % 5)

    prompts = [[(i * 7 + j * 3) % 50 for j in range(2 + (i * 5) % 13)] for i in range(16)]
    alone = []
    for i, prompt in enumerate(prompts):
        engine = make_engine()
        engine.add_request("x", prompt, params(i))
        alone.append(tokens(run(engine)["x"]))

    engine = make_engine(max_prefill_tokens=10, max_num_seqs=6)
    outs: dict[str, list] = {}
    step = 0
    pending = list(range(16))
    max_batch = 0
    while pending or engine.has_unfinished():
        # two new requests arrive every step while others are mid-flight
        for i in pending[:2]:
            engine.add_request(f"r{i}", prompts[i], params(i))
        pending = pending[2:]
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
        max_batch = max(max_batch, len(engine.scheduler.last_plan.chunks))
        step += 1
        assert step < 500
    assert max_batch > 2  # requests really shared steps
    for i in range(16):
        assert tokens(outs[f"r{i}"]) == alone[i], f"request {i}"
    assert engine.stats().num_free_blocks == engine.stats().num_blocks


def test_recurrent_model_gets_state_slots_and_no_prefix_cache(make_engine, run, tokens, toy_model):
    model = toy_model(recurrent=True)
    engine = make_engine(model, max_num_seqs=2, max_prefill_tokens=4, enable_prefix_caching=True)
    assert engine.scheduler.block_manager.enable_prefix_caching is False
    assert engine.stats().num_free_state_slots == 2
    prompt = list(range(1, 10))
    engine.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=3))
    engine.add_request("b", prompt, SamplingParams(temperature=0.0, max_tokens=3))
    engine.add_request("c", prompt, SamplingParams(temperature=0.0, max_tokens=3))
    engine.step()
    slots = {s.request_id: s.state_slot for s in engine.scheduler.running}
    assert slots == {"a": 0} and model.calls[-1].state_fresh.tolist() == [True]
    outs = run(engine)
    assert tokens(outs["a"]) == tokens(outs["b"]) == tokens(outs["c"])
    assert engine.stats().num_free_state_slots == 2
    # later chunks of a sequence continue its state: never fresh after position 0
    for batch in model.calls:
        starts = [c - q for c, q in zip(batch.context_lens_host, batch.query_lens_host)]
        assert batch.state_fresh.tolist() == [s == 0 for s in starts]

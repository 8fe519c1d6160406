"""Prefix caching through the engine: hits share blocks and change nothing in the outputs."""

from __future__ import annotations

from metrale_core.sampling import SamplingParams

PREFIX = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]  # 2 full blocks of 4 + 2 tokens


def solo(make_engine, run, tokens, prompt, **kw):
    engine = make_engine(enable_prefix_caching=False)
    engine.add_request("x", prompt, SamplingParams(temperature=0.0, max_tokens=5, **kw))
    return tokens(run(engine)["x"])


def test_hit_shares_blocks_with_a_running_sequence(make_engine, run, tokens):
    engine = make_engine()
    engine.add_request("a", PREFIX + [1], SamplingParams(temperature=0.0, max_tokens=5))
    early = engine.step()  # a's prompt is computed; its 2 full blocks are cached
    engine.add_request("b", PREFIX + [2, 3], SamplingParams(temperature=0.0, max_tokens=5))
    early += engine.step()
    a, b = engine.scheduler.seqs["a"], engine.scheduler.seqs["b"]
    bm = engine.scheduler.block_manager
    assert b.num_cached_tokens == 8 and b.block_ids[:2] == a.block_ids[:2]
    assert [bm.ref_count(x) for x in b.block_ids[:2]] == [2, 2]
    chunk_b = next(c for c in engine.scheduler.last_plan.chunks if c.seq is b)
    assert (chunk_b.start, chunk_b.num_tokens) == (8, 4)  # only the uncached tail is fed
    outs = run(engine)
    for d in reversed(early):
        outs[d.request_id].insert(0, d)
    assert tokens(outs["a"]) == solo(make_engine, run, tokens, PREFIX + [1])
    assert tokens(outs["b"]) == solo(make_engine, run, tokens, PREFIX + [2, 3])
    assert bm.num_free_blocks == bm.num_blocks


def test_full_prompt_hit_recomputes_the_last_block(make_engine, run, tokens, toy_model):
    model = toy_model()
    engine = make_engine(model)
    prompt = PREFIX[:8]  # exactly 2 blocks
    engine.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=5))
    first = tokens(run(engine)["a"])
    engine.add_request("b", prompt, SamplingParams(temperature=0.0, max_tokens=5))
    early = engine.step()
    batch = model.calls[-1]
    assert batch.query_lens_host == (4,) and batch.positions.tolist() == [4, 5, 6, 7]
    assert batch.logits_rows.tolist() == [3]
    assert tokens(early + run(engine)["b"]) == first == solo(make_engine, run, tokens, prompt)


def test_generated_tokens_are_cached_too(make_engine, run, tokens):
    engine = make_engine()
    engine.add_request("a", PREFIX, SamplingParams(temperature=0.0, max_tokens=7))
    out_a = tokens(run(engine)["a"])
    follow = PREFIX + out_a[:6] + [5]  # a chat turn continuing a's answer
    engine.add_request("b", follow, SamplingParams(temperature=0.0, max_tokens=5))
    early = engine.step()
    assert engine.scheduler.seqs["b"].num_cached_tokens == 16
    assert tokens(early + run(engine)["b"]) == solo(make_engine, run, tokens, follow)


def test_eviction_under_pressure_keeps_outputs_exact(make_engine, run, tokens):
    engine = make_engine(num_kv_blocks=10, max_num_seqs=2)
    prompts = [PREFIX[: 4 + i % 6] + [i, i + 1, i + 2] for i in range(12)]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=5))
    outs = run(engine)
    for i, p in enumerate(prompts):
        assert tokens(outs[f"r{i}"]) == solo(make_engine, run, tokens, p), i
    bm = engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_cached_blocks() <= bm.num_blocks

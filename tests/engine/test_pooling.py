"""Prefill-only pooling requests (``metrale_core.engine.pooling``) through the real scheduler.

The toy model's "hidden state" of a row is its exact-integer (token, position) embedding, so the
expected vector is known exactly: the L2-normalised mean (or last row) over the prompt.  Checked:
chunked prefill, batching with a generating request in the same forwards, a repeated prompt whose
blocks sit in the prefix cache (no row may be skipped), preemption (the pool restarts), and that
nothing is sampled or kept afterwards."""

from __future__ import annotations

import torch
from conftest import ToyLM

from metrale_core.engine.pooling import Pooling, can_pool, default_pooling
from metrale_core.sampling.params import SamplingParams


class HiddenToy(ToyLM):
    def forward_with_hidden(self, batch, kv, state=None):
        logits = self.forward(batch, kv, state)
        ids, pos = batch.input_ids.tolist(), batch.positions.tolist()
        hidden = torch.tensor([self.embed(t, p) for t, p in zip(ids, pos)])
        return logits, hidden


def _want(prompt, mode="mean"):
    rows = torch.tensor([ToyLM.embed(t, p) for p, t in enumerate(prompt)])
    v = rows.mean(0) if mode == "mean" else rows[-1]
    return torch.nn.functional.normalize(v, dim=0)


PARAMS = SamplingParams(temperature=0.0, max_tokens=1)


def test_pooled_vectors_with_chunking_batching_and_prefix_cache(make_engine, run, tokens):
    model = HiddenToy()
    engine = make_engine(model, max_prefill_tokens=5, enable_prefix_caching=True)
    prompt = [3, 9, 4, 7, 1, 8, 2, 6, 5, 11, 12, 13, 14]
    gen = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine.add_request("gen", [1, 2, 3, 4, 5, 6, 7, 8, 9], gen)
    engine.add_request("emb", prompt, PARAMS, extras={"pooling": Pooling("mean")})
    engine.add_request("emb-last", prompt, PARAMS, extras={"pooling": Pooling("last")})
    outs = run(engine)
    for rid, mode in (("emb", "mean"), ("emb-last", "last")):
        (final,) = outs[rid]
        assert final.finished and final.finish_reason == "stop" and not final.new_token_ids
        assert final.num_prompt_tokens == len(prompt) and final.num_output_tokens == 0
        assert torch.allclose(final.embedding, _want(prompt, mode), atol=1e-6)
    mixed = [b for b in model.calls if b.num_seqs > 1]
    assert mixed, "pooling and generation never shared a forward"
    # generation is unaffected by the pooling requests beside it
    alone = make_engine(HiddenToy(), max_prefill_tokens=5)
    alone.add_request("gen", [1, 2, 3, 4, 5, 6, 7, 8, 9], gen)
    assert tokens(outs["gen"]) == tokens(run(alone)["gen"])
    # again, now that the prompt's full blocks are in the prefix cache: every row still runs
    engine.add_request("again", prompt, PARAMS, extras={"pooling": Pooling("mean")})
    (again,) = run(engine)["again"]
    assert torch.allclose(again.embedding, _want(prompt), atol=1e-6)
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_free_blocks == stats.num_blocks


def test_preempted_pooling_request_restarts_its_pool(make_engine):
    # 6 blocks of 4 tokens: two 12-token prompts cannot both hold their blocks plus room to grow
    engine = make_engine(HiddenToy(), num_kv_blocks=6, max_prefill_tokens=4)
    gen = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    engine.add_request("gen", list(range(1, 11)), gen)
    prompt = [5, 4, 3, 2, 1, 9, 8, 7, 6, 10, 11, 12]
    engine.add_request("emb", prompt, PARAMS, extras={"pooling": Pooling("mean")})
    outs, preempted = {}, set()
    while engine.has_unfinished():
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
        preempted |= set(engine.scheduler.last_plan.preempted)
    assert "emb" in preempted
    assert torch.allclose(outs["emb"][-1].embedding, _want(prompt), atol=1e-6)


def test_fold_restarts_at_position_zero_and_checks_its_mode():
    pool = Pooling("mean")
    pool.fold(torch.ones(3, 2), 0)
    pool.fold(torch.full((2, 2), 9.0), 0)  # replay from 0 after a preemption
    assert pool.count == 2 and torch.allclose(pool.vector(), torch.tensor([1.0, 1.0]) / 2**0.5)
    try:
        Pooling("max")
    except ValueError as exc:
        assert "mean, last" in str(exc)
    else:
        raise AssertionError("Pooling('max') accepted")
    assert can_pool(HiddenToy()) and not can_pool(ToyLM())
    model = HiddenToy()
    assert default_pooling(model) == "mean"
    model.default_pooling = "last"
    assert default_pooling(model) == "last"
